"""LLaDA written here (tadm.models.llada): the release's tensor layout, loading a tiny random
checkpoint with that layout (single file and sharded), the checks made before anything is built,
the network's properties, and ASRD decoding on it through LladaBackend / LladaRunner."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tadm.models import llada
from tadm.models.base import CheckpointError
from tests.conftest import torch_single_thread

single_thread = pytest.fixture(autouse=True, scope="module", name="single_thread")(torch_single_thread)

# config.json fields of the release that this implementation does not read (kept in the tiny
# config so that a real config.json's extras are known to be accepted)
RELEASE_EXTRAS = {"alibi_bias_max": 8.0, "attention_dropout": 0.0, "attention_layer_norm_with_affine": True,
                  "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig"}, "embedding_dropout": 0.0,
                  "flash_attention": False, "init_cutoff_factor": None, "init_device": "meta", "init_fn": "mitchell",
                  "init_std": 0.02, "mlp_ratio": 4, "multi_query_attention": None, "precision": "amp_bf16",
                  "residual_dropout": 0.0, "transformers_version": "4.46.3", "use_cache": False}
# the released 8B's sizes (its config.json; see the module docstring for the sources)
RELEASE_8B = dict(d_model=4096, n_heads=32, n_kv_heads=32, n_layers=32, mlp_hidden_size=12288, vocab_size=126464,
                  embedding_size=126464, rope_theta=500000.0, rms_norm_eps=1e-5, include_bias=False,
                  weight_tying=False, mask_token_id=126336, max_sequence_length=4096, eos_token_id=126081,
                  pad_token_id=126081)
WORDS = "user assistant the a cat dog sat ran on mat fast slow one two three four five six seven eight nine ten".split()
SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|mdm_mask|>"]
# a Llama-3-style template as LLaDA-Instruct's tokenizer_config.json carries (recalled, for the
# test tokenizer only; the runner always uses the tokenizer's own template)
CHAT_TEMPLATE = ("{% for message in messages %}{% if loop.index0 == 0 %}{{ bos_token }}{% endif %}"
                 "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def tiny_cfg(**changes) -> llada.LladaConfig:
    base = dict(d_model=16, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=24, vocab_size=40, embedding_size=48,
                rope_theta=500000.0, rms_norm_eps=1e-5, include_bias=False, weight_tying=False, mask_token_id=45,
                max_sequence_length=64, eos_token_id=1, pad_token_id=1)
    return llada.LladaConfig(**{**base, **changes})


def tiny_model(cfg: llada.LladaConfig | None = None, seed: int = 0) -> llada.LladaModel:
    torch.manual_seed(seed)
    model = llada.LladaModel(cfg or tiny_cfg())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("ln_f.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.3)
    return model.eval()


def write_release(tmp_path: Path, model: llada.LladaModel, shards: int = 1, **config_changes) -> Path:
    directory = llada.save_llada(model, tmp_path / f"llada{shards}", shards=shards)
    raw = {**json.loads((directory / "config.json").read_text()), **RELEASE_EXTRAS, **config_changes}
    (directory / "config.json").write_text(json.dumps(raw))
    return directory


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


# --------------------------------------------------------------------------- layout


def test_release_layout_on_meta_device():
    """The 8B release's 291 tensors: names and shapes (built on the meta device, nothing allocated)."""
    with torch.device("meta"):
        sd = llada.LladaModel(llada.LladaConfig(**RELEASE_8B)).state_dict()
    assert len(sd) == 32 * 9 + 3
    t = "model.transformer."
    assert sd[t + "wte.weight"].shape == (126464, 4096)
    assert sd[t + "ff_out.weight"].shape == (126464, 4096)
    assert sd[t + "ln_f.weight"].shape == (4096,)
    block = {k[len(t + "blocks.31."):]: tuple(v.shape) for k, v in sd.items() if k.startswith(t + "blocks.31.")}
    assert block == {"attn_norm.weight": (4096,), "ff_norm.weight": (4096,), "q_proj.weight": (4096, 4096),
                     "k_proj.weight": (4096, 4096), "v_proj.weight": (4096, 4096), "attn_out.weight": (4096, 4096),
                     "ff_proj.weight": (12288, 4096), "up_proj.weight": (12288, 4096), "ff_out.weight": (4096, 12288)}
    assert sum(v.numel() for v in sd.values()) == pytest.approx(8.02e9, rel=0.01)


def test_variants_of_the_layout():
    """GQA k/v widths, biases, tied head and block groups name their tensors as the release does."""
    with torch.device("meta"):
        sd = llada.LladaModel(tiny_cfg(include_bias=True, weight_tying=True, block_group_size=2)).state_dict()
    t = "model.transformer."
    assert t + "ff_out.weight" not in sd  # tied: the head is wte
    assert sd[t + "block_groups.0.1.k_proj.weight"].shape == (8, 16)  # 2 kv heads x head dim 4
    assert t + "block_groups.0.0.q_proj.bias" in sd and t + "block_groups.0.0.attn_norm.bias" in sd
    assert not any(".blocks." in k for k in sd)


# --------------------------------------------------------------------------- loading


@pytest.mark.parametrize("shards", [1, 3])
def test_loads_the_release_layout(tmp_path, shards):
    model = tiny_model()
    directory = write_release(tmp_path, model, shards)
    assert (directory / ("model.safetensors" if shards == 1 else "model.safetensors.index.json")).is_file()
    loaded = llada.load_llada(directory)
    assert loaded.cfg == model.cfg
    ids = torch.randint(0, 40, (2, 10))
    torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)
    assert not any(p.requires_grad for p in loaded.parameters())


def test_loads_in_bf16(tmp_path):
    directory = write_release(tmp_path, tiny_model())
    loaded = llada.load_llada(directory, dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert loaded(torch.randint(0, 40, (1, 6))).shape == (1, 6, 48)


def _rewrite(directory: Path, drop: str | None = None, add: str | None = None) -> None:
    tensors = load_file(str(directory / "model.safetensors"))
    if drop:
        del tensors[drop]
    if add:
        tensors[add] = torch.zeros(3)
    save_file(tensors, str(directory / "model.safetensors"))


@pytest.fixture
def no_tensor_read(monkeypatch):
    """Any tensor read (or module materialised) fails the test: the checks must come first."""
    def refuse(*_a, **_k):
        raise AssertionError("tensor data read before the checks refused the checkpoint")
    monkeypatch.setattr(llada, "read_safetensors", refuse)


@pytest.mark.parametrize("change,expected", [
    ({"drop": "model.transformer.blocks.1.up_proj.weight"}, "missing model.transformer.blocks.1.up_proj.weight"),
    ({"add": "model.transformer.blocks.0.o_proj.weight"}, "unexpected model.transformer.blocks.0.o_proj.weight"),
], ids=["missing", "unexpected"])
def test_missing_or_unexpected_tensor_is_one_line(tmp_path, no_tensor_read, change, expected):
    directory = write_release(tmp_path, tiny_model())
    _rewrite(directory, **change)
    with pytest.raises(CheckpointError) as e:
        llada.load_llada(directory)
    assert expected in one_line(e)


@pytest.mark.parametrize("change, expected", [
    ({"n_layers": 3}, "n_layers = 3 but the weights hold 2 (indices 0..1) blocks"),
    ({"d_model": 32, "n_heads": 8}, "d_model = 32 but model.transformer.wte.weight is (48, 16)"),
    ({"embedding_size": 64}, "embedding_size = 64 but model.transformer.wte.weight is (48, 16)"),
    ({"mlp_hidden_size": 32}, "model.transformer.blocks.0.ff_proj.weight: checkpoint (24, 16) vs model (32, 16)"),
    ({"n_kv_heads": 4}, "model.transformer.blocks.0.k_proj.weight: checkpoint (8, 16) vs model (16, 16)"),
    ({"weight_tying": True}, "unexpected model.transformer.ff_out.weight"),
    ({"include_bias": True}, "missing model.transformer.blocks.0.q_proj.bias"),
])
def test_config_disagreeing_with_the_header_is_refused_before_building(tmp_path, no_tensor_read, monkeypatch,
                                                                       change, expected):
    directory = write_release(tmp_path, tiny_model(), **change)
    monkeypatch.setattr(torch.nn.Module, "to_empty", lambda *_a, **_k: pytest.fail("model materialised"))
    with pytest.raises(CheckpointError) as e:
        llada.load_llada(directory)
    text = one_line(e)
    assert expected in text and "config.json" in text


@pytest.mark.parametrize("change, expected", [
    ({"n_layers": 10**6}, "n_layers = 1000000 exceeds the limit"),
    ({"vocab_size": 2**40}, "vocab_size = 1099511627776 exceeds the limit"),
    ({"block_type": "sequential"}, "block_type = 'sequential' is not supported"),
    ({"activation_type": "swiglu"}, "activation_type = 'swiglu' is not supported"),
    ({"rope_theta": -1}, "rope_theta must be a positive number"),
    ({"mask_token_id": 48}, "mask_token_id = 48 is not a row of the embedding"),
    ({"n_kv_heads": 3}, "n_kv_heads = 3 must divide n_heads (4)"),
    ({"mlp_hidden_size": None}, "mlp_hidden_size must be set"),
])
def test_bad_config_is_refused_before_the_header(tmp_path, monkeypatch, change, expected):
    directory = write_release(tmp_path, tiny_model(), **change)
    monkeypatch.setattr(llada.wh, "read_weights", lambda *_a, **_k: pytest.fail("header read"))
    with pytest.raises(CheckpointError) as e:
        llada.load_llada(directory)
    text = one_line(e)
    assert expected in text and "config.json" in text


def test_config_without_required_field(tmp_path):
    directory = write_release(tmp_path, tiny_model())
    raw = json.loads((directory / "config.json").read_text())
    del raw["mask_token_id"], raw["include_bias"]
    (directory / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="lacks include_bias, mask_token_id"):
        llada.read_llada_config(directory)


def test_missing_directory_is_not_a_download(tmp_path):
    from tadm.errors import DataError

    with pytest.raises(DataError, match="no such directory"):
        llada.load_llada(tmp_path / "absent")


# --------------------------------------------------------------------------- the network


def test_forward_shape_and_determinism():
    model = tiny_model()
    ids = torch.randint(0, 40, (3, 9))
    out = model(ids)
    assert out.shape == (3, 9, 48) and out.dtype == torch.float32 and torch.isfinite(out).all()
    torch.testing.assert_close(model(ids), out, rtol=0, atol=0)
    torch.testing.assert_close(model(inputs_embeds=model.embed(ids)), out, rtol=0, atol=0)
    torch.testing.assert_close(tiny_model()(ids), out, rtol=0, atol=0)  # same seed, same weights


def test_bidirectional():
    """A later token changes the logits at an earlier position (no causal mask); a batch row
    does not depend on another."""
    model = tiny_model()
    ids = torch.randint(0, 40, (2, 8))
    changed = ids.clone()
    changed[0, 7] = (ids[0, 7] + 1) % 40
    a, b = model(ids), model(changed)
    assert (a[0, 0] - b[0, 0]).abs().max() > 1e-4
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)


def test_rotary_is_relative():
    """Attention scores after RoPE depend on positions only through their difference."""
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    def score(i: int, j: int) -> torch.Tensor:
        qs = llada.rotary(q.expand(1, 1, 12, 8).contiguous(), 10000.0, True)[0, 0, i]
        ks = llada.rotary(k.expand(1, 1, 12, 8).contiguous(), 10000.0, True)[0, 0, j]
        return qs @ ks
    torch.testing.assert_close(score(5, 2), score(9, 6), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(score(0, 0), (q @ k.transpose(-1, -2)).squeeze(), rtol=1e-5, atol=1e-5)


def test_grouped_query_heads_share_keys():
    """With n_kv_heads < n_heads, duplicating each kv head into a full-head model gives the same
    network (kv head h serves query heads h * n_heads / n_kv_heads ...)."""
    gqa = tiny_model(tiny_cfg(n_kv_heads=2))
    full = llada.LladaModel(tiny_cfg(n_kv_heads=4)).eval()
    sd = gqa.state_dict()
    for name in list(sd):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            sd[name] = sd[name].view(2, 4, 16).repeat_interleave(2, dim=0).reshape(16, 16)
    full.load_state_dict(sd)
    ids = torch.randint(0, 40, (2, 7))
    torch.testing.assert_close(full(ids), gqa(ids), rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- ASRD on LLaDA


@pytest.mark.parametrize("method", ["low-confidence", "asrd", "plain"])
def test_asrd_decodes_with_llada_backend(method):
    from tadm.asrd.backends import LladaBackend
    from tadm.asrd.decode import DecodeSettings, decode

    model = tiny_model()
    backend = LladaBackend(model)
    prompt = torch.randint(0, 40, (2, 6))
    canvas = torch.cat([prompt, torch.full((2, 8), model.mask_id)], dim=1)
    region = torch.zeros(14, dtype=torch.bool)
    region[6:] = True
    settings = DecodeSettings(method=method, steps=4, block_size=4, threshold=0.5 if method == "asrd" else None,
                              guidance=1.0 if method == "asrd" else 0.0, perturbation=1.0 if method == "asrd" else 0.0,
                              capacity=4)
    r = decode(backend, canvas, region, settings)
    assert torch.equal(r.tokens[:, :6], prompt)
    assert not (r.tokens == model.mask_id).any()
    assert r.counters.calls >= 1 and r.counters.layer_calls == r.counters.calls * model.n_layers
    again = decode(LladaBackend(model), canvas, region, settings)
    assert torch.equal(again.tokens, r.tokens)  # deterministic under the seed


def test_llada_backend_is_the_model():
    """One pass = the model on (embedding + delta), the mask token's logit -inf, n_layers layer calls."""
    from tadm.asrd.backends import LladaBackend

    model = tiny_model()
    backend = LladaBackend(model)
    ids = torch.randint(0, 40, (2, 7))
    delta = 0.1 * torch.randn(2, 7, 16)
    out = backend.logits(ids, delta)
    expected = model(inputs_embeds=model.embed(ids) + delta)
    assert torch.isneginf(out[..., model.mask_id]).all()
    keep = torch.arange(48) != model.mask_id
    torch.testing.assert_close(out[..., keep], expected[..., keep], rtol=0, atol=0)
    assert backend.counters.calls == 1 and backend.counters.layer_calls == model.n_layers
    assert torch.equal(backend.fill(ids, ids > 20, None), ids.masked_fill(ids > 20, model.mask_id))


def test_asrd_without_its_mechanisms_is_its_base_on_llada():
    """guidance = perturbation = 0: ASRD makes low-confidence + threshold's passes and tokens."""
    from tadm.asrd.backends import LladaBackend
    from tadm.asrd.decode import DecodeSettings, decode

    model = tiny_model(seed=3)
    canvas = torch.cat([torch.randint(0, 40, (3, 5)), torch.full((3, 8), model.mask_id)], dim=1)
    region = torch.arange(13) >= 5
    base = DecodeSettings(method="low-confidence", steps=8, block_size=4, threshold=0.3)
    a = decode(LladaBackend(model), canvas, region, base)
    b = decode(LladaBackend(model), canvas, region, base.replace(method="asrd", guidance=0.0, perturbation=0.0))
    assert torch.equal(a.tokens, b.tokens) and a.counters.calls == b.counters.calls


def test_llada_backend_refuses_anchor_reuse():
    from tadm.asrd.backends import LladaBackend
    from tadm.errors import ConfigError

    with pytest.raises(ConfigError, match="refresh_every must be 1"):
        LladaBackend(tiny_model(), refresh_every=2)


def tiny_tokenizer(directory: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS[:2] + WORDS + SPECIALS[2:5])}  # < 40 ids: all generatable
    core = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                                  pad_token="<|endoftext|>", additional_special_tokens=SPECIALS[2:5])
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(directory))
    return llada.load_llada_tokenizer(directory)


def test_tokenizer_and_chat_prompt(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    ids = llada.chat_ids(tok, "the cat sat")
    pieces = tok.convert_ids_to_tokens(ids)
    assert pieces[:3] == ["<|startoftext|>", "<|start_header_id|>", "user"]
    assert pieces[-3:] == ["<|start_header_id|>", "assistant", "<|end_header_id|>"]
    assert pieces.count("<|startoftext|>") == 1 and "<|eot_id|>" in pieces


def test_tokenizer_without_chat_template_is_refused(tmp_path):
    from tadm.errors import DataError

    tok = tiny_tokenizer(tmp_path)
    tok.chat_template = None
    tok.save_pretrained(str(tmp_path / "plain"))
    for extra in ("chat_template.jinja",):
        (tmp_path / "plain" / extra).unlink(missing_ok=True)
    with pytest.raises(DataError, match="has no chat template"):
        llada.load_llada_tokenizer(tmp_path / "plain")


def test_runner_on_a_benchmark(tmp_path):
    """LladaRunner: left-padded chat prompts + generated span, every comparison method runs,
    completions stop at EOS / end of turn, scores and counters reach the tally."""
    from tadm import runtime
    from tadm.experiments.asrd.compare import Tally
    from tadm.experiments.asrd.llada import BenchmarkTask, LladaRunner, llada_plan
    from tadm.experiments.asrd.runner import backend_of
    from tadm.config import Params

    p = Params()
    p.asrd.llada_gen_tokens, p.asrd.llada_block_size, p.asrd.llada_steps, p.asrd.llada_batch_size = 8, 4, 4, 2
    p.asrd.capacity = 4
    runner = LladaRunner(p, runtime.Dist(), model=tiny_model(), tokenizer=tiny_tokenizer(tmp_path))
    task = BenchmarkTask("gsm8k", ["the cat sat on the mat", "one two", "dog ran fast"], lambda i, text: i != 1)
    canvas, region, attention = runner.encode(task.prompts[:2])
    assert canvas.shape[1] == region.numel() and int(region.sum()) == 8
    assert (canvas[1, : canvas.shape[1] - 8][:4] == runner.pad).all()  # the shorter prompt is left-padded
    assert torch.equal(attention, canvas != runner.pad)  # no pad token inside these prompts
    assert (canvas[:, region] == runner.model.mask_id).all()
    plan = llada_plan(p, runner=runner, tasks={"gsm8k": task, "humaneval": task})
    assert [name for name, *_ in plan] == ["gsm8k", "humaneval"]
    for variant in plan[0][3]:
        # d²Cache's rows decode over one block, as its release does; every other row in LLaDA's blocks
        assert variant.settings.block_size == (None if variant.settings.certainty_sigma else 4)
        assert variant.settings.steps == 4
        tally = Tally()
        acc = runner.run(backend_of(runner, variant), task, variant.settings, tally)  # the cache rows' caches too
        assert acc == pytest.approx(200 / 3)
        assert tally.batches == 2 and tally.tokens == 3 * 8 and tally.calls > 0
        assert all(isinstance(t, str) for t in tally.examples)
    stop = runner.tok.convert_tokens_to_ids("<|eot_id|>")
    row = torch.tensor([[5, 6, stop, 7]])
    assert runner.completions(row, torch.ones(4, dtype=torch.bool)) == [runner.tok.decode([5, 6])]


def test_default_profile_runs_no_llada():
    from tadm.experiments.asrd.llada import llada_plan
    from tadm.config import Params, render_profile

    assert render_profile("default")["asrd"]["llada_model"] == ""
    assert render_profile("paper")["asrd"]["llada_model"] == llada.RELEASE
    assert render_profile("paper")["asrd"]["llada_tasks"] == ["gsm8k", "humaneval"]
    assert llada_plan(Params()) == []


# --------------------------------------------------------------------------- padded batches


def _padded(model: llada.LladaModel, rows: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad `rows` (1-D id tensors) to the longest: (ids, attention mask 0 at the pads)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


@torch.no_grad()
def test_left_padded_logits_match_each_row_alone():
    """With the padding mask, a left-padded row's logits at its real positions are the row's own
    (unpadded) logits up to rounding -- RoPE is relative and no position attends to a pad --
    while without it (the old behaviour) they are far off."""
    model = tiny_model(seed=1)
    gen = torch.full((4,), model.mask_id)
    rows = [torch.cat([torch.randint(0, 40, (n,), generator=torch.Generator().manual_seed(n)), gen]) for n in (3, 7, 11)]
    ids, mask = _padded(model, rows, pad=1)
    out = model(ids, attention_mask=mask)
    unmasked = model(ids)
    worst = 0.0
    for i, r in enumerate(rows):
        alone = model(r[None])[0]
        real = out[i, ids.shape[1] - len(r):]
        torch.testing.assert_close(real, alone, rtol=1e-5, atol=1e-5)
        worst = max(worst, float((unmasked[i, ids.shape[1] - len(r):] - alone).abs().max()))
    assert worst > 0.1  # the pads do matter when attended
    # what the pads hold is then irrelevant
    other = ids.masked_fill(mask == 0, 7)
    keep = mask.bool()
    torch.testing.assert_close(model(other, attention_mask=mask)[keep], out[keep], rtol=1e-6, atol=1e-6)


def test_mask_without_padding_is_the_unmasked_network():
    """A mask of all ones (bool or integer) or None runs the same computation, bit for bit (the
    batch-size-1 path of the paper profile, and every unpadded call)."""
    model = tiny_model(seed=2)
    ids = torch.randint(0, 40, (2, 9))
    ref = model(ids)
    for mask in (None, torch.ones(2, 9, dtype=torch.bool), torch.ones(2, 9, dtype=torch.long)):
        assert torch.equal(model(ids, attention_mask=mask), ref)
        assert torch.equal(model(inputs_embeds=model.embed(ids), attention_mask=mask), ref)
    from tadm.asrd.backends import LladaBackend

    backend = LladaBackend(model)
    backend.set_padding(torch.ones(2, 9, dtype=torch.bool))
    with_mask = backend.logits(ids)
    backend.set_padding(None)
    assert torch.equal(with_mask, backend.logits(ids))


@pytest.mark.parametrize("mask, expected", [
    (torch.ones(2, 8, dtype=torch.bool), "attention_mask has shape (2, 8), the input is (2, 9)"),
    (torch.ones(2, 9), "attention_mask must be bool or integer 0 / 1, got torch.float32"),
    (torch.full((2, 9), 2), "attention_mask must hold only 0 (pad) and 1 (token)"),
    (torch.tensor([[1] * 9, [0] * 9]), "attention_mask has a row with no 1"),
], ids=["shape", "float", "values", "empty-row"])
def test_bad_attention_mask_is_one_line(mask, expected):
    with pytest.raises(ValueError) as e:
        tiny_model()(torch.randint(0, 40, (2, 9)), attention_mask=mask)
    assert expected in one_line(e)


@pytest.mark.parametrize("threshold", [None, 0.3], ids=["low-confidence", "threshold"])
def test_left_padded_batch_decodes_as_each_prompt_alone(tmp_path, threshold):
    """LladaRunner on prompts of different lengths: a left-padded batch of 3 generates, greedily,
    exactly the tokens each prompt generates alone (batch size 1, nothing padded)."""
    from tadm import runtime
    from tadm.asrd.decode import DecodeSettings
    from tadm.experiments.asrd.llada import BenchmarkTask, LladaRunner
    from tadm.config import Params

    p = Params()
    p.asrd.llada_gen_tokens, p.asrd.llada_batch_size = 8, 3
    model, tok = tiny_model(seed=4), tiny_tokenizer(tmp_path)
    prompts = ["the cat sat on the mat and the dog ran fast", "one two", "dog ran slow on the mat"]
    task = BenchmarkTask("gsm8k", prompts, lambda i, text: True)
    settings = DecodeSettings(method="low-confidence", steps=8, block_size=4, threshold=threshold)
    batched = LladaRunner(p, runtime.Dist(), model=model, tokenizer=tok)
    canvas = batched.encode(prompts)[0]
    assert (canvas[1, :4] == batched.pad).all()  # the batch is padded
    r, texts, _ = batched.decoder(batched.backend(1), task, settings)(0)
    p.asrd.llada_batch_size = 1
    single = LladaRunner(p, runtime.Dist(), model=model, tokenizer=tok)
    decode_one = single.decoder(single.backend(1), task, settings)
    for i in range(len(prompts)):
        alone, alone_texts, _ = decode_one(i)
        assert torch.equal(r.tokens[i, -8:], alone.tokens[0, -8:]), f"prompt {i}"
        assert texts[i] == alone_texts[0]
