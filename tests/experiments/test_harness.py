"""lm-evaluation-harness on Table 1's rows (tadm.harness): the local arithmetic task through
lm_eval on the post-train workspace (a tiny DiffusionGemma with its fusions) scores exactly as
Table 1's scorer scores the same completions, in Table 1's order; a batch gives every document
the tokens it gets alone; speed is counted as Table 1 counts it; the refusals are one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tadm.errors import ConfigError
from tests.experiments.conftest import env, posttrain_raw

lm_eval = pytest.importorskip("lm_eval")  # pinned in requirements/lock.txt

N = 6  # documents
LENGTH = 12  # max_gen_toks: two canvases of the micro profile's 8 positions


@pytest.fixture(scope="module")
def workspace(posttrain_workspace):
    import yaml

    (posttrain_workspace / "params.yaml").write_text(yaml.safe_dump(posttrain_raw(), sort_keys=False))
    return posttrain_workspace


def _evaluate(root, monkeypatch, batch_size: int, **model_args):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import tadm.harness.model  # noqa: F401  (registers "tadm")
    from tadm.harness import TASKS_DIR

    monkeypatch.chdir(root)  # the task reads data/sft/validation.jsonl from the working directory
    monkeypatch.setenv("HF_DATASETS_CACHE", str(root / ".hf-datasets"))
    out = simple_evaluate(model="tadm", model_args={"params": "params.yaml", **model_args}, tasks=["tadm_arithmetic"],
                          limit=N, batch_size=batch_size, device="cpu", log_samples=True,
                          gen_kwargs={"max_gen_toks": LENGTH}, task_manager=TaskManager(include_path=str(TASKS_DIR)))
    samples = sorted(out["samples"]["tadm_arithmetic"], key=lambda s: s["doc_id"])
    return out, samples


@pytest.mark.parametrize("row", [{"row": "tadm", "K": 2}, {"row": "base"}, {"row": "naive", "K": 2}])
def test_the_harness_scores_as_table1(workspace, monkeypatch, row):
    from tadm.data import arithmetic
    from tadm.experiments import table1

    out, samples = _evaluate(workspace, monkeypatch, 3, **row)
    task = table1.arithmetic_task(workspace / "data" / "sft", N, LENGTH)
    assert [s["doc"]["prompt"] for s in samples] == task.prompts  # Table 1's problems, in its order
    texts = [s["resps"][0][0] for s in samples]
    table1_accuracy = sum(task.score(i, t) for i, t in enumerate(texts)) / N
    assert out["results"]["tadm_arithmetic"]["exact_match,answer"] == table1_accuracy
    assert [bool(s["exact_match"]) for s in samples] == [arithmetic.is_correct(t, s["doc"]["answer"])
                                                         for t, s in zip(texts, samples)]
    # speed as Table 1: two canvases of 8 generated positions per prompt, the full batches' median time
    info = out["config"]
    assert set(info["generated_tokens_per_s"]) == {"16"} and info["generated_tokens_per_s"]["16"] > 0


@pytest.mark.parametrize("row", [{"row": "tadm", "K": 2}, {"row": "base"}, {"row": "feature", "K": 2}])
def test_a_padded_batch_decodes_each_document_as_it_decodes_alone(workspace, monkeypatch, row):
    """Per-document random streams + left padding: batches of 3 and of 1 give the same tokens.
    In float64, so that a padded row's rounding (attention over a longer, masked prompt) cannot
    flip a near-tie of the random tiny model's router or entropy ranking; the per-row streams
    are what is tested (in float32 a trained model's completions agree too: docs/harness.md)."""
    from tadm.harness.model import TadmLM

    monkeypatch.chdir(workspace)
    lm = TadmLM(params="params.yaml", device="cpu", batch_size=3, **row)
    lm.method.base.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
    lm.method.base.double()
    if lm.method.model is not None:
        lm.method.model.double()
    prompts = ["What is 2 + 3?", "Start with 4. Add 1. What is the result? Show the steps.", "7 + 1 = ?",
               "Calculate 9 + 9.", "A long prompt: start with 1, add 2, add 3, add 4. What is the result?"]
    requests = [_Request(q, {"until": [], "max_gen_toks": LENGTH}, i) for i, q in enumerate(prompts)]
    batched = lm.generate_until(requests, disable_tqdm=True)
    lm.batch_size = 1
    assert lm.generate_until(requests, disable_tqdm=True) == batched
    lm.seed += 1  # another seed: other completions (the streams are the seed's)
    assert lm.generate_until(requests, disable_tqdm=True) != batched


def test_speed_counts_generated_canvas_positions_over_the_full_batches_median(workspace, monkeypatch):
    from tadm.harness.model import TadmLM

    monkeypatch.chdir(workspace)
    lm = TadmLM(row="tadm", K=2, params="params.yaml", batch_size=2, device="cpu")
    requests = [_Request(f"What is {i} + 1?", {"until": ["\n\n"], "max_gen_toks": LENGTH}, i) for i in range(5)]
    texts = lm.generate_until(requests, disable_tqdm=True)
    assert len(texts) == 5 and all("\n\n" not in t for t in texts)
    [(per_prompt, timed)] = lm.timed.items()
    assert per_prompt == 16 and [n for n, _, _ in timed] == [2, 2, 1]
    full = sorted(s for n, s, _ in timed if n == 2)
    assert lm.speed()["16"]["tokens_per_s"] == pytest.approx(2 * 16 / (sum(full) / 2))  # median of two


class _Request:
    """What the model reads of an lm_eval Instance."""

    def __init__(self, context: str, gen: dict, doc_id: int):
        self.args, self.metadata, self.idx = (context, gen), ("t", doc_id, 1), 0


def test_row_streams_draw_each_row_from_its_own_generator():
    from tadm.harness.model import row_streams

    gens = [torch.Generator().manual_seed(s) for s in (3, 4)]
    probs = torch.softmax(torch.randn(6, 5, generator=torch.Generator().manual_seed(0)), -1)
    with row_streams(gens):
        noise = torch.randint(low=0, high=50, size=(2, 7))
        draws = torch.multinomial(probs, num_samples=1)
        other = torch.randint(0, 50, (3,))  # another shape: the global stream, untouched
    assert torch.randint is not None and other.shape == (3,)
    alone = [torch.Generator().manual_seed(s) for s in (3, 4)]
    for b, g in enumerate(alone):
        assert torch.equal(noise[b], torch.randint(0, 50, (1, 7), generator=g)[0])
        assert torch.equal(draws[3 * b: 3 * b + 3], torch.multinomial(probs[3 * b: 3 * b + 3], 1, generator=g))


def test_refusals_are_one_line(workspace, monkeypatch):
    from tadm.harness import harness_argv
    from tadm.harness.model import HarnessRefused, TadmLM, request_seed

    monkeypatch.chdir(workspace)
    for bad, name in [({"row": "nope"}, "model_args.row"), ({"row": "tadm"}, "model_args.K"),
                      ({"row": "feature", "K": 1}, "model_args.K"), ({"row": "base", "K": 3}, "model_args.K"),
                      ({"row": "base", "batch_size": "auto"}, "batch_size"), ({"row": "base", "colour": 1}, "model_args")]:
        with pytest.raises(ConfigError) as e:
            TadmLM(params="params.yaml", device="cpu", **bad)
        assert name in str(e.value) and "\n" not in str(e.value)
    lm = TadmLM(row="base", params="params.yaml", device="cpu")
    for call in (lm.loglikelihood, lm.loglikelihood_rolling):
        with pytest.raises(HarnessRefused):
            call([])
    with pytest.raises(ConfigError, match="confirm_run_unsafe_code"):
        harness_argv(["--tasks", "humaneval", "--confirm_run_unsafe_code"])
    assert harness_argv(["--include_path", "x"]) == ["--include_path", "x"]
    assert request_seed(0, "t", 1) == request_seed(0, "t", 1) != request_seed(0, "t", 2) != request_seed(0, "t", 2, 1)
    # a document asked twice (a task's repeats) is drawn twice, from two streams
    twice = [_Request("What is 1 + 1?", {"until": [], "max_gen_toks": LENGTH}, 0) for _ in range(2)]
    lm.batch_size = 2
    first, second = lm.generate_until(twice, disable_tqdm=True)
    assert first != second


def test_the_launcher_runs_lm_eval_with_the_tadm_model(workspace):
    """`python -m tadm.harness` is lm_eval's command line with the model registered and the
    task path set: one document end to end, and a refusal as one line with exit 2."""
    e = {**env(), "HF_DATASETS_CACHE": str(workspace / ".hf-datasets"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "tadm.harness", "--model", "tadm", "--model_args", "row=tadm,K=2,params=params.yaml",
           "--tasks", "tadm_arithmetic", "--limit", "1", "--device", "cpu", "--gen_kwargs", f"max_gen_toks={LENGTH}"]
    done = subprocess.run(cmd, cwd=workspace, env=e, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tadm_arithmetic" in done.stdout and "exact_match" in done.stdout
    refused = subprocess.run(cmd[:3] + ["--tasks", "humaneval", "--confirm_run_unsafe_code"], cwd=workspace, env=e,
                             capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0, refused.stderr


@pytest.mark.parametrize("extra, words", [
    (["--confirm"], "unrecognized arguments: --confirm"),  # no prefix matching: never the unsafe flag
    (["--confirm_run_unsafe_cod"], "unrecognized arguments: --confirm_run_unsafe_cod"),
    (["--apply_chat_template"], "--apply_chat_template: refused"),
    (["--limit", "-5"], "--limit: must be > 0"), (["--limit", "0"], "--limit: must be > 0"),
    (["--num_fewshot", "-1"], "--num_fewshot: must be >= 0"),
    (["--output_path", "/proc/self/x/out"], "--output_path: /proc/self/x/out cannot be written"),
    (["--model_args", "row=tadm,K=2,K=3"], "K given twice"),
    (["--model_args", "row=tadm,K=2.5"], "model_args.K: must be a whole number, got 2.5"),
    (["--model_args", "row=tadm,K=abc"], "model_args.K: must be a whole number, got 'abc'"),
    (["--model_args", "row=tadm,K=nan"], "model_args.K: must be a whole number, got nan"),
    (["--model_args", "row=tadm,K=99,params=params.yaml"], "model_args.K: must be <= posttrain.sample_steps"),
    (["--model_args", "row=tadm,K=2,seed=-1,params=params.yaml"], "model_args.seed: must be in [0,"),
    (["--gen_kwargs", "max_gen_toks=1000000000"], "max_gen_toks: must be in [1, 65536]"),
    (["--tasks", "bogus"], "Tasks not found: bogus"),
])
def test_every_bad_harness_argument_is_one_line_before_the_evaluation(workspace, extra, words):
    """Each case of the hardening round: refused with one line naming the argument, a non-zero
    exit, no traceback, and nothing evaluated (the one line comes before any document runs)."""
    e = {**env(), "HF_DATASETS_CACHE": str(workspace / ".hf-datasets"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "tadm.harness", "--model", "tadm", "--model_args", "row=tadm,K=2,params=params.yaml",
           "--tasks", "tadm_arithmetic", "--limit", "1", "--device", "cpu", *extra]
    done = subprocess.run(cmd, cwd=workspace, env=e, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stderr.strip().splitlines() if "error" in line]
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(lines) == 1 and words in lines[0], done.stderr[-2000:]
    assert "exact_match" not in done.stdout


@pytest.fixture(scope="module")
def llada_params(workspace, tmp_path_factory):
    """A params file whose asrd.llada_model is a tiny local LLaDA release (weights, config and
    tokenizer in one directory), 8 generated positions in two blocks of 4, 8 steps."""
    import yaml

    from tests.models.test_llada import tiny_model, tiny_tokenizer, write_release

    root = tmp_path_factory.mktemp("llada")
    directory = write_release(root, tiny_model(seed=4))
    tiny_tokenizer(directory)
    raw = posttrain_raw(**{"asrd.llada_model": str(directory), "asrd.llada_gen_tokens": 8, "asrd.llada_block_size": 4,
                           "asrd.llada_steps": 8, "asrd.llada_cache_refresh": [2]})
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("variant", ["low-confidence-llada", "low-confidence-threshold", "fast-dllm-prefix-cache-per-block",
                                     "dllm-cache-k-2"])
def test_llada_rows_decode_a_padded_batch_as_each_prompt_alone(llada_params, variant):
    """The LLaDA group's greedy rows (its baseline, the threshold, a Fast-dLLM and a dLLM-Cache
    row) through the harness model: batches of 3 and of 1 give the same completions, 8
    generated positions counted per prompt."""
    from tadm.harness.model import TadmLM

    lm = TadmLM(row="llada", variant=variant, params=str(llada_params), device="cpu", batch_size=3)
    prompts = ["the cat sat on the mat and the dog ran fast", "one two", "dog ran slow on the mat", "the dog"]
    requests = [_Request(q, {"until": [], "max_gen_toks": 999}, i) for i, q in enumerate(prompts)]
    batched = lm.generate_until(requests, disable_tqdm=True)
    assert set(lm.timed) == {8}  # asrd.llada_gen_tokens, whatever the task asks
    lm.batch_size = 1
    assert lm.generate_until(requests, disable_tqdm=True) == batched
    assert lm.get_model_info()["tadm_family"] == "llada"


@pytest.mark.parametrize("variant", ["d2cache-as-released", "dkv-cache-decode-r-2"])
def test_the_cited_caches_run_as_llada_rows(llada_params, variant):
    """d²Cache (its certainty-prior decoder over one block, the release's cache settings) and
    dKV-Cache-Decode through the harness model: every prompt gets its 8 generated positions, on
    the row's own cache backend."""
    from tadm.harness.model import TadmLM

    lm = TadmLM(row="llada", variant=variant, params=str(llada_params), device="cpu", batch_size=3)
    prompts = ["the cat sat on the mat and the dog ran fast", "one two", "dog ran slow on the mat", "the dog"]
    out = lm.generate_until([_Request(q, {"until": [], "max_gen_toks": 999}, i) for i, q in enumerate(prompts)],
                            disable_tqdm=True)
    assert len(out) == 4 and all(isinstance(t, str) for t in out) and set(lm.timed) == {8}
    assert type(lm.engine.backend).__name__ == ("LladaD2CacheBackend" if variant.startswith("d2") else "LladaDkvBackend")
    if variant.startswith("d2"):
        assert lm.engine.variant.settings.certainty_sigma == 10.0 and lm.engine.variant.settings.block_size is None


def test_llada_row_refusals(llada_params, workspace, monkeypatch):
    from tadm.harness.model import TadmLM, slug

    assert slug("Fast-dLLM prefix cache K=4") == "fast-dllm-prefix-cache-k-4"
    assert slug("d²Cache (as released)") == "d2cache-as-released"
    for bad, name in [({"variant": "nope"}, "model_args.variant"), ({"variant": "asrd", "K": 2}, "model_args.K")]:
        with pytest.raises(ConfigError) as e:
            TadmLM(row="llada", params=str(llada_params), device="cpu", **bad)
        assert name in str(e.value) and "\n" not in str(e.value)
    monkeypatch.chdir(workspace)  # the default profile's params name no LLaDA
    with pytest.raises(ConfigError, match="model_args.llada"):
        TadmLM(row="llada", variant="asrd", params="params.yaml", device="cpu")
    with pytest.raises(ConfigError, match="model_args.variant"):
        TadmLM(row="base", variant="asrd", params="params.yaml", device="cpu")


# ---------------------------------------------------------------------------- the launcher's runs

def _launch(workspace, tmp_path, *extra, model_args="row=tadm,K=2,params=params.yaml", model="tadm", **env_extra):
    e = {**env(), "HF_DATASETS_CACHE": str(workspace / ".hf-datasets"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
         **env_extra}
    cmd = [sys.executable, "-m", "tadm.harness", "--model", model, *(["--model_args", model_args] if model_args else []),
           "--limit", "1", "--device", "cpu", *extra]
    return subprocess.run(cmd, cwd=workspace, env=e, capture_output=True, text=True, timeout=600)


def _one_error_line(done, words: str) -> None:
    lines = [line for line in done.stderr.strip().splitlines() if "error" in line]
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(lines) == 1 and words in lines[0], done.stderr[-2000:]
    assert "Initializing" not in done.stderr  # refused before the model loads


def test_launcher_keeps_lm_evals_own_models(workspace, tmp_path):
    """lm-eval's own models stay available next to ours (`--model dummy`)."""
    done = _launch(workspace, tmp_path, "--tasks", "tadm_arithmetic", model="dummy", model_args=None)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tadm_arithmetic" in done.stdout and "exact_match" in done.stdout


def test_seed_flag_reaches_the_model_or_is_refused(workspace, monkeypatch):
    """An explicit --seed gives the model its torch slot as its seed; a different seed= in
    --model_args as well is refused in one line; without --seed the model keeps its own."""
    import argparse

    from tadm.harness import prepare_run, seed_given
    from tadm.harness.model import TadmLM

    monkeypatch.chdir(workspace)
    args = argparse.Namespace(model="tadm", model_args={"row": "tadm", "K": 2, "params": "params.yaml"},
                              seed=[5, 6, 7, 8], gen_kwargs=None)
    assert seed_given(["--seed", "5,6,7,8"]) and seed_given(["--seed=3"]) and not seed_given(["--model", "tadm"])
    prepare_run(args, explicit_seed=True)
    assert args.model_args["seed"] == 7 and args.model_args["pretrained"] == "models/dg_tadm"
    lm = TadmLM(device="cpu", **args.model_args)
    assert lm.seed == 7 and lm.get_model_info()["tadm_seed"] == 7
    quiet = argparse.Namespace(model="tadm", model_args={"row": "tadm", "K": 2}, seed=[0, 1234, 1234, 1234],
                               gen_kwargs=None)
    prepare_run(quiet, explicit_seed=False)  # lm-eval's default seeds: the model's own seed stays
    assert "seed" not in quiet.model_args
    clash = argparse.Namespace(model="tadm", model_args={"row": "tadm", "K": 2, "seed": 3}, seed=[5] * 4, gen_kwargs=None)
    with pytest.raises(ConfigError, match="--seed") as e:
        prepare_run(clash, explicit_seed=True)
    assert "\n" not in str(e.value)
    other = argparse.Namespace(model="dummy", model_args={}, seed=[5] * 4, gen_kwargs={"temperature": 0})
    prepare_run(other, explicit_seed=True)  # lm-eval's own models: untouched
    assert other.model_args == {}


def test_temperature_gen_kwarg_refused_in_one_line(workspace, tmp_path):
    done = _launch(workspace, tmp_path, "--tasks", "tadm_arithmetic", "--gen_kwargs", "temperature=0")
    _one_error_line(done, "--gen_kwargs: temperature refused")
    done = _launch(workspace, tmp_path, "--tasks", "tadm_arithmetic", "--seed", "5", "--model_args", "seed=3")
    _one_error_line(done, "--seed: the torch seed 5 and --model_args seed=3 differ")


def test_fewshot_shots_never_come_from_the_test_split(workspace, monkeypatch, tmp_path):
    """tadm_arithmetic draws its shots from the SFT training split, never from the problems it
    scores (whose zero-shot documents and order are Table 1's); a task that would take its shots
    from its scored documents is refused in one line, before the model loads."""
    from lm_eval.tasks import TaskManager

    from tadm.experiments import table1
    from tadm.harness import TASKS_DIR, fewshot_source

    monkeypatch.chdir(workspace)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(workspace / ".hf-datasets"))
    task = TaskManager(include_path=str(TASKS_DIR)).load(["tadm_arithmetic"])["tasks"]["tadm_arithmetic"]
    assert fewshot_source(task) == "train" != task.config.test_split
    from tadm.io import read_jsonl

    scored = [d["prompt"] for d in task.test_docs()]
    shots = [d["prompt"] for d in task.fewshot_docs()]
    train = [r["prompt"] for r in read_jsonl(workspace / "data" / "sft" / "train.jsonl", {"prompt": str})
             if r.get("source") == "arithmetic"]
    assert shots and shots == train  # the training split's arithmetic rows (prompts may repeat across splits)
    assert scored[:N] == table1.arithmetic_task(workspace / "data" / "sft", N, LENGTH).prompts
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "scored_only.yaml").write_text(
        "task: scored_only\ndataset_path: json\ndataset_kwargs:\n  data_files: data/sft/validation.jsonl\n"
        "test_split: train\noutput_type: generate_until\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: exact_match\n")
    done = _launch(workspace, tmp_path, "--tasks", "scored_only", "--include_path", str(tasks), "--num_fewshot", "2")
    _one_error_line(done, "--num_fewshot: 2 refused for task scored_only")
    done = _launch(workspace, tmp_path, "--tasks", "scored_only", "--include_path", str(tasks), model="dummy",
                   model_args=None)
    assert done.returncode == 0, done.stderr[-2000:]  # zero-shot it runs


def test_offline_hub_task_fails_in_one_line_before_the_model_loads(workspace, tmp_path):
    done = _launch(workspace, tmp_path, "--tasks", "gsm8k", HF_HOME=str(tmp_path / "hf-home"),
                   HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"))
    _one_error_line(done, "--tasks: task gsm8k: its dataset cannot be loaded (HF_DATASETS_OFFLINE=1")


def test_output_folder_is_named_by_model(workspace, tmp_path):
    done = _launch(workspace, tmp_path, "--tasks", "tadm_arithmetic", "--gen_kwargs", f"max_gen_toks={LENGTH}",
                   "--output_path", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-2000:]
    [folder] = (tmp_path / "out").iterdir()
    assert folder.name == "models__dg_tadm"
    [results] = folder.glob("results_*.json")
    assert '"tadm_pretrained": "models/dg_tadm"' in results.read_text()


def test_model_path_alias_and_both_given_refused(workspace, monkeypatch):
    from tadm.harness.model import TadmLM

    monkeypatch.chdir(workspace)
    lm = TadmLM(row="tadm", K=2, model_path="models/dg_tadm", params="params.yaml", device="cpu")
    assert lm.pretrained == "models/dg_tadm"
    for bad, name in [({"model_path": "models/dg_tadm", "pretrained": "models/dg_tadm"}, "model_args.model_path"),
                      ({"pretrained": "models/dg_fresh"}, "model_args.pretrained")]:
        with pytest.raises(ConfigError) as e:
            TadmLM(row="tadm", K=2, params="params.yaml", device="cpu", **bad)
        assert name in str(e.value) and "\n" not in str(e.value)
