"""`python -m tadm.hub export`: the hub directory's files and config keys, deterministic bytes,
the same tensors (the project's loader still reads it), the one-line refusals; and the remote
code (`tadm.hub.remote`): standalone imports, the state-dict keys of `tadm.models`, and fp32
logits equal to `tadm.models`' bit for bit."""

from __future__ import annotations

import ast
import json
import re

import pytest
import torch
import yaml

from tadm.config import ROOT
from tadm.errors import DataError
from tadm.hub.remote import REMOTE_DIR, REMOTE_FILES
from tadm.hub.remote.configuration_tadm import CONFIG_CLASSES
from tadm.hub.remote.modeling_tadm import MODEL_CLASSES
from tadm.models import load_pretrained
from tadm.registry import method_for
from tests.hub.workspace import L, RUNS, V, make_workspace, tiny_net

FAMILIES = ("mdlm", "sedd", "adlm", "tadm", "ar")
HUB_FILES = {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "README.md", *REMOTE_FILES}


def remote_pair(kind: str, vocab: int = V, seq_len: int = L, std: float = 0.1):
    """(a `tadm.models` network, the remote model of its family with its state dict)."""
    net = tiny_net(kind, vocab, seq_len, std=std)
    raw = net.config_dict()
    cfg = CONFIG_CLASSES[kind](**{k: v for k, v in raw.items() if k != "model_type"}, bos_token_id=0)
    model = MODEL_CLASSES[kind](cfg)
    model.load_state_dict(net.state_dict(), strict=True)
    return net, model.eval()


@pytest.mark.parametrize("run", RUNS)
def test_export_writes_the_hub_layout_and_config_keys(run, hub_workspace):
    root, dirs = hub_workspace
    out = dirs[run]
    family = method_for(load_pretrained(out).model_type).model.model_type
    masked = family != "ar"
    assert {p.name for p in out.iterdir()} == HUB_FILES
    for name in REMOTE_FILES:  # byte for byte
        assert (out / name).read_bytes() == (REMOTE_DIR / name).read_bytes()
    cfg = json.loads((out / "config.json").read_text())
    source = json.loads((root / "models" / run / "config.json").read_text())
    assert {k: cfg[k] for k in source} == source  # the checkpoint's own keys, unchanged
    arch = {"mdlm": "MDLMForMaskedLM", "sedd": "SEDDForMaskedLM", "adlm": "ADLMForMaskedLM",
            "tadm": "TADMForMaskedLM", "ar": "ARForCausalLM"}[family]
    task = "AutoModelForMaskedLM" if masked else "AutoModelForCausalLM"
    assert cfg["architectures"] == [arch]
    assert cfg["auto_map"] == {"AutoConfig": f"configuration_tadm.{family.upper()}Config",
                               "AutoModel": f"modeling_tadm.{arch}", task: f"modeling_tadm.{arch}"}
    assert cfg["dtype"] == cfg["torch_dtype"] == "float32"
    assert cfg["mask_token_id"] == (V if masked else None) and cfg["bos_token_id"] == cfg["eos_token_id"] == 0
    assert cfg["hidden_size"] == 32 and cfg["num_attention_heads"] == 2 and cfg["max_position_embeddings"] == L
    assert cfg["num_hidden_layers"] == (3 if family in ("adlm", "tadm") else 2)
    assert cfg["noise_schedule"] == {"type": "loglinear", "eps": 0.001}
    assert cfg["method"]["run"] == run and cfg["method"]["family"] == family
    if family == "tadm":  # TADM‡ and TADM† differ in their config at last
        assert cfg["method"]["gamma"] == (0.0 if run == "tadm_gamma0" else 0.003)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["do_sample"] is True and gen["top_p"] == 0.9 and gen["max_length"] == L
    assert gen["sampler"] == {"sedd": "sedd-analytic", "ar": "ar", "mdlm": "mdlm"}.get(family, "remdm-loop")
    if masked:
        assert gen["steps"] == 64 and gen["mask_token_id"] == V and gen["budgets"][0] == {"T": 64, "K": 8}
    assert ("refresh_every" in gen) == (family == "tadm")
    tok = json.loads((out / "tokenizer_config.json").read_text())
    assert tok["tokenizer_class"] == "PreTrainedTokenizerFast" and tok["model_max_length"] == L
    assert tok.get("mask_token") == ("<|mask|>" if masked else None)
    card = (out / "README.md").read_text()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "transformers" and meta["license"] == "mit" and "custom_code" in meta["tags"]
    assert meta["pipeline_tag"] == ("fill-mask" if masked else "text-generation")
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == 25.79
    assert "trust_remote_code=True" in card and f"sampler=\"{gen['sampler']}\"" in card


def test_export_is_byte_deterministic(tmp_path):
    from tadm.hub.export import export

    root = make_workspace(tmp_path, runs=("tadm",))
    a = export(root / "models" / "tadm", tmp_path / "a", params=root / "params.yaml")
    b = export(root / "models" / "tadm", tmp_path / "b", params=root / "params.yaml")
    assert {p.name: p.read_bytes() for p in a.iterdir()} == {p.name: p.read_bytes() for p in b.iterdir()}


@pytest.mark.parametrize("run", ("tadm", "ar"))
def test_export_keeps_tensors_and_tadm_still_loads_it(run, hub_workspace):
    from safetensors import safe_open

    root, dirs = hub_workspace
    source, exported = load_pretrained(root / "models" / run), load_pretrained(dirs[run])
    assert list(exported.state_dict()) == list(source.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(exported.state_dict().values(), source.state_dict().values()))
    with safe_open(str(dirs[run] / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}


def _cli(*args) -> tuple[int, str]:
    import contextlib
    import io

    from tadm.hub.__main__ import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["export", *map(str, args)])
    return code, err.getvalue()


def test_export_refuses_params_that_do_not_describe_the_model(tmp_path):
    root = make_workspace(tmp_path, runs=("mdlm",))
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["model"]["d_model"] = 64
    (root / "other.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    code, err = _cli(root / "models" / "mdlm", tmp_path / "out", "--params", root / "other.yaml")
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert "params.yaml no longer describes this checkpoint" in err and "model.d_model" in err and "--params" in err
    assert not (tmp_path / "out").exists()
    code, err = _cli(root / "models" / "mdlm", tmp_path / "out", "--params", root / "params.yaml", "--run", "ar")
    assert code == 2 and err.count("\n") == 1 and "--run: run 'ar' trains model_type 'ar'" in err
    code, err = _cli(root / "models" / "mdlm", tmp_path / "out", "--params", root / "params.yaml", "--run", "llada")
    assert code == 2 and err.count("\n") == 1 and "--run: 'llada' is not a run" in err


def test_export_refuses_a_nonempty_out(tmp_path):
    from tadm.hub.export import export

    root = make_workspace(tmp_path, runs=("sedd",))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, err = _cli(root / "models" / "sedd", out, "--params", root / "params.yaml")
    assert code == 2 and err.count("\n") == 1 and "OUT" in err and "not an empty folder" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    (out / "keep.txt").unlink()  # an empty folder is fine
    assert export(root / "models" / "sedd", out, params=root / "params.yaml") == out
    with pytest.raises(DataError, match="tokenizer.json: 36 tokens, the checkpoint's vocab_size is 37"):
        from tests.hub.workspace import write_tokenizer

        write_tokenizer(tmp_path / "small_tok", V - 1)
        export(root / "models" / "sedd", tmp_path / "out2", params=root / "params.yaml", tokenizer=tmp_path / "small_tok")


ALLOWED_IMPORTS = {"__future__", "math", "os", "shutil", "dataclasses", "typing", "torch", "transformers"}


@pytest.mark.parametrize("name", REMOTE_FILES)
def test_remote_files_import_only_torch_and_transformers(name):
    tree = ast.parse((REMOTE_DIR / name).read_text())
    siblings = {f.removesuffix(".py") for f in REMOTE_FILES}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots = {alias.name.split(".")[0] for alias in node.names}
            assert roots <= ALLOWED_IMPORTS, f"{name}:{node.lineno} imports {roots}"
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: only the files beside it
                assert node.level == 1 and node.module in siblings, f"{name}:{node.lineno}"
            else:
                assert node.module.split(".")[0] in ALLOWED_IMPORTS, f"{name}:{node.lineno} imports {node.module}"


@pytest.mark.parametrize("kind", FAMILIES)
def test_remote_state_dict_keys_equal_tadm_models(kind):
    net, model = remote_pair(kind)
    assert list(model.state_dict()) == list(net.state_dict())
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == \
        {k: tuple(v.shape) for k, v in net.state_dict().items()}


@pytest.mark.parametrize("kind", FAMILIES)
def test_remote_logits_equal_tadm_models_bit_for_bit(kind):
    assert torch.get_num_threads() == 1
    net, model = remote_pair(kind)
    gen = torch.Generator().manual_seed(1)
    z = torch.randint(0, V + (kind != "ar"), (3, L), generator=gen)
    with torch.no_grad():
        out = model(z)
        assert torch.equal(out.logits, method_for(kind).canvas_logits(net, z))
        if kind == "tadm":  # a stale canvas z_t' (more masked), and a cached anchor
            stale = z.masked_fill(torch.rand(z.shape, generator=gen) < 0.5, V)
            assert torch.equal(model(z, anchor_input_ids=stale).logits, net(z, stale))
            h = model(stale).anchor_hidden_states
            assert torch.equal(h, net.anchor(stale))
            assert torch.equal(model(z, anchor_hidden_states=h).logits, net(z, stale))
            with pytest.raises(ValueError, match="not both"):
                model(z, anchor_input_ids=stale, anchor_hidden_states=h)
        if kind == "ar":
            loss = model(z, labels=z).loss
            ref = torch.nn.functional.cross_entropy(net(z)[:, :-1].flatten(0, 1), z[:, 1:].flatten())
            assert torch.equal(loss, ref)
        with pytest.raises(TypeError, match="unexpected argument"):
            model(z, position_ids=z)
        with pytest.raises(ValueError, match="attention_mask has zeros"):
            model(z, attention_mask=torch.zeros_like(z))


def test_remote_loading_is_strict(hub_workspace, tmp_path):
    """A weights file without one of the network's tensors, or with one more, is refused in one
    line naming them, not filled with a random initialisation."""
    import shutil

    from safetensors.torch import load_file, save_file

    _, dirs = hub_workspace
    bad = tmp_path / "bad"
    shutil.copytree(dirs["mdlm"], bad)
    tensors = load_file(str(bad / "model.safetensors"))
    del tensors["final.linear.bias"]
    tensors["extra.weight"] = torch.zeros(2)
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="does not fit MDLMForMaskedLM .2 tensor.s..: missing final.linear.bias; "
                                         "unexpected extra.weight") as e:
        MODEL_CLASSES["mdlm"].from_pretrained(bad)
    assert "\n" not in str(e.value)


def test_x0_log_probs_is_subs():
    from tadm.hub.remote.modeling_tadm import x0_log_probs
    from tadm.losses import subs_log_probs

    logits = torch.randn(2, L, V + 1, generator=torch.Generator().manual_seed(0))
    z = torch.randint(0, V + 1, (2, L), generator=torch.Generator().manual_seed(1))
    for dtype in (torch.float32, torch.float64):
        assert torch.equal(x0_log_probs(logits, z, V, dtype), subs_log_probs(logits, z, V, dtype))


def test_hub_card_cites_the_readme_bibtex():
    from tadm.hub.card import BIBTEX

    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Citation\s+```bibtex\n(.*?)\n```", readme, re.S)
    assert block and block.group(1) == BIBTEX
