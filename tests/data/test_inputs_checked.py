"""Inputs are checked before use: JSON lines line by line, packed shards and
SFT arrays against the manifest of the stage that wrote them. Each bad input is refused in
one line naming the file (and line), through the real loader and through the CLI."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tadm import config
from tadm.data import packing, sft
from tadm.data.packing import PackedTokens
from tadm.errors import DataError, TadmError
from tadm.io import load_jsonl, read_jsonl, sha256_file, write_manifest
from tests.conftest import build_micro_data, micro_raw, write_params

# --------------------------------------------------------------------------- JSON lines


def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and isinstance(e.value, TadmError), msg
    return msg


@pytest.mark.parametrize("text, schema, line, what", [
    ('{"text": "a"}\n{"text": "b"\n', {"text": str}, 2, "not valid JSON"),
    ('{"text": "a"}\n\n[1, 2]\n', {"text": str}, 3, "expected a JSON object, got list"),
    ('{"text": "a"}\n{"txt": "b"}\n', {"text": str}, 2, "missing field(s) 'text'"),
    ('{"text": 3}\n', {"text": str}, 1, "field 'text' must be a string, got int"),
    ('{"n": true}\n', {"n": int}, 1, "field 'n' must be an integer, got bool"),
    (b'{"text": "a"}\n{"text": "\xff"}\n', {"text": str}, 2, "not UTF-8 text"),
])
def test_a_malformed_jsonl_line_names_file_and_line(tmp_path, text, schema, line, what):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DataError) as e:
        list(read_jsonl(path, schema))
    assert _one_line(e).startswith(f"{path}:{line}: {what}")
    with pytest.raises(DataError, match=re.escape(f"{path}:{line}:")):
        load_jsonl(path, schema)


def test_well_formed_rows_read_back_and_float_takes_ints(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"x": 1, "y": "a"}\n\n{"x": 2.5, "y": "b"}\n')
    assert [r["x"] for r in read_jsonl(path, {"x": float, "y": str})] == [1, 2.5]
    with pytest.raises(DataError, match="file not found"):
        list(read_jsonl(tmp_path / "nope.jsonl"))


def test_a_malformed_corpus_line_stops_the_pack_stage(tmp_path):
    from tadm.config import PackingConfig
    from tadm.data.tokenizer import build_gpt2

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.jsonl").write_text('{"text": "hello world"}\n{"text": 7}\n')
    (corpus / "validation.jsonl").write_text('{"text": "hello world"}\n')
    write_manifest(corpus, "corpus", {})
    with pytest.raises(DataError) as e:
        packing.build(PackingConfig(seq_len=8, shard_sequences=4), corpus, build_gpt2(), tmp_path / "packed")
    assert _one_line(e).startswith(f"{corpus / 'train.jsonl'}:2: field 'text' must be a string")
    (corpus / "train.jsonl").write_text('{"text": "hello there"}\n')  # changed after the corpus stage
    with pytest.raises(DataError, match=re.escape(f"{corpus / 'train.jsonl'}: sha256 differs from manifest.json")):
        packing.build(PackingConfig(seq_len=8, shard_sequences=4), corpus, build_gpt2(), tmp_path / "packed")


# --------------------------------------------------------------------------- packed shards


def _manifest(packed: Path) -> dict:
    return json.loads((packed / "manifest.json").read_text())


def _rewrite_manifest(packed: Path, m: dict) -> None:
    (packed / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def _rehash(packed: Path, name: str) -> None:
    """As if the pack stage itself had written the shard (the manifest agrees with the file)."""
    m = _manifest(packed)
    m["sha256"][name] = sha256_file(packed / name)
    _rewrite_manifest(packed, m)


def _set_token(packed: Path, name: str, value: int) -> None:
    a = np.load(packed / name)
    a[0, 5] = value
    np.save(packed / name, a)


def edited(p: Path) -> str:
    _set_token(p, "train/shard_00000.npy", 3)
    return "train/shard_00000.npy: sha256 differs from manifest.json (file changed since the pack stage wrote it)"


def truncated(p: Path) -> str:
    f = p / "train/shard_00000.npy"
    f.write_bytes(f.read_bytes()[:-100])
    return "train/shard_00000.npy: cut short"


def deleted(p: Path) -> str:
    (p / "train/shard_00000.npy").unlink()
    return "train/shard_00000.npy: missing (listed in"


def extra(p: Path) -> str:
    shutil.copy(p / "train/shard_00000.npy", p / "train/shard_09999.npy")
    return "train/shard_09999.npy: not listed in"


def mask_id(p: Path) -> str:
    vocab = _manifest(p)["counts"]["vocab_size"]
    _set_token(p, "validation/shard_00000.npy", vocab)
    _rehash(p, "validation/shard_00000.npy")
    return f"validation/shard_00000.npy: holds the mask id {vocab} (ids must lie in [0, vocab_size = {vocab}))"


def above_vocab(p: Path) -> str:
    vocab = _manifest(p)["counts"]["vocab_size"]
    _set_token(p, "train/shard_00000.npy", vocab + 7)
    _rehash(p, "train/shard_00000.npy")
    return f"train/shard_00000.npy: holds token id {vocab + 7}, above the vocabulary"


def wrong_seq_len(p: Path) -> str:
    m = _manifest(p)
    m["counts"]["seq_len"] += 1
    _rewrite_manifest(p, m)
    return f"train/shard_00000.npy: shape (4, {m['counts']['seq_len'] - 1}), manifest.json says (n, seq_len = {m['counts']['seq_len']})"


def wrong_count(p: Path) -> str:
    m = _manifest(p)
    m["counts"]["train"]["sequences"] += 1
    _rewrite_manifest(p, m)
    return "train: "


def no_manifest(p: Path) -> str:
    (p / "manifest.json").unlink()
    return "manifest.json: missing; rerun dvc repro pack"


BAD = [edited, truncated, deleted, extra, mask_id, above_vocab, wrong_seq_len, wrong_count, no_manifest]


@pytest.fixture(scope="module")
def small_packed(tmp_path_factory) -> Path:
    """A packed dir with several small shards (shard_sequences 4) and a tokenizer beside it."""
    root = tmp_path_factory.mktemp("small_packed")
    build_micro_data(root, shard_sequences=4)
    return root


@pytest.fixture
def packed_copy(small_packed, tmp_path) -> Path:
    shutil.copytree(small_packed, tmp_path / "data")
    return tmp_path / "data" / "packed"


def test_untouched_data_loads(packed_copy):
    for split in packing.SPLITS:
        data = PackedTokens(packed_copy / split)
        assert len(data) == _manifest(packed_copy)["counts"][split]["sequences"] > 0


@pytest.mark.parametrize("damage", BAD, ids=[f.__name__ for f in BAD])
def test_bad_packed_data_is_refused_in_one_line(packed_copy, damage):
    want = damage(packed_copy)
    with pytest.raises(DataError) as e:
        PackedTokens(packed_copy / "train")
        PackedTokens(packed_copy / "validation")
    msg = _one_line(e)
    assert want in msg and msg.startswith(str(packed_copy)), msg
    assert "dvc repro pack" in msg


def test_a_manifest_vocab_other_than_the_tokenizers_is_refused(packed_copy):
    m = _manifest(packed_copy)
    m["counts"]["vocab_size"] += 1
    _rewrite_manifest(packed_copy, m)
    with pytest.raises(DataError, match="packed with vocab_size .* but the tokenizer .* has"):
        PackedTokens(packed_copy / "train")


def test_each_shard_is_read_once_per_process(packed_copy, monkeypatch):
    """The first open hashes and scans each shard in one streaming pass; later opens of the
    unchanged files (the trainer's, the evaluator's) reuse that scan."""
    import hashlib

    hashed = []
    real = hashlib.sha256
    monkeypatch.setattr(packing.hashlib, "sha256", lambda *a: hashed.append(1) or real(*a))
    PackedTokens(packed_copy / "train")
    assert len(hashed) == _manifest(packed_copy)["counts"]["train"]["shards"]
    PackedTokens(packed_copy / "train")
    assert len(hashed) == _manifest(packed_copy)["counts"]["train"]["shards"]


def _cli_train(data: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    params = write_params(tmp_path / "params.yaml", micro_raw(**{"train.steps": 1}))
    env = {**os.environ, "PYTHONPATH": str(config.ROOT)}
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, "-m", "tadm", "--params", str(params), "train", "mdlm", "--data", str(data)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("damage", [edited, deleted, mask_id], ids=["edited", "deleted", "mask_id"])
def test_cli_train_refuses_bad_data_with_one_error_line(packed_copy, tmp_path, damage):
    want = damage(packed_copy)
    r = _cli_train(packed_copy, tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], lines
    assert not (tmp_path / "checkpoints").exists()


# --------------------------------------------------------------------------- SFT / ASRD data


@pytest.fixture(scope="module")
def small_sft(tmp_path_factory):
    from tests.data.test_sft import _params

    from tadm.data.tokenizer import build_gpt2

    out = tmp_path_factory.mktemp("small_sft") / "sft"
    sft.build(_params(arithmetic_examples=40, champ=False, humaneval=False, canvas_length=4,
                      validation_fraction=0.3), build_gpt2(), out)
    return out


@pytest.fixture
def sft_copy(small_sft, tmp_path) -> Path:
    shutil.copytree(small_sft, tmp_path / "sft")
    return tmp_path / "sft"


def test_sft_data_loads_untouched(sft_copy):
    from tadm.asrd.tasks import arithmetic_sets
    from tadm.posttrain.data import SftCanvases, arithmetic_eval_set

    data = SftCanvases(sft_copy, "train", 4, 16, 0)
    assert len(data) == _manifest(sft_copy)["counts"]["train"]["canvases"]
    assert arithmetic_eval_set(sft_copy) and arithmetic_sets(sft_copy)[0].prompts


def _sft_tokens(d: Path, value: int) -> str:
    a = np.load(d / "train_tokens.npy")
    a[3] = value
    np.save(d / "train_tokens.npy", a)
    _rehash(d, "train_tokens.npy")
    return "train_tokens.npy: holds"


def sft_edited(d: Path) -> str:
    with open(d / "train_canvases.npy", "r+b") as f:
        f.seek(-1, 2)
        f.write(b"\x01" if f.read(1) != b"\x01" else b"\x02")
    return "train_canvases.npy: sha256 differs from manifest.json"


def sft_deleted(d: Path) -> str:
    (d / "train_offsets.npy").unlink()
    return "train_offsets.npy: missing"


def sft_mask(d: Path) -> str:
    return _sft_tokens(d, _manifest(d)["counts"]["vocab_size"]) + " the mask id"


def sft_above(d: Path) -> str:
    return _sft_tokens(d, _manifest(d)["counts"]["vocab_size"] + 3)


def sft_jsonl_line(d: Path) -> str:
    lines = (d / "train.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace('"prompt"', '"prompts"')
    (d / "train.jsonl").write_text("".join(lines))
    _rehash(d, "train.jsonl")
    return "train.jsonl:2: missing field(s) 'prompt'"


def sft_jsonl_edited(d: Path) -> str:
    with open(d / "train.jsonl", "a") as f:
        f.write('{"id": "x"}\n')
    return "train.jsonl: sha256 differs from manifest.json"


def _sft_field(d: Path, kind: str, field: str, value, row: int = 0) -> None:
    """Set one field of one row of a structured SFT array, the manifest's hash kept consistent
    (an attack: the arrays agree with the manifest and index outside)."""
    a = np.load(d / f"train_{kind}.npy")
    a[field][row] = value
    np.save(d / f"train_{kind}.npy", a)
    _rehash(d, f"train_{kind}.npy")


def sft_canvas_start_beyond(d: Path) -> str:
    _sft_field(d, "canvases", "start", 10**6)
    return "train_canvases.npy: canvas 0 starts at 1000000, outside the response of example"


def sft_canvas_start_negative(d: Path) -> str:
    _sft_field(d, "canvases", "start", -4)
    return "train_canvases.npy: canvas 0 starts at -4, outside the response"


def sft_prompt_negative(d: Path) -> str:
    _sft_field(d, "offsets", "prompt_len", -3)
    return "train_offsets.npy: example 0: prompt_len must be >= 0"


def sft_response_empty(d: Path) -> str:
    _sft_field(d, "offsets", "response_len", 0)
    return "train_offsets.npy: example 0: response_len must be >= 1"


def sft_canvas_time(d: Path) -> str:
    _sft_field(d, "canvases", "t", 1.5)
    return "train_canvases.npy: canvas 0 has t = 1.5, outside (0, 1)"


@pytest.mark.parametrize("damage, reader", [
    (sft_edited, "canvases"), (sft_deleted, "canvases"), (sft_mask, "canvases"), (sft_above, "canvases"),
    (sft_jsonl_line, "asrd"), (sft_jsonl_edited, "asrd"),
    (sft_canvas_start_beyond, "canvases"), (sft_canvas_start_negative, "canvases"), (sft_prompt_negative, "canvases"),
    (sft_response_empty, "canvases"), (sft_canvas_time, "canvases"),
], ids=["edited", "deleted", "mask_id", "above_vocab", "jsonl_line", "jsonl_edited", "canvas_start_beyond",
        "canvas_start_negative", "prompt_negative", "response_empty", "canvas_t"])
def test_bad_sft_data_is_refused_in_one_line(sft_copy, damage, reader):
    from tadm.asrd.tasks import arithmetic_sets
    from tadm.posttrain.data import SftCanvases

    want = damage(sft_copy)
    with pytest.raises(DataError) as e:
        if reader == "canvases":
            SftCanvases(sft_copy, "train", 4, 16, 0)
        else:
            arithmetic_sets(sft_copy)
    msg = _one_line(e)
    assert msg.startswith(str(sft_copy)) and want in msg and "dvc repro sft" in msg, msg


def test_a_negative_id_in_signed_shards_is_refused(tmp_path):
    (tmp_path / "train").mkdir()
    np.save(tmp_path / "train" / "shard_00000.npy", np.array([[0, 1], [-1, 2]], dtype=np.int32))
    write_manifest(tmp_path, "pack", {"seq_len": 2, "dtype": "int32", "vocab_size": 3,
                                      "train": {"sequences": 2, "shards": 1}})
    with pytest.raises(DataError, match=re.escape("shard_00000.npy: holds token id -1 (ids must lie in [0, vocab_size = 3))")):
        PackedTokens(tmp_path / "train")
