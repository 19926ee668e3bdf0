"""Evaluator loading: SmolLM2 is dequantized once into a safetensors cache; the paper's
`from_pretrained` path is exercised on a local tiny GPT-2."""

import json

import pytest
import torch

from tadm.errors import DataError
from tadm.metrics import evaluator as ev_mod
from tadm.metrics.evaluator import CACHE_MARKER, load_evaluator
from tests.metrics.conftest import TINY_POSITIONS


def test_first_load_writes_a_complete_cache(smollm2):
    ev, cache, first = smollm2
    print(f"SmolLM2 first load (GGUF -> safetensors cache): {first['seconds']:.1f} s")
    assert first["source"] == "gguf" and ev.name == "smollm2"
    assert [p.name for p in cache.iterdir()] == [ev_mod.smollm2_gguf().stem]  # no temporary left
    target = cache / ev_mod.smollm2_gguf().stem
    for name in ("config.json", "model.safetensors", "tokenizer.json", CACHE_MARKER):
        assert (target / name).is_file(), name
    assert "quantization_config" not in json.loads((target / "config.json").read_text())
    # the document end, not the chat turn end, is the EOS counting stops at
    assert ev.tokenizer.eos_token == "<|endoftext|>" and ev.eos_id == 0
    assert ev.encode("Hello world<|endoftext|>") == [19556, 905, 0]
    assert ev.context_length == 8192


def test_second_load_reads_the_cache_not_the_gguf(smollm2, monkeypatch):
    import time

    import gguf

    ev, cache, _ = smollm2

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF file was read although the cache exists")

    monkeypatch.setattr(gguf, "GGUFReader", no_gguf)
    start = time.perf_counter()
    again = load_evaluator("smollm2", cache_dir=cache)
    print(f"SmolLM2 cached load: {time.perf_counter() - start:.1f} s")
    assert again.source == "cache"
    ids = torch.tensor([ev.encode("Now is the winter of our discontent")])
    with torch.no_grad():
        assert torch.equal(ev.model(ids).logits, again.model(ids).logits)


def test_cache_from_another_gguf_is_not_reused(smollm2, tmp_path):
    _, cache, _ = smollm2
    target = cache / ev_mod.smollm2_gguf().stem
    marker = json.loads((target / CACHE_MARKER).read_text())
    assert ev_mod._cache_is_complete(target, marker)
    assert not ev_mod._cache_is_complete(target, {**marker, "gguf_bytes": 1})
    assert not ev_mod._cache_is_complete(tmp_path, marker)  # a directory without the marker


def test_smollm2_needs_a_cache_dir():
    with pytest.raises(ValueError, match="cache_dir"):
        load_evaluator("smollm2", cache_dir=None)


def test_local_gpt2_goes_through_from_pretrained(tiny_gpt2_dir):
    ev = load_evaluator(str(tiny_gpt2_dir))
    assert ev.source == "local" and ev.eos_id == 50256 and ev.context_length == TINY_POSITIONS
    assert ev.encode("Hello world") == [15496, 995]
    assert load_evaluator(str(tiny_gpt2_dir), dtype=torch.bfloat16).model.dtype == torch.bfloat16


def test_gpt2_large_goes_to_the_hub_and_fails_cleanly_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="evaluator 'gpt2-large'") as err:
        load_evaluator("gpt2-large")
    assert "\n" not in str(err.value)


def test_an_interrupted_cache_write_leaves_no_cache(tiny_gpt2_dir, tmp_path, monkeypatch):
    """The GGUF loaders are replaced by the tiny GPT-2 (same code after them); the first save
    dies half-way: nothing that looks like a cache is left, and the next load builds one."""
    import transformers

    model_cls, tok_cls = transformers.AutoModelForCausalLM, transformers.AutoTokenizer
    monkeypatch.setattr(transformers, "AutoModelForCausalLM", type("M", (), {
        "from_pretrained": staticmethod(lambda *a, **k: model_cls.from_pretrained(str(tiny_gpt2_dir)))}))
    monkeypatch.setattr(transformers, "AutoTokenizer", type("T", (), {
        "from_pretrained": staticmethod(lambda *a, **k: tok_cls.from_pretrained(str(tiny_gpt2_dir)))}))
    real_save = transformers.PreTrainedModel.save_pretrained

    def dying_save(self, directory, **kw):
        real_save(self, directory, **kw)
        raise KeyboardInterrupt  # killed after the weights, before the tokenizer and marker

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", dying_save)
    with pytest.raises(KeyboardInterrupt):
        ev_mod.smollm2_cache(tmp_path)
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", real_save)
    path, built = ev_mod.smollm2_cache(tmp_path)
    assert built and (path / CACHE_MARKER).is_file() and [p.name for p in tmp_path.iterdir()] == [path.name]
    assert ev_mod.smollm2_cache(tmp_path) == (path, False)
