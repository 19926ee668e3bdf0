"""Bad files from outside end in one line naming the file, not in a
RecursionError, KeyError, TypeError or a RuntimeError from ``load_state_dict``; weights whose
dtype is not the model's are refused before they load."""

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from tadm.errors import DataError, TadmError
from tadm.models import build_model, load_pretrained
from tadm.models.base import CheckpointError
from tests.models.test_models import L, TINY, V

DEEP = "[" * 100_000 + "]" * 100_000


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and message, message
    return message


# --- deeply nested JSON -------------------------------------------------------------------------


def test_a_deeply_nested_corpus_line_is_one_line(tmp_path):
    from tadm.io import read_jsonl

    path = tmp_path / "train.jsonl"
    path.write_text('{"text": "fine"}\n{"text": ' + DEEP + "}\n")
    with pytest.raises(DataError) as e:
        list(read_jsonl(path, ("text",)))
    assert one_line(e).startswith(f"{path}:2: not valid JSON (nested too deeply"), e.value


def _saved(tmp_path: Path, model_type: str = "mdlm") -> Path:
    torch.manual_seed(0)
    build_model(model_type, TINY, V, L).save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_a_deeply_nested_config_json_is_one_line(tmp_path):
    ckpt = _saved(tmp_path)
    (ckpt / "config.json").write_text('{"model_type": "mdlm", "x": ' + DEEP + "}")
    with pytest.raises(CheckpointError) as e:
        load_pretrained(ckpt)
    assert "config.json' is not valid JSON: nested too deeply" in one_line(e)


def _rewrite_header(path: Path, edit) -> None:
    """Rewrite a safetensors file's JSON header through `edit(header) -> header or text`, keeping
    the tensor bytes (the header is re-padded; offsets are relative to the data)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    out = edit(header)
    text = (out if isinstance(out, str) else json.dumps(out)).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_a_deeply_nested_safetensors_header_is_one_line(tmp_path):
    ckpt = _saved(tmp_path)
    _rewrite_header(ckpt / "model.safetensors", lambda h: '{"__metadata__": ' + DEEP[:40_000] + DEEP[-40_000:] + "}")
    with pytest.raises(CheckpointError) as e:
        load_pretrained(ckpt)
    assert "its header is not JSON" in one_line(e)


# --- tokenizer.json, packed manifests ----------------------------------------------------------


def test_a_tokenizer_json_of_the_wrong_shape_is_one_line(tmp_path):
    from tadm.data.tokenizer import build_gpt2, load_tokenizer

    build_gpt2().save_pretrained(str(tmp_path / "tok"))
    (tmp_path / "tok" / "tokenizer.json").write_text('{"model": 1}')
    for name in ("vocab.json", "merges.txt"):  # only tokenizer.json remains to load from
        (tmp_path / "tok" / name).unlink(missing_ok=True)
    with pytest.raises(DataError) as e:
        load_tokenizer(tmp_path / "tok")
    assert one_line(e).startswith(f"cannot load tokenizer {str(tmp_path / 'tok')!r}: "), e.value


@pytest.mark.parametrize("field, value, want", [
    ("dtype", "float32", "counts.dtype must be the name of an integer dtype"),
    ("dtype", [1], "counts.dtype must be the name of an integer dtype"),
    ("seq_len", "abc", "counts.seq_len must be an integer > 0, got \"abc\""),
    ("seq_len", [8], "counts.seq_len must be an integer > 0"),
    ("train", 5, "counts.train must be an object with integer shards and sequences, got 5"),
    ("train", {"shards": "1", "sequences": 2}, "counts.train must be an object"),
])
def test_a_packed_manifest_with_a_field_of_the_wrong_type_is_one_line(tmp_path, field, value, want):
    from tadm.data.packing import PackedTokens
    from tadm.io import write_manifest

    (tmp_path / "train").mkdir()
    np.save(tmp_path / "train" / "shard_00000.npy", np.array([[0, 1], [1, 2]], dtype=np.uint16))
    counts = {"seq_len": 2, "dtype": "uint16", "vocab_size": 3, "train": {"sequences": 2, "shards": 1}}
    write_manifest(tmp_path, "pack", {**counts, field: value})
    with pytest.raises(DataError) as e:
        PackedTokens(tmp_path / "train")
    assert want in one_line(e), e.value


# --- weights of the wrong dtype, shape or names ------------------------------------------------


def test_a_header_relabelled_f32_to_i32_is_refused(tmp_path):
    """Same byte size, so the header is consistent: it used to load as integers (~1e9)."""
    ckpt = _saved(tmp_path)

    def relabel(header):
        header["embed.weight"]["dtype"] = "I32"
        return header

    _rewrite_header(ckpt / "model.safetensors", relabel)
    with pytest.raises(CheckpointError) as e:
        load_pretrained(ckpt)
    assert "embed.weight: checkpoint int32 vs model float32" in one_line(e), e.value


def test_an_fp16_checkpoint_where_fp32_is_expected_is_refused(tmp_path):
    ckpt = _saved(tmp_path)
    from safetensors.torch import load_file

    tensors = load_file(str(ckpt / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}, str(ckpt / "model.safetensors"),
              metadata={"format": "pt", "model_type": "mdlm"})
    with pytest.raises(TadmError) as e:
        load_pretrained(ckpt)
    assert "checkpoint float16 vs model float32" in one_line(e), e.value


@pytest.mark.parametrize("damage", ["shape", "missing", "dtype"])
def test_a_training_checkpoint_whose_tensors_differ_is_refused_in_one_line(tmp_path, damage):
    """The settings fingerprint agrees and every hash verifies (the files were rewritten with
    their hashes): resuming used to raise a RuntimeError from load_state_dict."""
    from tadm import runtime
    from tadm.train import checkpoint as ck
    from tadm.train.trainer import resume_state

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    names = [n for n, _ in model.named_parameters()]
    opt = torch.optim.AdamW(model.parameters())
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    if damage == "shape":
        sd["0.weight"] = torch.zeros(5, 4)
    elif damage == "missing":
        del sd["1.bias"]
    else:
        sd["0.weight"] = sd["0.weight"].double()
    settings = {"run": "x"}
    ck.save(tmp_path, ck.TrainState(2, sd, sd, opt.state_dict(), {"fingerprint": ck.fingerprint(settings)}), names)
    d = runtime.Dist()
    with pytest.raises(ck.CheckpointCorrupt) as e:
        resume_state(tmp_path, names, settings, steps=4, steps_key="steps", restart=False, hint="x", d=d,
                     log=lambda *_: None, expected=model.state_dict())
    message = one_line(e)
    assert message.startswith(f"{tmp_path / 'step_000002'}: model.safetensors: 1 tensor(s) differ from the model"), message
    want = {"shape": "0.weight: checkpoint (5, 4) vs model (3, 4)", "missing": "missing 1.bias",
            "dtype": "0.weight: checkpoint float64 vs model float32"}[damage]
    assert want in message, message


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_manifest_that_is_not_a_regular_file_is_one_line(tmp_path, kind):
    import os

    from tadm.io import read_manifest

    path = tmp_path / "manifest.json"
    if kind == "fifo":  # a plain read would block forever
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")  # links are followed (DVC's symlink cache), the target checked
    with pytest.raises(DataError) as e:
        read_manifest(tmp_path, "pack", "hint")
    assert one_line(e) == f"{path}: not a regular file", e.value
