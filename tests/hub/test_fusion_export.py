"""`python -m tadm.hub export-fusion`: a TADM:Post-train fusion (and the fresh-anchor control's) on a
tiny random DiffusionGemma base, exported and loaded in a fresh interpreter where ``tadm`` cannot
be imported: ``AutoModel.from_pretrained(OUT, trust_remote_code=True)`` loads the base config.json
names, the fusion strictly, and gives the library's (`TimeAnchoredDiffusionGemma`) fp32 logits bit
for bit (a refresh step and a reuse step) and its tokens from `generate` with the same seed; the
card's metadata and example; the directory's files and config keys; the CLI's one-line refusals."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import yaml

from tadm import config
from tadm.hub.remote import FUSION_REMOTE_FILES, REMOTE_DIR
from tadm.posttrain import model as dgm
from tadm.posttrain.anchored import sampling_kwargs
from tests.conftest import micro_raw
from tests.hub.workspace import write_tokenizer
from tests.posttrain.conftest import tiny_config

VOCAB, NEW = 64, 16  # the tiny base's vocabulary; tokens generated (two canvases of 8)
CHAT = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
TABLE1 = {"arithmetic_Base_accuracy": 23.5, "arithmetic_TADMK2_accuracy": 24.25, "arithmetic_TADMK2_delta_pts": 0.75,
          "arithmetic_TADMK2_delta_se": 1.5, "arithmetic_TADMK2_delta_control_pts": 1.25,
          "arithmetic_Controlfreshanchor_accuracy": 23.0, "arithmetic_NaivereuseK2_accuracy": 20.0}
OUT_FILES = {"fusion.safetensors", "config.json", "generation_config.json", "README.md", *FUSION_REMOTE_FILES}


def perturb(model, seed: int):
    """Every fusion weight random and non-zero (a fresh fusion's up-projection is zero: the base)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for q in model.fusion.parameters():
            q.copy_(0.5 * torch.randn(q.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """(root, params): params.yaml (micro), models/dg_base (a tiny random DiffusionGemma with a
    word-level tokenizer), models/dg_tadm and models/dg_fresh (perturbed fusions), metrics/table1.json."""
    from transformers import DiffusionGemmaForBlockDiffusion

    root = tmp_path_factory.mktemp("ws")
    (root / "params.yaml").write_text(yaml.safe_dump(micro_raw(), sort_keys=False))
    p = config.load(root / "params.yaml")
    pt = p.posttrain
    torch.manual_seed(0)
    depth = pt.shared_layers + pt.anchor_layers + pt.denoiser_layers
    DiffusionGemmaForBlockDiffusion(tiny_config(depth, VOCAB, pt.canvas_length)).save_pretrained(root / dgm.BASE_DIR)
    write_tokenizer(root / dgm.BASE_DIR, VOCAB)
    tok_cfg = root / dgm.BASE_DIR / "tokenizer_config.json"
    tok_cfg.write_text(json.dumps({**json.loads(tok_cfg.read_text()), "chat_template": CHAT}))
    base = dgm.load_base(root / dgm.BASE_DIR, "fp32", local=True)
    for fresh, where, seed in ((False, dgm.TADM_DIR, 1), (True, dgm.FRESH_DIR, 2)):
        model = perturb(dgm.build_tadm(base, p, fresh=fresh), seed)
        dgm.save_fusion(model, root / where, str(dgm.BASE_DIR), {"steps": pt.steps, "seed": 0, "replicate": 0})
    (root / "metrics").mkdir()
    (root / "metrics" / "table1.json").write_text(json.dumps(TABLE1))
    return root, p


def cli(*args, cwd=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "tadm.hub", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def exported(workspace):
    """{"tadm": OUT, "fresh": OUT}: dg_tadm through the CLI (a subprocess), dg_fresh through the function."""
    from tadm.hub.export_fusion import export_fusion

    root, _ = workspace
    proc = cli("export-fusion", root / dgm.TADM_DIR, root / "hub" / "dg_tadm", "--base", root / dgm.BASE_DIR,
               "--params", root / "params.yaml")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(root / "hub" / "dg_tadm")
    fresh = export_fusion(root / dgm.FRESH_DIR, root / "hub" / "dg_fresh", base=str(root / dgm.BASE_DIR),
                          params=root / "params.yaml")
    return {"tadm": root / "hub" / "dg_tadm", "fresh": fresh}


SCRIPT = textwrap.dedent('''
    import sys
    sys.modules["tadm"] = None  # the package is not installed here
    import json, os
    import torch
    torch.set_num_threads(1)
    import transformers
    from transformers import AutoConfig, AutoModel
    transformers.logging.set_verbosity_error()

    dirs, base_dir, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    x = torch.load(os.path.join(out, "inputs.pt"), weights_only=True)
    results = {}
    for name, path in dirs.items():
        r = results[name] = {}
        model = AutoModel.from_pretrained(path, trust_remote_code=True)
        r["classes"] = [type(AutoConfig.from_pretrained(path, trust_remote_code=True)).__name__, type(model).__name__,
                        model.training, str(model.base.dtype), str(model.fusion.q.weight.dtype), model.refresh_every]
        with torch.no_grad():
            one = model(input_ids=x["prompt"], decoder_input_ids=x["z1"])           # a refresh step
            two = model(decoder_input_ids=x["z2"], cache=one.cache, self_conditioning_logits=one.logits)  # reuse
        r["logits"] = [one.logits, two.logits]
        kw = dict(attention_mask=x["mask"], max_new_tokens=x["new"], eos_token_id=None, pad_token_id=None)
        torch.manual_seed(11)
        r["tokens_K2"] = model.generate(x["prompt"], refresh_every=2, **kw).sequences
        torch.manual_seed(11)
        r["tokens_default"] = model.generate(x["prompt"], **kw).sequences
        other = AutoModel.from_pretrained(path, trust_remote_code=True, base_model_name_or_path=base_dir)
        with torch.no_grad():
            r["override_logits"] = other(input_ids=x["prompt"], decoder_input_ids=x["z1"]).logits
        card = open(os.path.join(path, "README.md")).read()
        scope = {}
        exec(card.split("```python\\n")[1].split("```")[0].replace("<this repository or directory>", path), scope)
        r["card_tokens"] = scope["out"].sequences.shape
        try:
            AutoModel.from_pretrained(path)
            r["without_flag"] = "loaded"
        except Exception as e:
            r["without_flag"] = f"{type(e).__name__}: {e}"
    torch.save(results, os.path.join(out, "results.pt"))
''')


@pytest.fixture(scope="module")
def fresh_env(workspace, exported, tmp_path_factory):
    """(inputs, the subprocess's results {"tadm": {...}, "fresh": {...}}): cwd and HF_HOME in tmp,
    offline, one thread, `import tadm` fails."""
    root, p = workspace
    work = tmp_path_factory.mktemp("fresh_env")
    gen = torch.Generator().manual_seed(5)
    canvas = p.posttrain.canvas_length
    x = {"prompt": torch.randint(3, VOCAB, (2, 5), generator=gen), "mask": torch.tensor([[0, 1, 1, 1, 1], [1] * 5]),
         "z1": torch.randint(0, VOCAB, (2, canvas), generator=gen),
         "z2": torch.randint(0, VOCAB, (2, canvas), generator=gen), "new": NEW}
    torch.save(x, work / "inputs.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(work / "hf"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps({k: str(v) for k, v in exported.items()}),
                           str(root / dgm.BASE_DIR), str(work)], cwd=work, env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return x, torch.load(work / "results.pt", weights_only=True)


def library(workspace, fresh: bool):
    """The library's TimeAnchoredDiffusionGemma on the same base directory and fusion."""
    root, p = workspace
    base = dgm.load_base(root / dgm.BASE_DIR, "fp32", local=True)
    model = dgm.build_tadm(base, p, fresh=fresh)
    dgm.load_fusion(model, root / (dgm.FRESH_DIR if fresh else dgm.TADM_DIR))
    model.refresh_every = max(p.posttrain.refresh_every)
    return model.eval()


@pytest.mark.parametrize("name", ["tadm", "fresh"])
def test_fresh_env_logits_equal_the_library_bit_for_bit(name, workspace, fresh_env):
    """A refresh step and a reuse step (K = 3: the second step reuses the first's anchor), fp32:
    torch.equal, not a tolerance."""
    x, results = fresh_env
    r = results[name]
    assert r["classes"] == ["TADMPostTrainConfig", "TADMPostTrainForBlockDiffusion", False, "torch.float32",
                            "torch.float32", 3]
    model = library(workspace, name == "fresh")
    with torch.no_grad():
        cache = model.split.base.model.encoder(input_ids=x["prompt"]).cache
        one = model(decoder_input_ids=x["z1"], cache=cache).logits
        two = model(decoder_input_ids=x["z2"], cache=cache, self_conditioning_logits=one).logits
        assert model.counters.refreshes == 1 and model.counters.steps == 2  # the second step reused the anchor
        fresh_two = model.split(x["z2"], cache, one)  # the base itself at step two
    assert torch.equal(r["logits"][0], one) and torch.equal(r["logits"][1], two)
    assert not torch.allclose(two, fresh_two, atol=1e-3)  # the fusion changed the reuse step: not a trivial check
    assert torch.equal(r["override_logits"], one)  # base_model_name_or_path= names the same base


@pytest.mark.parametrize("name", ["tadm", "fresh"])
def test_fresh_env_generate_equals_the_library(name, workspace, fresh_env):
    """Seed 11, a left-padded prompt, two canvases: K = 2 and config.json's K (3) with
    generation_config.json's sampler give the library's tokens with Table 1's `sampling_kwargs`
    (the fresh-anchor control is evaluated at K = 1 in Table 1; here its code path at K = 2)."""
    x, results = fresh_env
    p = workspace[1]
    pt = p.posttrain
    model = library(workspace, name == "fresh")
    kw = sampling_kwargs(pt.sample_steps, pt.entropy_bound, tuple(pt.temperature), NEW, None, None)
    for key, k in (("tokens_K2", 2), ("tokens_default", 3)):
        torch.manual_seed(11)
        ref = model.generate(x["prompt"], refresh_every=k, attention_mask=x["mask"], **kw).sequences
        assert ref.shape == (2, 5 + NEW)
        assert torch.equal(results[name][key], ref), key


def test_fresh_env_runs_the_cards_example_and_needs_the_flag(fresh_env):
    for name, r in fresh_env[1].items():
        assert r["card_tokens"][0] == 1 and r["card_tokens"][1] > 1, name
        assert r["without_flag"].startswith("ValueError") and "trust_remote_code=True" in r["without_flag"], name


def test_export_writes_the_files_config_and_card(workspace, exported):
    from safetensors.torch import load_file

    root, p = workspace
    out = exported["tadm"]
    assert {f.name for f in out.iterdir()} == OUT_FILES
    for name in FUSION_REMOTE_FILES:
        assert (out / name).read_bytes() == (REMOTE_DIR / name).read_bytes()
    mine = load_file(str(out / "fusion.safetensors"))
    theirs = load_file(str(root / dgm.TADM_DIR / "fusion.safetensors"))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)  # the fusion's only
    cfg = json.loads((out / "config.json").read_text())
    record = json.loads((root / dgm.TADM_DIR / "fusion.json").read_text())
    assert cfg["model_type"] == "tadm_posttrain" and cfg["architectures"] == ["TADMPostTrainForBlockDiffusion"]
    assert cfg["auto_map"] == {"AutoConfig": "configuration_tadm_posttrain.TADMPostTrainConfig",
                               "AutoModel": "modeling_tadm_posttrain.TADMPostTrainForBlockDiffusion"}
    assert cfg["base_model_name_or_path"] == "../../models/dg_base"  # a local base: relative to OUT
    assert [cfg["shared_layers"], cfg["anchor_layers"], cfg["denoiser_layers"]] == record["split"]
    assert (cfg["fusion_rank"], cfg["hidden_size"], cfg["fusion_values"]) == (record["rank"], 32, "change")
    assert cfg["fusion_parameters"] == record["parameters"] == sum(v.numel() for v in mine.values())
    assert cfg["refresh_every"] == max(p.posttrain.refresh_every) == 3 and cfg["dtype"] == "float32"
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["max_denoising_steps"] == p.posttrain.sample_steps and gen["stability_threshold"] is None
    card = (out / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "transformers" and meta["base_model"] == "../../models/dg_base"
    assert "custom_code" in meta["tags"]
    assert "| arithmetic | TADM K=2 | 24.25 | +0.75 ± 1.50 | +1.25 |" in card  # Table 1, read, not invented
    assert "| arithmetic | Base | 23.50 | – | – |" in card
    assert "Control (fresh anchor)" not in card and "Naive" not in card
    assert "HumanEval" in card and "@article{paul2026tadm" in card
    fresh_card = (exported["fresh"] / "README.md").read_text()
    assert "| arithmetic | Control (fresh anchor) | 23.00 |" in fresh_card and "TADM K=2" not in fresh_card


def test_the_card_says_when_there_is_no_table1(workspace, tmp_path):
    from tadm.hub.export_fusion import export_fusion

    root, _ = workspace
    (tmp_path / "params.yaml").write_bytes((root / "params.yaml").read_bytes())
    out = export_fusion(root / dgm.TADM_DIR, tmp_path / "out", base="google/diffusiongemma-26B-A4B-it",
                        params=tmp_path / "params.yaml")
    card = (out / "README.md").read_text()
    assert "No Table 1 results were found" in card and "accuracy (%)" not in card
    assert yaml.safe_load(card.split("---\n")[1])["base_model"] == "google/diffusiongemma-26B-A4B-it"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["base_model_name_or_path"] == "google/diffusiongemma-26B-A4B-it"


def test_cli_refusals_are_one_line_with_exit_status_2(workspace, exported, tmp_path):
    root, _ = workspace
    base, params = ("--base", root / dgm.BASE_DIR), ("--params", root / "params.yaml")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "fusion.json").write_text("{}")
    (tmp_path / "bad" / "fusion.safetensors").write_bytes(b"")
    cases = [
        (("export-fusion", tmp_path / "bad", tmp_path / "o1", *base, *params), "fusion.json: needs split"),
        (("export-fusion", tmp_path / "none", tmp_path / "o2", *base, *params), "not a directory"),
        (("export-fusion", root / dgm.TADM_DIR, exported["tadm"], *base, *params), "exists and is not an empty folder"),
        (("export-fusion", root / dgm.TADM_DIR, tmp_path / "o3", *params), "--base: missing"),
    ]
    for args, message in cases:
        proc = cli(*args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], \
            (args, proc.stderr)
        assert proc.stdout == ""
    assert not any((tmp_path / f"o{i}").exists() for i in (1, 2, 3))


ALLOWED_IMPORTS = {"__future__", "json", "os", "dataclasses", "torch", "transformers"}


@pytest.mark.parametrize("name", FUSION_REMOTE_FILES)
def test_remote_files_import_only_torch_and_transformers(name):
    tree = ast.parse((REMOTE_DIR / name).read_text())
    siblings = {f.removesuffix(".py") for f in FUSION_REMOTE_FILES}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert {a.name.split(".")[0] for a in node.names} <= ALLOWED_IMPORTS, f"{name}:{node.lineno}"
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.level == 1 and node.module in siblings, f"{name}:{node.lineno}"
            else:
                assert node.module.split(".")[0] in ALLOWED_IMPORTS, f"{name}:{node.lineno} imports {node.module}"


def test_export_refuses_a_mismatched_base_params_or_weights(workspace, tmp_path):
    from transformers import DiffusionGemmaForBlockDiffusion

    from tadm.errors import DataError
    from tadm.hub.export_fusion import export_fusion

    root, p = workspace
    fusion, params = root / dgm.TADM_DIR, root / "params.yaml"
    deeper = tmp_path / "deeper_base"
    DiffusionGemmaForBlockDiffusion(tiny_config(6, VOCAB, p.posttrain.canvas_length)).save_pretrained(deeper)
    with pytest.raises(DataError, match="6 decoder layers of width 32, the fusion was trained on 1\\+2\\+1"):
        export_fusion(fusion, tmp_path / "o1", base=str(deeper), params=params)
    with pytest.raises(DataError, match="neither an existing directory nor a hub id"):
        export_fusion(fusion, tmp_path / "o2", base="not a/hub/id", params=params)
    other = tmp_path / "other" / "params.yaml"
    other.parent.mkdir()
    other.write_text(yaml.safe_dump(micro_raw(**{"posttrain.fusion_rank": 16}), sort_keys=False))
    with pytest.raises(DataError, match="does not describe this fusion \\(posttrain.fusion_rank differ"):
        export_fusion(fusion, tmp_path / "o3", base=str(root / dgm.BASE_DIR), params=other)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    record = json.loads((fusion / "fusion.json").read_text())
    (wrong / "fusion.json").write_text(json.dumps({**record, "rank": 16}))
    (wrong / "fusion.safetensors").write_bytes((fusion / "fusion.safetensors").read_bytes())
    with pytest.raises(DataError, match="does not fit the fusion fusion.json describes"):
        export_fusion(wrong, tmp_path / "o4", base=str(root / dgm.BASE_DIR), params=params)
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))
