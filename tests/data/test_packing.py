"""MDLM's wrap into memory-mapped shards."""

import numpy as np
import pytest

from tadm.config import PackingConfig
from tadm.data import packing
from tadm.data.tokenizer import build_gpt2
from tadm.io import write_jsonl, write_manifest


def test_wrap_against_the_closed_form():
    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]]
    bos, eos, L = 100, 99, 6
    seqs = list(packing.wrap(docs, L, bos, eos))
    stream = [1, 2, 3, eos, 4, 5, eos, 6, 7, 8, 9, 10, 11, eos]  # 14 tokens -> 3 pieces of 4
    assert len(seqs) == len(stream) // (L - 2)
    for i, s in enumerate(seqs):
        assert s.tolist() == [bos, *stream[i * 4:(i + 1) * 4], eos]


def test_build_writes_shards_that_read_back(tmp_path):
    tok = build_gpt2()
    docs = [f"Document {i}: " + "the quick brown fox jumps over the lazy dog. " * (i + 1) for i in range(30)]
    write_jsonl(tmp_path / "corpus" / "train.jsonl", ({"text": d} for d in docs[:25]))
    write_jsonl(tmp_path / "corpus" / "validation.jsonl", ({"text": d} for d in docs[25:]))
    write_manifest(tmp_path / "corpus", "corpus", {})
    m = packing.build(PackingConfig(seq_len=16, shard_sequences=10), tmp_path / "corpus", tok, tmp_path / "packed")

    expected = []
    for d in docs[:25]:
        expected += tok.encode(d, add_special_tokens=False) + [tok.eos_token_id]
    n = len(expected) // 14
    assert m["counts"]["train"]["sequences"] == n
    assert m["counts"]["train"]["shards"] == -(-n // 10)
    assert m["counts"]["dtype"] == "uint16"

    data = packing.PackedTokens(tmp_path / "packed" / "train")
    assert len(data) == n and data.seq_len == 16
    body = np.concatenate([data[i][1:-1] for i in range(n)])
    assert body.tolist() == expected[: n * 14]
    assert all(data[i][0] == 50256 and data[i][-1] == 50256 for i in range(n))
    assert (data[-1] == data[n - 1]).all()
    with pytest.raises(IndexError):
        data[n]


def test_token_dtype_switches_past_uint16():
    assert packing.token_dtype(65536) == np.uint16
    assert packing.token_dtype(65537) == np.uint32


def test_unigram_entropy_is_the_entropy_of_the_token_counts(tmp_path):
    """Two shards, counts {0: 4, 1: 2, 2: 2} over both: H = -(1/2 ln 1/2 + 2 * 1/4 ln 1/4)."""
    import math

    import numpy as np

    from tadm.data.packing import PackedTokens

    (tmp_path / "train").mkdir()
    np.save(tmp_path / "train" / "shard_00000.npy", np.array([[0, 1], [0, 2]], dtype=np.uint16))
    np.save(tmp_path / "train" / "shard_00001.npy", np.array([[0, 1], [0, 2]], dtype=np.uint16))
    write_manifest(tmp_path, "pack", {"seq_len": 2, "dtype": "uint16", "vocab_size": 3,
                                      "train": {"sequences": 4, "shards": 2}})
    h = PackedTokens(tmp_path / "train").unigram_entropy()
    assert math.isclose(h, -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)), rel_tol=1e-12)
