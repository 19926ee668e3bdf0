"""GPT-2 built offline matches the real one; the corpus BPE is deterministic."""

import pytest

from tadm.config import TokenizerConfig
from tadm.data import tokenizer as tk
from tadm.errors import DataError
from tadm.io import write_jsonl, write_manifest

TEXTS = [
    "Hello world",
    " leading space and  double  spaces\n\nnew lines\t tabs",
    "Unicode: café, naïve, 東京, emoji 🙂 and math ∑ x² ≤ y",
    "code: def f(x):\n    return x ** 2  # comment",
]


@pytest.fixture(scope="module")
def gpt2():
    return tk.build_gpt2()


def test_gpt2_known_ids_vocab_and_eos(gpt2):
    assert gpt2("Hello world", add_special_tokens=False)["input_ids"] == [15496, 995]
    assert len(gpt2) == 50257
    assert gpt2.eos_token_id == 50256 and gpt2.bos_token_id == 50256
    assert gpt2.convert_ids_to_tokens(50256) == "<|endoftext|>"


@pytest.mark.parametrize("text", TEXTS)
def test_gpt2_round_trip_is_exact(gpt2, text):
    assert gpt2.decode(gpt2.encode(text, add_special_tokens=False)) == text


def test_gpt2_saves_as_a_transformers_directory(tmp_path):
    m = tk.build(TokenizerConfig(kind="gpt2"), tmp_path / "corpus-unused", tmp_path / "tok")
    assert m["counts"] == {"vocab_size": 50257, "eos_id": 50256, "bos_id": 50256}
    loaded = tk.load_tokenizer(tmp_path / "tok")
    assert loaded.encode("Hello world", add_special_tokens=False) == [15496, 995]


def _corpus(tmp_path):
    from tadm.data.corpus import shakespeare_documents

    docs = list(shakespeare_documents())[:40]
    write_jsonl(tmp_path / "corpus" / "train.jsonl", ({"text": d} for d in docs))
    write_manifest(tmp_path / "corpus", "corpus", {})
    return tmp_path / "corpus"


def test_bpe_has_the_configured_size_and_is_deterministic(tmp_path):
    corpus_dir = _corpus(tmp_path)
    cfg = TokenizerConfig(kind="bpe", vocab_size=600, min_frequency=2)
    m1 = tk.build(cfg, corpus_dir, tmp_path / "a")
    m2 = tk.build(cfg, corpus_dir, tmp_path / "b")
    assert m1["sha256"] == m2["sha256"]
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    tok = tk.load_tokenizer(tmp_path / "a")
    assert len(tok) == 600 and tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 0
    for text in TEXTS:  # byte-level: any text round-trips, even unseen scripts
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_bpe_without_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="run the corpus stage first"):
        tk.build(TokenizerConfig(kind="bpe", vocab_size=600), tmp_path / "none", tmp_path / "tok")
    assert not (tmp_path / "tok").exists()


def test_a_saved_copy_of_a_loaded_tokenizer_does_not_depend_on_the_offline_setting(tmp_path, monkeypatch):
    import json

    tk.build_gpt2().save_pretrained(str(tmp_path / "tok"))
    saved = {}
    for offline in ("1", "0"):
        monkeypatch.setenv("HF_HUB_OFFLINE", offline)
        tk.load_tokenizer(tmp_path / "tok").save_pretrained(str(tmp_path / offline))
        saved[offline] = json.loads((tmp_path / offline / "tokenizer_config.json").read_text())
    assert saved["1"] == saved["0"] and "local_files_only" not in saved["1"]
