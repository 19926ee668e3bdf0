"""Loading a model directory checks config.json against the safetensors header *before* building:
absurd sizes, sizes that disagree with the weights and broken headers are refused in one line,
quickly, with no large allocation; good checkpoints (single-file or sharded) load as before."""

from __future__ import annotations

import json
import struct
import time
import tracemalloc

import pytest
import torch

from tadm import weights_header as wh
from tadm.errors import DataError
from tadm.models import CheckpointError, load_pretrained
from tests.models.test_models import TINY, V, model_input, run, tiny

FAST_S = 2.0  # a refusal reads two small files: well under this
SMALL_PEAK = 16 << 20  # bytes traced during a refusal (the tiny checkpoint itself is < 1 MB)


def _refused(call, error=DataError):
    """Run `call`, expect `error`; return its one-line message, the seconds and the traced peak."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(error) as excinfo:
            call()
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(excinfo.value)
    assert message and "\n" not in message
    assert seconds < FAST_S and peak < SMALL_PEAK, (seconds, peak, message)
    return message


@pytest.fixture
def ckpt(tmp_path):
    model = tiny("tadm")
    model.save_pretrained(tmp_path / "ckpt")
    load_pretrained(tmp_path / "ckpt")  # warm up (torch's first meta-device build imports a lot): time only the check
    return tmp_path / "ckpt", model


def _edit_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if key in config:
            config[key] = value
        else:
            config["model"][key] = value
    path.write_text(json.dumps(config))


# --------------------------------------------------------------------------- absurd sizes


@pytest.mark.parametrize("field,value", [("anchor_layers", 100_000), ("denoiser_layers", 100_000),
                                         ("vocab_size", 10**9), ("d_model", 2**20), ("seq_len", 10**9)])
def test_absurd_config_is_refused_before_building(ckpt, field, value):
    directory, _ = ckpt
    _edit_config(directory, **{field: value})
    message = _refused(lambda: load_pretrained(directory), CheckpointError)
    assert field in message and str(value) in message and "exceeds the limit" in message


@pytest.mark.parametrize("field,value,says", [
    ("vocab_size", 1000, r"vocab_size = 1000 needs embed.weight of 1001 rows, the weights have (51, 32)"),
    ("d_model", 64, "model.d_model = 64 but embed.weight is (51, 32)"),
    ("anchor_layers", 5, "model.anchor_layers = 5 but the weights hold 2 (indices 0..1) anchor_blocks layers"),
    ("denoiser_layers", 1000, "model.denoiser_layers = 1000 but the weights hold 1 (indices 0..0) denoiser_blocks"),
    ("mlp_ratio", 8, "tensor(s) differ from config.json's model: "),
])
def test_config_disagreeing_with_the_header_names_the_field(ckpt, field, value, says):
    directory, _ = ckpt
    _edit_config(directory, **{field: value})
    message = _refused(lambda: load_pretrained(directory), CheckpointError)
    assert says in message and "config.json" in message and "model.safetensors" in message


def test_oversized_or_malformed_config_is_refused(ckpt):
    directory, _ = ckpt
    good = (directory / "config.json").read_text()
    (directory / "config.json").write_text(good[:-2] + " " * wh.MAX_CONFIG_BYTES + "}\n")
    assert "more than the" in _refused(lambda: load_pretrained(directory), CheckpointError)
    (directory / "config.json").write_text("[1, 2]")
    assert "JSON object" in _refused(lambda: load_pretrained(directory), CheckpointError)
    (directory / "config.json").write_text(good.replace('"d_model": 32', '"d_model": "32"'))
    assert "d_model" in _refused(lambda: load_pretrained(directory), CheckpointError)


# --------------------------------------------------------------------------- broken headers


def _header_and_data(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _write(path, header, data):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize("damage,says", [
    ("huge_length", "header length 18446744073709551615 exceeds"),
    ("short", "shorter than the 8-byte header length"),
    ("cut_header", "header length"),
    ("garbage_header", "its header is not JSON"),
    ("truncated_data", "outside or unlike"),
    ("offsets_lie", "outside or unlike"),
    ("bad_dtype", "unknown dtype 'F128'"),
    ("bad_shape", "has shape"),
])
def test_broken_safetensors_header_is_refused(ckpt, damage, says):
    directory, _ = ckpt
    weights = directory / "model.safetensors"
    raw = weights.read_bytes()
    header, data = _header_and_data(weights)
    if damage == "huge_length":
        weights.write_bytes(b"\xff" * 8 + raw[8:])
    elif damage == "short":
        weights.write_bytes(raw[:5])
    elif damage == "cut_header":
        weights.write_bytes(raw[:40])
    elif damage == "garbage_header":
        weights.write_bytes(raw[:8] + b"\x00\x9f" * ((len(raw) - 8) // 2))
    elif damage == "truncated_data":
        weights.write_bytes(raw[: len(raw) - 100])
    else:
        name = "embed.weight"
        if damage == "offsets_lie":
            header[name]["data_offsets"][1] += 4
        elif damage == "bad_dtype":
            header[name]["dtype"] = "F128"
        else:
            header[name]["shape"] = [-1, 32]
        _write(weights, header, data)
    message = _refused(lambda: load_pretrained(directory), CheckpointError)
    assert says in message and "model.safetensors" in message


def test_weights_that_do_not_fit_in_memory_are_refused(ckpt, monkeypatch):
    directory, _ = ckpt
    monkeypatch.setattr(wh, "available_bytes", lambda device=None: 1000)
    assert "GiB is free" in _refused(lambda: load_pretrained(directory), CheckpointError)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("loader", ["load_pretrained", "AutoModel"])
def test_non_finite_weights_are_refused_by_both_loaders(ckpt, bad, loader):
    """A weight file whose tensors hold NaN or infinity (a single value suffices) is refused in one
    line naming the tensor, by `tadm.models.load_pretrained` and through AutoModel alike."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModel

    import tadm  # noqa: F401  (registers the Auto classes)

    directory, _ = ckpt
    tensors = load_file(directory / "model.safetensors")
    name = next(k for k, v in tensors.items() if v.is_floating_point() and v.numel() > 1)
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = bad
    save_file(tensors, directory / "model.safetensors")
    load = load_pretrained if loader == "load_pretrained" else AutoModel.from_pretrained
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' holds 1 non-finite value\(s\)") as e:
        load(directory)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- good checkpoints


def test_untouched_checkpoint_loads_with_identical_outputs(ckpt):
    directory, model = ckpt
    loaded = load_pretrained(directory)
    x = model_input("tadm")
    with torch.no_grad():
        assert torch.equal(run(model, x), run(loaded, x))
    assert loaded.cfg == TINY and loaded.vocab_size == V


def test_sharded_checkpoint_loads_and_a_wrong_index_is_refused(ckpt):
    from safetensors.torch import load_file, save_file

    directory, model = ckpt
    tensors = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, part in shards.items():
        save_file({k: tensors[k] for k in part}, str(directory / shard))
    weight_map = {k: shard for shard, part in shards.items() for k in part}
    index = directory / wh.INDEX_FILE
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = load_pretrained(directory)
    x = model_input("tadm")
    with torch.no_grad():
        assert torch.equal(run(model, x), run(loaded, x))
    index.write_text(json.dumps({"weight_map": {**weight_map, names[0]: "model-00002-of-00002.safetensors"}}))
    assert "is not in its shard" in _refused(lambda: load_pretrained(directory), CheckpointError)
    index.write_text(json.dumps({"weight_map": {**weight_map, names[0]: "../elsewhere.safetensors"}}))
    assert "is not a file name" in _refused(lambda: load_pretrained(directory), CheckpointError)


# --------------------------------------------------------------------------- transformers directories


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("gpt2")
    cfg = GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0,
                     tie_word_embeddings=False)
    GPT2LMHeadModel(cfg).save_pretrained(str(directory), safe_serialization=True)
    return directory


def _hf_edit(src, dst, **changes):
    import shutil

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    target = config.get("text_config", config)
    target.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def test_hf_directory_checks(gpt2_dir, tmp_path):
    header = wh.check_hf_directory(gpt2_dir, "evaluator 'x'")
    assert wh.layer_counts(header.shapes) == {"transformer.h": [0, 1]}
    for i, (changes, says) in enumerate([
        ({"n_layer": 100_000}, "n_layer = 100000 exceeds the limit 1024"),
        ({"vocab_size": 10**9}, "vocab_size = 1000000000 exceeds the limit"),
        ({"n_embd": 32}, "n_embd = 32 but transformer.wte.weight in model.safetensors is (40, 16)"),
        ({"vocab_size": 41}, "vocab_size = 41 but transformer.wte.weight"),
        ({"n_layer": 3}, "n_layer: transformer.h has 3 layers in config.json but 2 (indices 0..1) in the weights"),
        ({"n_layer": None}, "lacks num_hidden_layers / n_layer / num_layers"),
    ]):
        bad = _hf_edit(gpt2_dir, tmp_path / f"bad{i}", **changes)
        message = _refused(lambda: wh.check_hf_directory(bad, "evaluator 'x'"))
        assert says in message and "evaluator 'x'" in message, message


def test_load_evaluator_refuses_a_bad_local_directory_before_building(gpt2_dir, tmp_path, monkeypatch):
    import transformers

    from tadm.metrics.evaluator import load_evaluator
    from tadm.metrics.features import load_featurizer

    def never(*args, **kwargs):
        raise AssertionError("from_pretrained reached")

    bad = _hf_edit(gpt2_dir, tmp_path / "bad", n_layer=100_000)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", never)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", never)
    assert "n_layer = 100000" in _refused(lambda: load_evaluator(str(bad)))
    assert "n_layer = 100000" in _refused(lambda: load_featurizer(str(bad)))
    _hf_edit(gpt2_dir, tmp_path / "garbage")
    (tmp_path / "garbage" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    assert "header is not JSON" in _refused(lambda: load_evaluator(str(tmp_path / "garbage")))


def test_diffusion_gemma_directory_checks(tmp_path):
    from transformers import DiffusionGemmaForBlockDiffusion

    from tadm.posttrain.model import load_base
    from tests.posttrain.conftest import tiny_config

    torch.manual_seed(0)
    base = DiffusionGemmaForBlockDiffusion(tiny_config()).eval()
    base.save_pretrained(str(tmp_path / "base"))
    header = wh.check_hf_directory(tmp_path / "base", "posttrain base")
    assert set(wh.layer_counts(header.shapes)) == {"model.decoder.layers", "model.encoder.language_model.layers"}
    loaded = load_base(tmp_path / "base")
    assert all(torch.equal(a, b) for a, b in zip(base.state_dict().values(), loaded.state_dict().values()))
    for i, (changes, says) in enumerate([({"num_hidden_layers": 100_000}, "num_hidden_layers = 100000 exceeds"),
                                         ({"num_experts": 10**6}, "num_experts = 1000000 exceeds"),
                                         ({"hidden_size": 48}, "hidden_size = 48 but model.decoder.embed_tokens")]):
        bad = _hf_edit(tmp_path / "base", tmp_path / f"bad{i}", **changes)
        assert says in _refused(lambda: load_base(bad))
