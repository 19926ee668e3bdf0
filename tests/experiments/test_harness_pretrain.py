"""lm-evaluation-harness on Table 2's pretraining models (tadm.harness.pretrain, the model
``tadm_pretrain``): a full canvas's Monte Carlo NELBO is the validation NELBO the trainer
reports, AR's likelihoods are exact, a continuation is scored on its own positions with the
choices of a document on the same random numbers, generation keeps the prompt and refreshes
TADM's anchor every K steps, and the launcher runs the Tiny Shakespeare tasks. Tiny random
models of the micro profile (random weights: the values are checked against the formulas, not
against trained numbers)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch

from tadm.errors import ConfigError
from tests.experiments.conftest import env, random_model

lm_eval = pytest.importorskip("lm_eval")  # pinned in requirements/lock.txt

KINDS = ("mdlm", "tadm", "sedd", "ar")


@pytest.fixture(scope="module")
def workspace(micro_packed, tmp_path_factory):
    """models/{mdlm,tadm,sedd,ar} (random, the micro vocabulary and canvas), the micro corpus and
    tokenizer under data/, and the micro params."""
    import yaml

    from tests.conftest import micro_raw

    root = tmp_path_factory.mktemp("pretrain_harness")
    counts = json.loads((micro_packed / "manifest.json").read_text())["counts"]
    for i, kind in enumerate(KINDS):
        random_model(kind, counts["vocab_size"], counts["seq_len"], seed=i).save_pretrained(root / "models" / kind)
    shutil.copytree(micro_packed.parent / "corpus", root / "data" / "corpus")
    shutil.copytree(micro_packed.parent / "tokenizer", root / "data" / "tokenizer")
    (root / "params.yaml").write_text(yaml.safe_dump(micro_raw(**{"runtime.device": "cpu"}), sort_keys=False))
    return root


def _lm(root, monkeypatch, **args):
    from tadm.harness.pretrain import TadmPretrainLM

    monkeypatch.chdir(root)
    return TadmPretrainLM(params="params.yaml", device="cpu", **args)


class _Request:
    """What the model reads of an lm_eval Instance."""

    def __init__(self, args: tuple, doc_id: int = 0, task: str = "t"):
        self.args, self.metadata, self.idx = args, (task, doc_id, 1), 0


def _validation_canvases(micro_packed, n: int = 4) -> torch.Tensor:
    from tadm.data.packing import PackedTokens

    data = PackedTokens(micro_packed / "validation")
    return torch.stack([torch.from_numpy(data[i].astype("int64")) for i in range(n)])


@pytest.mark.parametrize("kind", ["mdlm", "tadm", "sedd"])
def test_rolling_nelbo_equals_validation_nelbo_within_mc_se(workspace, micro_packed, monkeypatch, kind):
    """A full canvas scored by the harness (its Monte Carlo NELBO over all positions) estimates
    what `Method.nelbo` -- the trainer's validation bound -- estimates: the two means agree
    within 3 standard errors; and a document is cut into canvases exactly as the data pipeline
    cuts it (`tadm.data.packing.wrap`)."""
    from tadm import config
    from tadm.data.packing import wrap
    from tadm.harness.likelihood import rolling_canvases
    from tadm.registry import METHODS

    lm = _lm(workspace, monkeypatch, row=kind, mc_num=64, mc_batch=16)
    x = _validation_canvases(micro_packed)
    L = x.shape[1]
    ours = []
    for b, canvas in enumerate(x.tolist()):
        ours.append(lm._nelbo(canvas, (0, L), torch.Generator().manual_seed(b)))
    mean_ours = sum(e.nelbo for e in ours)
    se_ours = math.sqrt(sum(e.se ** 2 for e in ours))
    method = METHODS[kind](kind, config.load(workspace / "params.yaml"))
    method.mask_id = lm.mask_id
    with torch.no_grad():
        draws = torch.stack([method.nelbo(lm.model, x, torch.Generator().manual_seed(100 + s)).double().sum()
                             for s in range(64)])
    mean_val, se_val = float(draws.mean()), float(draws.std()) / math.sqrt(len(draws))
    assert abs(mean_ours - mean_val) < 3 * math.sqrt(se_ours ** 2 + se_val ** 2), (mean_ours, mean_val, se_ours, se_val)
    # the document's canvases: the pipeline's wrap, then the remainder on its known prefix
    tokens = list(range(1, 2 * (L - 2) + 5))
    canvases = rolling_canvases(tokens, L, 0, 0, lm.mask_id)
    assert [c for c, n in canvases[:-1]] == [list(w) for w in wrap([tokens], L, 0, 0)]
    assert all(n == L for _, n in canvases[:-1])
    rest, n = canvases[-1]
    assert n == 1 + 5 and rest[:n] == [0, *tokens[-4:], 0] and set(rest[n:]) == {lm.mask_id}


def test_rolling_ar_is_exact(workspace, monkeypatch):
    """AR's rolling log-likelihood is the exact NLL of its canvases (`tadm.losses.ar_nll`),
    and its loglikelihood the exact log-probability of the continuation."""
    from tadm.harness.likelihood import rolling_canvases
    from tadm.losses import ar_nll

    lm = _lm(workspace, monkeypatch, row="ar")
    text = (workspace / "data" / "corpus" / "validation.jsonl").read_text().splitlines()[0]
    text = json.loads(text)["text"][:400]
    [got] = lm.loglikelihood_rolling([_Request((text,))], disable_tqdm=True)
    expected = 0.0
    with torch.no_grad():
        for canvas, n in rolling_canvases(lm.encode(text), lm.seq_len, lm.bos, lm.eos, lm.eos):
            x = torch.tensor([canvas[:n]])
            expected -= float(ar_nll(lm.model(x).double(), x, torch.float64))
    assert got == pytest.approx(expected, rel=1e-9, abs=1e-6)
    [(logp, greedy)] = lm.loglikelihood([_Request(("To be, or", " not to be"))], disable_tqdm=True)
    ctx, cont = lm.encode("To be, or"), lm.encode(" not to be")
    with torch.no_grad():
        x = torch.tensor([[lm.bos, *ctx, *cont]])
        logprobs = torch.log_softmax(lm.model(x).double(), -1)[0, len(ctx):-1]
    # fp32 logits of a canvas one token shorter: equal to float32 rounding, not bit for bit on every CPU
    assert logp == pytest.approx(float(logprobs.gather(-1, torch.tensor(cont)[:, None]).sum()), rel=1e-6)
    assert greedy == bool((logprobs.argmax(-1) == torch.tensor(cont)).all())


def _uniform(lm):
    """Make `lm`'s network predict uniformly (zero logits): log x_theta = -log V at every masked position."""
    lm._logits = lambda z: torch.zeros(*z.shape, lm.mask_id + 1)


@pytest.mark.parametrize("estimator", ["count", "time"])
def test_loglikelihood_is_the_conditional_nelbo(workspace, monkeypatch, estimator):
    """With uniform predictions a time draw's bound is lambda_t * (masked continuation tokens) *
    log V, whose expectation is n (1 - eps) log V for a continuation of n tokens whatever the
    context (within 4 standard errors); a count draw's is (n / k) * k * log V = n log V exactly;
    context tokens are never scored."""
    from tadm.harness.likelihood import encode_pair

    lm = _lm(workspace, monkeypatch, row="mdlm", mc_num=256, mc_batch=64, estimator=estimator)
    _uniform(lm)
    V = lm.mask_id
    for context, continuation in [("ROMEO:", " What say you"), ("A much longer context, with words", " and")]:
        _, cont = encode_pair(lm.encode, context, continuation)
        [(value, greedy)] = lm.loglikelihood([_Request((context, continuation))], disable_tqdm=True)
        assert greedy is False
        if estimator == "count":
            assert value == pytest.approx(-len(cont) * math.log(V), rel=1e-6) and lm.ses[-1] < 1e-5  # fp32 log V
        else:
            expected = -len(cont) * (1 - 1e-3) * math.log(V)
            assert abs(value - expected) < 4 * lm.ses[-1] + 1e-9, (value, expected, lm.ses[-1])


def test_both_estimators_estimate_the_closed_form_bound_count_with_less_noise():
    """On a network whose predictions depend on the canvas, the bound of n = 4 scored positions in
    closed form -- sum over k of 1/k times the mean over the k-subsets S of sum_{i in S} -log
    x_theta(z_S)[x_i] (linear alpha, t integrated out) -- is what `count_nelbo` estimates (within 4
    standard errors), and `canvas_nelbo` too up to MDLM's epsilon; the count draws' spread is the
    smaller. Positions outside `scored` stay clean and the masked tail is never scored."""
    from itertools import combinations

    from tadm.harness.likelihood import canvas_nelbo, count_nelbo, summarise
    from tadm.losses import subs_log_probs
    from tadm.schedule import LogLinearSchedule

    V, mask_id, L = 7, 7, 8
    W = torch.randn(V + 1, L, V + 1, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def logits_fn(z):  # (b, L) -> (b, L, V+1): each position reads the token one to its right
        return 3 * W[z.roll(-1, dims=1), torch.arange(L)].float()

    x = torch.tensor([1, 2, 3, 4, 5, 6, mask_id, mask_id])  # a masked tail, never scored
    scored = torch.tensor([False, False, True, True, True, True, False, False])
    where = [2, 3, 4, 5]
    exact = 0.0
    for k in range(1, 5):
        subsets = list(combinations(where, k))
        total = 0.0
        for S in subsets:
            z = x.clone()
            z[list(S)] = mask_id
            logp = subs_log_probs(logits_fn(z[None]), z[None], mask_id).double()[0]
            total -= sum(float(logp[i, x[i]]) for i in S)
        exact += total / len(subsets) / k
    count = summarise(count_nelbo(logits_fn, x, scored, mask_id, 4096, 512, torch.Generator().manual_seed(1)))
    time = summarise(canvas_nelbo(logits_fn, x, scored, mask_id, LogLinearSchedule(1e-3), 4096, 512,
                                  torch.Generator().manual_seed(1)))
    assert abs(count.nelbo - exact) < 4 * count.se, (count, exact)
    assert abs(time.nelbo - exact) < 4 * time.se + 1e-2 * exact, (time, exact)
    assert count.se < time.se


def test_estimator_refused_in_one_line(workspace, monkeypatch):
    for bad, says in [({"row": "mdlm", "estimator": "nope"}, "must be one of count, time"),
                      ({"row": "sedd", "estimator": "count"}, "use estimator=time"),
                      ({"row": "ar", "estimator": "time"}, "exact")]:
        with pytest.raises(ConfigError, match="model_args.estimator") as e:
            _lm(workspace, monkeypatch, **bad)
        assert says in str(e.value) and "\n" not in str(e.value)
    assert _lm(workspace, monkeypatch, row="sedd").estimator == "time"
    assert _lm(workspace, monkeypatch, row="tadm").estimator == "count"


def test_loglikelihood_choices_share_random_numbers(workspace, monkeypatch):
    """The requests of one document draw the same times and masks: two continuations of the same
    length score exactly alike under uniform predictions (no Monte Carlo noise between choices),
    the same request twice gives the same value, and another document draws other numbers."""
    lm = _lm(workspace, monkeypatch, row="tadm", mc_num=16, mc_batch=8)
    context = "First Citizen:\nBefore we proceed"
    candidates = [" any further", " any farther", " the king", " my lord", " good night", " to be", " and so"]
    by_length: dict[int, list[str]] = {}
    for c in candidates:
        by_length.setdefault(len(lm.encode(context + c)), []).append(c)
    a, b = next(group for group in by_length.values() if len(group) > 1)[:2]
    scores = lm.loglikelihood([_Request((context, a), 0), _Request((context, a), 0), _Request((context, a), 1)],
                              disable_tqdm=True)
    assert scores[0] == scores[1] != scores[2]
    _uniform(lm)
    first, second = lm.loglikelihood([_Request((context, a), 3), _Request((context, b), 3)], disable_tqdm=True)
    assert first == second


def test_mc_num_must_be_a_multiple_of_mc_batch_one_line(workspace, monkeypatch):
    for bad, name in [({"mc_num": 10, "mc_batch": 3}, "model_args.mc_batch"), ({"mc_num": 0}, "model_args.mc_num"),
                      ({"row": "nope"}, "model_args.row"), ({"row": "ar", "pretrained": "models/mdlm"}, "model_args.row"),
                      ({"pretrained": "models/mdlm", "model_path": "models/mdlm"}, "model_args.model_path"),
                      ({"pretrained": "models/none"}, "model_args.pretrained"), ({"row": "mdlm", "K": 2}, "model_args.K"),
                      ({"colour": 1}, "model_args")]:
        with pytest.raises(ConfigError) as e:
            _lm(workspace, monkeypatch, **bad)
        assert name in str(e.value) and "\n" not in str(e.value), str(e.value)
    lm = _lm(workspace, monkeypatch, model_path="models/tadm")  # LLaDA's spelling; the directory's first row
    assert (lm.row.name, lm.directory) == ("tadm", "models/tadm")


def test_generate_until_keeps_the_prompt_and_honours_K(workspace, monkeypatch):
    """The prompt's positions are never decoded or re-masked, the rest of the canvas ends fully
    decoded, TADM's anchor runs once every K steps, and a request's completion depends on its
    seed only (the same twice, another document another one)."""
    from tadm.harness.pretrain import prompt_clamped_trajectory

    lm = _lm(workspace, monkeypatch, row="tadm", T=8)
    prompt = [lm.bos, *lm.encode("ROMEO:\n")]
    canvas = torch.tensor([prompt + [lm.mask_id] * (lm.seq_len - len(prompt))])
    for k, calls in [(1, 8), (4, 2), (8, 1)]:
        count = []
        anchor = lm.model.anchor
        monkeypatch.setattr(lm.model, "anchor", lambda z, anchor=anchor: count.append(1) or anchor(z))
        with torch.no_grad():
            z = prompt_clamped_trajectory(lm.model, canvas.clone(), len(prompt), "remdm-loop", 8, k, 0.9,
                                          torch.Generator().manual_seed(0), lm.p)
        monkeypatch.undo()
        monkeypatch.chdir(workspace)
        assert z[0, :len(prompt)].tolist() == prompt and not (z == lm.mask_id).any()
        assert len(count) == calls
    requests = [_Request(("ROMEO:\n", {"until": ["\n\n"], "max_gen_toks": 10}), d) for d in (0, 0, 1)]
    texts = lm.generate_until(requests, disable_tqdm=True)
    assert all("\n\n" not in t for t in texts)
    assert texts[0] != texts[1] or texts[0] != texts[2]  # a document's repeats draw anew; documents differ
    again = lm.generate_until(requests[:1], disable_tqdm=True)
    assert again == texts[:1]
    ar = _lm(workspace, monkeypatch, row="ar")
    [text] = ar.generate_until([_Request(("ROMEO:\n", {"until": [], "max_gen_toks": 6}))], disable_tqdm=True)
    assert len(ar.encode(text)) <= 8


def test_pretrain_launcher_runs_shakespeare_and_cloze(workspace, tmp_path):
    """`python -m tadm.harness --model tadm_pretrain` runs the perplexity and the cloze task end to
    end; the results folder is named after the model directory."""
    e = {**env(), "HF_DATASETS_CACHE": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "tadm.harness", "--model", "tadm_pretrain", "--model_args",
           "row=mdlm,mc_num=4,mc_batch=2,params=params.yaml", "--tasks", "tadm_shakespeare", "tadm_shakespeare_cloze",
           "--limit", "2", "--device", "cpu", "--output_path", str(tmp_path / "out")]
    done = subprocess.run(cmd, cwd=workspace, env=e, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "bits_per_byte" in done.stdout and "acc_norm" in done.stdout
    [folder] = (tmp_path / "out").iterdir()
    assert folder.name == "models__mdlm"
    [results] = folder.glob("results_*.json")
    info = json.loads(results.read_text())
    assert info["config"]["tadm_mc_num"] == 4 and info["config"]["tadm_row"] == "mdlm"
    assert info["results"]["tadm_shakespeare_cloze"]["acc,none"] >= 0.0


def test_chat_template_refused_before_the_model_loads():
    import argparse

    from tadm.harness import check_args

    with pytest.raises(ConfigError, match="--apply_chat_template") as e:
        check_args(argparse.Namespace(model="tadm_pretrain", apply_chat_template=True))
    assert "\n" not in str(e.value)
