"""transformers' Auto classes load TADM checkpoints (tadm.auto): every family through
AutoModel and AutoModelForMaskedLM (AR: AutoModelForCausalLM) with the project's weights and
outputs (a ModelOutput's ``.logits``), a bit-identical save_pretrained, registration after
`import tadm` without importing transformers itself; and the hub models' contract kept for an
exported directory once `import tadm` has run (dtype honoured, unknown keywords refused, the
directory's extras saved again)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import pytest
import torch

import tadm  # noqa: F401  (installs the registration hook)
from tadm import auto, config
from tadm.models import build_model, load_pretrained
from tadm.config import ROOT

V, L = 37, 16


def _saved(kind: str, directory):
    cfg = config.ModelConfig(d_model=32, n_heads=2, mlp_ratio=2, mdlm_layers=2, anchor_layers=2, denoiser_layers=1)
    torch.manual_seed(0)
    model = build_model(kind, cfg, V, L)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.1)
    model.save_pretrained(directory)
    return model.eval()


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("kind", auto.families())
def test_every_family_loads_through_the_auto_classes_and_saves_the_same_bytes(kind, tmp_path):
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    net = _saved(kind, tmp_path / "ckpt")
    cfg = AutoConfig.from_pretrained(tmp_path / "ckpt")
    assert cfg.model_type == kind and cfg.vocab_size == V and cfg.seq_len == L
    for auto_cls in (AutoModel, AutoModelForCausalLM if kind == "ar" else AutoModelForMaskedLM):
        model = auto_cls.from_pretrained(tmp_path / "ckpt")
        assert type(model).__name__ == f"{kind.upper()}Model" and not model.training
        assert model.net.state_dict().keys() == net.state_dict().keys()
        assert all(torch.equal(a, b) for a, b in zip(model.net.state_dict().values(), net.state_dict().values()))
    z = torch.randint(0, V + (kind != "ar"), (2, L), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        direct = net(z, z) if kind == "tadm" else net(z)
        assert torch.equal(model(z).logits, direct[0] if isinstance(direct, tuple) else direct)
    model.save_pretrained(tmp_path / "again")
    for name in ("model.safetensors", "config.json"):
        assert _sha(tmp_path / "again" / name) == _sha(tmp_path / "ckpt" / name)
    assert load_pretrained(tmp_path / "again").model_type == kind  # and the project's loader reads it


def test_a_model_from_its_config_and_the_refusals(tmp_path):
    from transformers import AutoConfig, AutoModel

    _saved("tadm", tmp_path / "ckpt")
    fresh = AutoModel.from_config(AutoConfig.from_pretrained(tmp_path / "ckpt"))
    assert type(fresh.net).__name__ == "TADM" and fresh.net.vocab_size == V
    _, mdlm_cls = auto.classes("mdlm")
    with pytest.raises(ValueError, match="not a local checkpoint directory"):
        mdlm_cls.from_pretrained(tmp_path / "missing")
    with pytest.raises(ValueError, match="config model_type 'tadm' but a 'mdlm' checkpoint"):
        _saved("mdlm", tmp_path / "m")
        mdlm_cls.from_pretrained(tmp_path / "m", config=AutoConfig.from_pretrained(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="no transformers class for model_type 'llada'"):
        auto.classes("llada")


def test_the_auto_path_bounds_config_reading_before_it_reads(tmp_path):
    """Through AutoModel too: a config.json over 1 MiB is refused from its size (nothing read), a
    deeply nested one in one line, and a TADM checkpoint relabelled as another architecture is
    refused instead of loading that architecture with random weights."""
    import json
    import tracemalloc

    from transformers import AutoConfig, AutoModel

    _saved("tadm", tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "config.json"
    good = json.loads(path.read_text())
    path.write_text(json.dumps({**good, "model_type": "bert"}))
    with pytest.raises(ValueError, match="a TADM checkpoint's config .* model_type 'bert', not one of") as e:
        AutoModel.from_pretrained(tmp_path / "ckpt")
    assert "\n" not in str(e.value)
    with open(path, "w") as f:  # 64 MiB of spaces inside the object
        f.write("{" + " " * (64 << 20) + "}")
    tracemalloc.start()
    with pytest.raises(ValueError, match="bytes, more than the 1048576 a model config may have"):
        AutoModel.from_pretrained(tmp_path / "ckpt")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 << 20  # refused from its size, not read
    path.write_text("{\"a\": " * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(ValueError, match="nested too deeply"):
        AutoConfig.from_pretrained(tmp_path / "ckpt")


@pytest.mark.parametrize("order", ["tadm first", "transformers first"])
def test_import_tadm_registers_lazily_in_either_order(tmp_path, order):
    """`import tadm` does not import transformers (it costs seconds); the Auto classes know the
    families whichever of the two is imported first."""
    _saved("mdlm", tmp_path / "ckpt")
    imports = "import tadm, sys; assert 'transformers' not in sys.modules\nfrom transformers import AutoModel" \
        if order == "tadm first" else "from transformers import AutoModel\nimport tadm"
    code = textwrap.dedent(f"""
{imports}
m = AutoModel.from_pretrained({str(tmp_path / 'ckpt')!r})
print(type(m).__name__)
""")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "MDLMModel"


# --------------------------------------------------------------------------- the hub models' contract


@pytest.mark.parametrize("kind", ["mdlm", "sedd", "adlm", "tadm", "ar"])
def test_auto_forward_returns_logits(kind, tmp_path):
    from transformers import AutoModel
    from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput

    net = _saved(kind, tmp_path / "ckpt")
    model = AutoModel.from_pretrained(tmp_path / "ckpt")
    gen = torch.Generator().manual_seed(1)
    z = torch.randint(0, V + (kind != "ar"), (2, L), generator=gen)
    with torch.no_grad():
        out = model(z)
        expected = {"ar": CausalLMOutput, "tadm": None}.get(kind, MaskedLMOutput)
        assert isinstance(out, expected) if expected else type(out).__name__ == "TADMOutput"
        assert torch.equal(out.logits, model(z, return_dict=False)[0])
        if kind == "tadm":  # a stale canvas z_t' and a cached anchor, as the hub model takes them
            stale = z.masked_fill(torch.rand(z.shape, generator=gen) < 0.5, V)
            assert torch.equal(model(z, anchor_input_ids=stale).logits, net(z, stale))
            h = model(stale).anchor_hidden_states
            assert torch.equal(model(z, anchor_hidden_states=h).logits, net(z, stale))
        with pytest.raises(TypeError, match="unexpected argument.*position_ids") as e:
            model(z, position_ids=z)
        assert "\n" not in str(e.value)


def test_auto_ar_is_a_causal_lm(tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    net = _saved("ar", tmp_path / "ar")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "ar")
    assert type(model).__name__ == "ARModel"
    z = torch.randint(0, V, (2, L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(z, labels=z)
        assert torch.equal(out.loss, torch.nn.functional.cross_entropy(net(z)[:, :-1].flatten(0, 1), z[:, 1:].flatten()))
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        AutoModelForMaskedLM.from_pretrained(tmp_path / "ar")
    _saved("mdlm", tmp_path / "mdlm")
    with pytest.raises(ValueError, match="Unrecognized configuration class"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "mdlm")


def test_auto_dtype_honoured_and_unknown_kwarg_refused(tmp_path):
    from transformers import AutoModel

    _saved("tadm", tmp_path / "ckpt")
    for kwargs in ({"dtype": torch.bfloat16}, {"torch_dtype": "bfloat16"}):
        model = AutoModel.from_pretrained(tmp_path / "ckpt", **kwargs)
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        with torch.no_grad():
            assert model(torch.zeros(1, L, dtype=torch.long)).logits.dtype == torch.bfloat16
    assert {p.dtype for p in AutoModel.from_pretrained(tmp_path / "ckpt", dtype="auto").parameters()} == {torch.float32}
    for kwargs, match in (({"output_loading_info": True}, "unsupported argument.*output_loading_info"),
                          ({"low_cpu_mem_usage": True, "revision": "main"}, "unsupported argument.*low_cpu_mem_usage"),
                          ({"dtype": torch.float16, "torch_dtype": torch.bfloat16}, "differ; pass one"),
                          ({"dtype": "int8"}, "dtype must be a floating torch dtype")):
        with pytest.raises(TypeError, match=match) as e:
            AutoModel.from_pretrained(tmp_path / "ckpt", **kwargs)
        assert "\n" not in str(e.value)
    _, model_cls = auto.classes("tadm")  # called directly, a config keyword is not consumed on the way
    with pytest.raises(TypeError, match="unsupported argument.*attn_implementation"):
        model_cls.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")


def _exported(tmp_path, runs=("tadm",)) -> dict:
    """{run: its exported hub directory} from a tiny workspace (tests.hub.workspace)."""
    from tests.hub.workspace import export_all, make_workspace

    return export_all(make_workspace(tmp_path / "ws", runs=runs), runs=runs)


def test_auto_save_pretrained_keeps_card_tokenizer_and_hub_config(tmp_path):
    """An exported directory loaded through tadm.auto and saved is the exported directory again,
    byte for byte; a pipeline directory still saves its two files."""
    from transformers import AutoModelForMaskedLM

    hub = _exported(tmp_path)["tadm"]
    model = AutoModelForMaskedLM.from_pretrained(hub, trust_remote_code=True)
    assert type(model).__module__ == "tadm.auto"  # the registered class wins after `import tadm`
    model.save_pretrained(tmp_path / "again")
    assert {p.name: p.read_bytes() for p in (tmp_path / "again").iterdir()} == \
        {p.name: p.read_bytes() for p in hub.iterdir()}
    assert load_pretrained(tmp_path / "again").model_type == "tadm"
    model.save_pretrained(hub)  # onto itself: still the hub directory
    assert {p.name: p.read_bytes() for p in hub.iterdir()} == \
        {p.name: p.read_bytes() for p in (tmp_path / "again").iterdir()}


def test_local_class_serves_an_exported_dir_after_import_tadm(tmp_path):
    """After `import tadm` the Auto classes give tadm.auto's model for an exported directory: the
    remote model's logits, and with the directory's generation_config.json the remote generate's
    tokens (here drawn by tadm.sampling)."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from tadm.hub.remote.modeling_tadm import MODEL_CLASSES

    for run, hub in _exported(tmp_path, ("tadm", "ar")).items():
        auto_cls = AutoModelForCausalLM if run == "ar" else AutoModelForMaskedLM
        local = auto_cls.from_pretrained(hub, trust_remote_code=True)
        remote = MODEL_CLASSES[run].from_pretrained(hub)
        assert type(local).__module__ == "tadm.auto" and type(remote).__module__ == "tadm.hub.remote.modeling_tadm"
        z = torch.randint(0, V + (run != "ar"), (2, L), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            assert torch.equal(local(z).logits, remote(z).logits)
        assert torch.equal(local.generate(num_samples=3, seed=2), remote.generate(num_samples=3, seed=2))
        assert torch.equal(local.generate(num_samples=3, seed=2, top_p=1.0, steps=8, refresh_every=2)
                           if run == "tadm" else local.generate(num_samples=3, seed=2, top_p=1.0),
                           remote.generate(num_samples=3, seed=2, top_p=1.0, steps=8, refresh_every=2)
                           if run == "tadm" else remote.generate(num_samples=3, seed=2, top_p=1.0))
        with pytest.raises(TypeError, match="unknown argument.*num_beams"):
            local.generate(num_beams=2)
    _saved("ar", tmp_path / "plain_ar")  # a pipeline directory has no BOS id: asked for in one line
    with pytest.raises(ValueError, match="no bos_token_id; pass bos_token_id="):
        AutoModelForCausalLM.from_pretrained(tmp_path / "plain_ar").generate()
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "plain_ar").generate(bos_token_id=0).shape == (1, L)
