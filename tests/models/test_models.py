"""Models: shapes, TADM's anchor / denoise split, gradient flow, causality, rotary, save / load,
and the paper-size parameter counts (built on the meta device: nothing is allocated)."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tadm.config import ModelConfig
from tadm.models import (
    AR, MDLM, MODEL_REGISTRY, SEDD, TADM, CheckpointError, build_model, count_parameters, load_pretrained,
)
from tadm.models.dit import apply_rotary, rotary_cos_sin
from tadm.errors import DataError, TadmError

V, L, B = 50, 16, 2
TINY = ModelConfig(d_model=32, n_heads=2, mlp_ratio=2, mdlm_layers=2, anchor_layers=2, denoiser_layers=1)
TYPES = ["mdlm", "adlm", "tadm", "sedd", "ar"]
PAPER = ModelConfig(d_model=768, n_heads=12, mlp_ratio=4, mdlm_layers=12, anchor_layers=12, denoiser_layers=6)


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter with well-scaled noise. A fresh DiT is the identity with a zero head
    (adaLN gates and output layers are zero-initialised), so structural tests need non-trivial
    weights: matrices ~ N(0, 1/fan_in), norm scales ~ 1 + N(0, 0.1^2), other vectors ~ N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() >= 2:
                p.copy_(noise / p.shape[-1] ** 0.5)
            elif "norm" in name:
                p.copy_(1 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
    return model


def tiny(model_type: str, seed: int = 0):
    torch.manual_seed(seed)
    return randomize_(build_model(model_type, TINY, V, L), seed).eval()


def tokens(seed: int = 1, n_tokens: int = V + 1) -> torch.Tensor:
    return torch.randint(0, n_tokens, (B, L), generator=torch.Generator().manual_seed(seed))


def run(model, x: torch.Tensor, x2: torch.Tensor | None = None) -> torch.Tensor:
    """The main logits of any model type."""
    if model.model_type == "tadm":
        return model(x, x if x2 is None else x2)
    out = model(x)
    return out[0] if model.model_type == "adlm" else out


def model_input(model_type: str, seed: int = 1) -> torch.Tensor:
    return tokens(seed, V if model_type == "ar" else V + 1)


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("model_type", TYPES)
def test_output_shapes(model_type):
    model = tiny(model_type)
    assert MODEL_REGISTRY[model_type] is type(model) and model.model_type == model_type
    x = model_input(model_type)
    n_out = V if model_type == "ar" else V + 1
    if model_type == "adlm":
        logits, anchor_logits = model(x)
        assert anchor_logits.shape == (B, L, n_out)
    elif model_type == "tadm":
        h = model.anchor(x)
        assert h.shape == (B, L, TINY.d_model)
        assert model.anchor_logits(h).shape == (B, L, n_out)
        logits = model(x, x)
    else:
        logits = model(x)
    assert logits.shape == (B, L, n_out) and torch.isfinite(logits).all()


def test_fresh_model_predicts_uniform_and_classes_are_distinct():
    torch.manual_seed(0)
    model = MDLM(TINY, V, L)
    assert torch.all(model(tokens()) == 0)  # zero-initialised head, like MDLM
    assert SEDD.model_type == "sedd" and isinstance(SEDD(TINY, V, L), MDLM)
    assert AR(TINY, V, L).embed.num_embeddings == V and MDLM(TINY, V, L).embed.num_embeddings == V + 1


# --------------------------------------------------------------------------- TADM structure


def test_tadm_forward_is_denoise_of_anchor():
    model = tiny("tadm")
    z_t, z_tp = tokens(1), tokens(2)
    h = model.anchor(z_tp)
    torch.testing.assert_close(model(z_t, z_tp), model.denoise(z_t, h), rtol=0, atol=0)
    logits, anchor_logits = model(z_t, z_tp, return_anchor_logits=True)  # one call, for DDP
    assert torch.equal(logits, model(z_t, z_tp)) and torch.equal(anchor_logits, model.anchor_logits(h))
    # a cached anchor is reused as is: denoise only depends on z_t through S, Phi and D
    assert not torch.equal(model.denoise(tokens(3), h), model.denoise(z_t, h))


def test_tadm_gradients_reach_every_inference_part_but_not_the_anchor_head():
    model = tiny("tadm")
    model.train()
    model(tokens(1), tokens(2)).square().mean().backward()
    parts = {"S": "embed.", "A": "anchor_blocks.", "A_cond": "anchor_cond.", "Phi": "fusion.",
             "D": "denoiser_blocks.", "D_cond": "denoiser_cond.", "head": "final."}
    for part, prefix in parts.items():
        named = [(n, p) for n, p in model.named_parameters() if n.startswith(prefix)]
        assert named, part
        for n, p in named:
            assert p.grad is not None and p.grad.abs().sum() > 0, f"{part}: no gradient on {n}"
    assert all(p.grad is None for p in model.anchor_head.parameters())
    # the anchor loss path does train the head (and the anchor)
    model.zero_grad(set_to_none=True)
    model.anchor_logits(model.anchor(tokens(2))).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.anchor_head.parameters())
    assert model.fusion.gate.weight.grad is None


def test_inference_parameters_exclude_only_the_anchor_head():
    model = TADM(TINY, V, L)
    inference = {id(p) for p in model.inference_parameters()}
    head = {id(p) for p in model.anchor_head.parameters()}
    assert inference.isdisjoint(head)
    assert inference | head == {id(p) for p in model.parameters()}


# --------------------------------------------------------------------------- attention pattern


def _changed_positions(model, x: torch.Tensor, j: int, which: int = 0) -> torch.Tensor:
    """Positions whose logits change when token j of input `which` (TADM: 0 = z_t, 1 = z_t') changes."""
    y = x.clone()
    y[:, j] = (y[:, j] + 1) % V
    if model.model_type == "tadm":
        base, other = model(x, x), (model(y, x) if which == 0 else model(x, y))
    else:
        base, other = run(model, x), run(model, y)
    return (base - other).abs().amax(dim=(0, 2)) > 1e-6


@torch.no_grad()
def test_ar_is_causal():
    model = tiny("ar")
    x = model_input("ar")
    for j in (0, 5, L - 1):
        changed = _changed_positions(model, x, j)
        assert not changed[:j].any(), f"changing token {j} moved logits before it"
        assert changed[j:].all()


@pytest.mark.parametrize("model_type,which", [("mdlm", 0), ("sedd", 0), ("adlm", 0), ("tadm", 0), ("tadm", 1)])
@torch.no_grad()
def test_diffusion_models_are_bidirectional(model_type, which):
    model = tiny(model_type)
    changed = _changed_positions(model, model_input(model_type), L - 1, which)
    assert changed.all(), "a late token must influence every position"


def test_rotary_scores_depend_only_on_relative_position():
    g = torch.Generator().manual_seed(0)
    head_dim, n = 16, 24
    q, k = torch.randn(head_dim, generator=g), torch.randn(head_dim, generator=g)
    cos, sin = rotary_cos_sin(n, head_dim)
    q_rot = apply_rotary(q.expand(n, head_dim), cos, sin)  # the same query at every position
    k_rot = apply_rotary(k.expand(n, head_dim), cos, sin)
    scores = q_rot @ k_rot.T  # scores[m, n] = <R_m q, R_n k>
    for offset in range(-n + 1, n):
        diag = torch.diagonal(scores, offset)
        torch.testing.assert_close(diag, diag[0].expand_as(diag), atol=1e-4, rtol=1e-4)
    assert (scores[0] - scores[0, 0]).abs().max() > 1e-2  # ... and position does matter
    torch.testing.assert_close(scores[0, 0], q @ k)  # no rotation at distance 0
    # rotation preserves norms
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm().expand(n))


@torch.no_grad()
def test_positions_reach_the_output():
    """Without positions a bidirectional Transformer is permutation-equivariant, so every copy of
    token a in [a, b, a, a, ...] would get the same logits; with rotary they differ by distance to b."""
    model = tiny("mdlm")
    x = torch.full((1, L), 7)
    x[0, 1] = 3
    logits = model(x)[0]
    assert (logits[2] - logits[10]).abs().max() > 1e-3


@pytest.mark.parametrize("model_type", TYPES)
def test_determinism_under_manual_seed(model_type):
    def build_and_run():
        torch.manual_seed(123)
        model = build_model(model_type, TINY, V, L)
        return run(model, model_input(model_type)), [p.clone() for p in model.parameters()]

    (out1, p1), (out2, p2) = build_and_run(), build_and_run()
    assert torch.equal(out1, out2) and all(torch.equal(a, b) for a, b in zip(p1, p2))


# --------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("model_type", TYPES)
def test_save_load_round_trip(tmp_path, model_type):
    model = tiny(model_type)
    x = model_input(model_type)
    model.save_pretrained(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config == {"model_type": model_type, "vocab_size": V, "seq_len": L, "format_version": 1,
                      "model": {f: getattr(TINY, f) for f in config["model"]}}
    loaded = load_pretrained(tmp_path / "ckpt")
    assert type(loaded) is type(model) and loaded.cfg == TINY and not loaded.training
    with torch.no_grad():
        assert torch.equal(run(model, x), run(loaded, x))
    for (n, a), (m, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n == m and torch.equal(a, b)


@pytest.mark.parametrize("model_type", TYPES)
def test_model_gelu_picks_the_mlp_activation_and_survives_a_round_trip(tmp_path, model_type):
    """model.gelu: "tanh" (the released DiT) or "exact" -- the same weights give outputs a little
    apart (the two functions differ by < 5e-4), and a checkpoint rebuilds the one it was saved with;
    a checkpoint written before the key existed (no "gelu") is the tanh model it was trained as."""
    import dataclasses

    x = model_input(model_type)
    tanh = tiny(model_type)
    exact = build_model(model_type, dataclasses.replace(TINY, gelu="exact"), V, L).eval()
    exact.load_state_dict(tanh.state_dict())
    def acts(m):  # the DiT blocks' MLPs (TADM's fusion has its own, always exact, GELU)
        return {a.approximate for n, a in m.named_modules() if isinstance(a, torch.nn.GELU) and ".mlp." in n}

    assert acts(exact) == {"none"} and acts(tanh) == {"tanh"}
    with torch.no_grad():
        a, b = run(tanh, x), run(exact, x)
    assert not torch.equal(a, b) and torch.allclose(a, b, atol=5e-2)
    exact.save_pretrained(tmp_path / "exact")
    with torch.no_grad():
        assert torch.equal(run(load_pretrained(tmp_path / "exact"), x), b)
    tanh.save_pretrained(tmp_path / "old")
    config = json.loads((tmp_path / "old" / "config.json").read_text())
    del config["model"]["gelu"]
    (tmp_path / "old" / "config.json").write_text(json.dumps(config))
    with torch.no_grad():
        assert torch.equal(run(load_pretrained(tmp_path / "old"), x), a)


def test_save_overwrites_and_keeps_other_files(tmp_path):
    ckpt = tmp_path / "ckpt"
    tiny("mdlm", seed=0).save_pretrained(ckpt)
    (ckpt / "optimizer.pt").write_bytes(b"trainer state")
    newer = tiny("mdlm", seed=1)
    newer.save_pretrained(ckpt)
    assert (ckpt / "optimizer.pt").read_bytes() == b"trainer state"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left
    x = tokens()
    with torch.no_grad():
        assert torch.equal(load_pretrained(ckpt)(x), newer(x))


def test_interrupted_save_leaves_previous_checkpoint(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    old = tiny("mdlm", seed=0)
    old.save_pretrained(ckpt)
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}

    import safetensors.torch

    def crash(tensors, filename, metadata=None):
        with open(filename, "wb") as f:
            f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        tiny("mdlm", seed=1).save_pretrained(ckpt)
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".")]


def _one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message
    assert isinstance(excinfo.value, (TadmError, DataError))
    return message


def test_loading_another_architecture_names_the_tensors_and_changes_nothing(tmp_path):
    big = ModelConfig(d_model=48, n_heads=2, mlp_ratio=2, mdlm_layers=3, anchor_layers=2, denoiser_layers=1)
    torch.manual_seed(0)
    MDLM(big, V, L).save_pretrained(tmp_path / "big")
    target = tiny("mdlm")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointError) as excinfo:
        target.load_weights(tmp_path / "big")
    message = _one_line_error(excinfo)
    assert "blocks.0.attn.qkv.weight: checkpoint (144, 48) vs model (96, 32)" in message
    assert "+30 more" in message  # many tensors differ; only 5 are listed
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


def test_loading_missing_and_unexpected_tensors_is_refused(tmp_path):
    torch.manual_seed(0)
    MDLM(TINY, V, L).save_pretrained(tmp_path / "mdlm")
    target = tiny("tadm")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointError) as excinfo:
        target.load_weights(tmp_path / "mdlm")
    message = _one_line_error(excinfo)
    assert "a 'mdlm' checkpoint" in message and "does not fit TADM" in message
    assert "missing anchor_cond.mlp.0.weight" in message and "+72 more" in message
    assert "(0 shape, 53 missing, 24 unexpected)" in message
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
    # a checkpoint with one tensor too many is refused as well (strict)
    from safetensors.torch import save_file

    sd = {k: v.contiguous() for k, v in target.state_dict().items()}
    sd["extra.weight"] = torch.zeros(3)
    save_file(sd, str(tmp_path / "extra.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected extra.weight"):
        target.load_weights(tmp_path / "extra.safetensors")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupted_weights_are_refused(tmp_path, damage):
    ckpt = tmp_path / "ckpt"
    tiny("mdlm").save_pretrained(ckpt)
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    if damage == "truncate":
        weights.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        weights.write_bytes(os.urandom(4096))
    else:
        weights.write_bytes(b"")
    with pytest.raises(CheckpointError) as excinfo:
        load_pretrained(ckpt)
    assert "safetensors" in _one_line_error(excinfo)
    target = tiny("mdlm")
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(CheckpointError):
        target.load_weights(ckpt)
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())


def test_bad_checkpoint_directories_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist") as excinfo:
        load_pretrained(tmp_path / "nowhere")
    _one_line_error(excinfo)
    ckpt = tmp_path / "ckpt"
    tiny("mdlm").save_pretrained(ckpt)
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_pretrained(ckpt)
    tiny("mdlm").save_pretrained(ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    for bad, pattern in [
        ("{not json", "not valid JSON"),
        (json.dumps({**config, "model_type": "gpt5"}), "unknown model_type 'gpt5'"),
        (json.dumps({**config, "format_version": 2}), "format_version"),
        (json.dumps({k: v for k, v in config.items() if k != "seq_len"}), "seq_len"),
        (json.dumps({**config, "model": {**config["model"], "depth": 3}}), "unknown model field"),
        (json.dumps({**config, "model": {**config["model"], "n_heads": 3}}), "n_heads"),
        (json.dumps({**config, "model": {**config["model"], "gelu": "relu"}}), "model.gelu must be one of"),
    ]:
        (ckpt / "config.json").write_text(bad)
        with pytest.raises(CheckpointError, match=pattern) as excinfo:
            load_pretrained(ckpt)
        _one_line_error(excinfo)
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json"):
        load_pretrained(ckpt)


def test_config_json_mismatching_weights_is_refused(tmp_path):
    """config.json says one size, the weights are of another: named tensors, no model."""
    ckpt = tmp_path / "ckpt"
    tiny("tadm").save_pretrained(ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config["model"]["d_model"] = 64
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model.d_model = 64 but embed.weight is \(51, 32\)"):
        load_pretrained(ckpt)


# --------------------------------------------------------------------------- paper-size counts


def test_paper_parameter_counts():
    counts = {}
    with torch.device("meta"):
        models = {t: build_model(t, PAPER, 50257, 1024) for t in TYPES}
    for t, m in models.items():
        assert all(p.device.type == "meta" for p in m.parameters())
        counts[t] = count_parameters(m)
    tadm = models["tadm"]
    inference = count_parameters(tadm.inference_parameters())
    head = count_parameters(tadm.anchor_head)
    print(f"\nparameters at paper size: TADM inference {inference:,} ({inference / 1e6:.2f}M), "
          f"anchor head {head:,} ({head / 1e6:.2f}M), TADM total {counts['tadm']:,}; "
          + ", ".join(f"{t.upper()} {n:,} ({n / 1e6:.2f}M)" for t, n in counts.items() if t != "tadm"))
    assert round(inference / 1e6) == 224  # paper: 224M unique inference parameters
    assert round(head / 1e4) / 100 == 38.85  # paper: 38.85M anchor LM head
    assert inference + head == counts["tadm"]
    assert round(counts["mdlm"] / 1e6) == 170 and int(counts["mdlm"] / 1e6) == 169  # MDLM small: ~169M
    assert counts["sedd"] == counts["mdlm"]
    assert counts["ar"] == counts["mdlm"] - 768 - 1 - 768  # no mask row in the embedding or head
    # pieces, from the closed-form arithmetic
    d, n_out = 768, 50258
    block = 12 * d * d + 5 * d + 2 * d + 128 * 6 * d + 6 * d
    assert count_parameters(tadm.anchor_blocks[0]) == block
    assert count_parameters(tadm.final) == d * n_out + n_out + 128 * 2 * d + 2 * d + d
    assert count_parameters(tadm.fusion) == 2 * (2 * d) + (2 * d * d + d) + (2 * d * 4 * d + 4 * d) + (4 * d * d + d)
    assert count_parameters(tadm.anchor_cond) == 256 * 128 + 128 + 128 * 128 + 128
