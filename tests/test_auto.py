"""transformers' Auto classes load TADM checkpoints (tadm.auto): every family through
AutoModel / AutoModelForMaskedLM with the project's weights and outputs, a bit-identical
save_pretrained, registration after `import tadm` without importing transformers itself."""

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
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

    net = _saved(kind, tmp_path / "ckpt")
    cfg = AutoConfig.from_pretrained(tmp_path / "ckpt")
    assert cfg.model_type == kind and cfg.vocab_size == V and cfg.seq_len == L
    for auto_cls in (AutoModel, AutoModelForMaskedLM):
        model = auto_cls.from_pretrained(tmp_path / "ckpt")
        assert type(model).__name__ == f"{kind.upper()}Model" and not model.training
        assert model.net.state_dict().keys() == net.state_dict().keys()
        assert all(torch.equal(a, b) for a, b in zip(model.net.state_dict().values(), net.state_dict().values()))
    z = torch.randint(0, V + (kind != "ar"), (2, L), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        direct = net(z, z) if kind == "tadm" else net(z)
        assert torch.equal(model(z), direct[0] if isinstance(direct, tuple) else direct)
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
