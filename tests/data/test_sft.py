"""The SFT mixture: offline and hub sources, canvases, and the build stage."""

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tadm.config import ROOT, HubSftSource, SftConfig, from_dict, render_profile
from tadm.data import arithmetic, sft
from tadm.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE (vocab ~300), trained here on generated text."""
    corpus = [e["prompt"] + "\n" + e["response"] for e in arithmetic.generate(200, 99, seed=0)]
    corpus += ["def f(x):\n    return x + 1\n", "Let n be the number of strings."] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def offline() -> list[dict]:
    return sft.offline_examples(SftConfig(arithmetic_examples=30), seed=0)


# --------------------------------------------------------------------------- offline


def test_offline_mixture_counts_and_schema(offline):
    sources = [e["source"] for e in offline]
    assert (sources.count("humaneval"), sources.count("champ"), sources.count("arithmetic")) == (164, 270, 30)
    assert len({e["id"] for e in offline}) == len(offline)
    assert offline[0]["id"] == "HumanEval/0" and offline[10]["id"] == "HumanEval/10"
    for e in offline:
        assert {"id", "source", "category", "prompt", "response"} <= set(e)
        assert e["category"] == ("code" if e["source"] == "humaneval" else "math")
        assert e["prompt"].strip() and e["response"].strip()
    champ = [e for e in offline if e["source"] == "champ"]
    assert all(e["response"].splitlines()[-1] == f"#### {e['answer']}" for e in champ)


def test_offline_mixture_deterministic_and_switchable(offline):
    again = sft.offline_examples(SftConfig(arithmetic_examples=30), seed=0)
    assert again == offline
    other_seed = sft.offline_examples(SftConfig(arithmetic_examples=30, humaneval=False, champ=False), seed=1)
    assert [e["source"] for e in other_seed] == ["arithmetic"] * 30
    assert other_seed != [e for e in offline if e["source"] == "arithmetic"]


# --------------------------------------------------------------------------- hub


def write_hub_dataset(directory: Path) -> None:
    """20 usable no-think rows, 10 think rows, 2 no-think rows without an assistant reply."""
    rows = []
    for i in range(20):
        messages = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
        if i % 5 == 0:  # multi-turn with a system prompt
            messages = [{"role": "system", "content": "be brief"}, messages[0],
                        {"role": "assistant", "content": "draft"}, {"role": "user", "content": "again"},
                        {"role": "assistant", "content": f"answer {i}"}]
        rows.append({"messages": messages, "reasoning": "off"})
    for i in range(10):
        rows.append({"messages": [{"role": "user", "content": f"hard {i}"},
                                  {"role": "assistant", "content": f"<think>THINKING</think> {i}"}], "reasoning": "on"})
    for i in range(2):
        rows.append({"messages": [{"role": "user", "content": f"orphan {i}"}], "reasoning": "off"})
    order = np.random.default_rng(0).permutation(len(rows))  # interleave think and no-think rows
    directory.mkdir()
    (directory / "train.jsonl").write_text("".join(json.dumps(rows[j]) + "\n" for j in order))


@pytest.fixture
def hub_dir(tmp_path, monkeypatch) -> Path:
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    write_hub_dataset(tmp_path / "hub")
    return tmp_path / "hub"


def hub_cfg(hub_dir: Path, count: int, **overrides) -> SftConfig:
    src = HubSftSource(name="toy-math", dataset=str(hub_dir), category="math", count=count, **overrides)
    return SftConfig(source="hub", hub_sources=[src])


def test_hub_filters_think_rows(hub_dir):
    examples = sft.hub_examples(hub_cfg(hub_dir, count=20), seed=0)
    assert len(examples) == 20
    assert sorted(e["response"] for e in examples) == sorted(f"answer {i}" for i in range(20))
    assert not any("THINK" in e["response"] or "orphan" in e["prompt"] for e in examples)
    for e in examples:
        assert re.fullmatch(r"toy-math-\d+", e["id"]) and e["source"] == "toy-math" and e["category"] == "math"
    by_answer = {e["response"]: e["prompt"] for e in examples}
    assert by_answer["answer 1"] == "question 1"  # a lone user turn is the prompt verbatim
    assert by_answer["answer 5"] == "System: be brief\n\nUser: question 5\n\nAssistant: draft\n\nUser: again"


def test_hub_selection_deterministic_under_seed(hub_dir):
    first = sft.hub_examples(hub_cfg(hub_dir, count=5), seed=0)
    assert len(first) == 5
    assert sft.hub_examples(hub_cfg(hub_dir, count=5), seed=0) == first
    assert sft.hub_examples(hub_cfg(hub_dir, count=5), seed=1) != first


def test_hub_without_filter_keeps_think_rows(hub_dir):
    examples = sft.hub_examples(hub_cfg(hub_dir, count=30, reasoning_field=None), seed=0)
    assert sum("THINK" in e["response"] for e in examples) == 10


@pytest.mark.parametrize("count", [21, 25])  # 22 rows pass the filter, only 20 have a reply
def test_hub_too_few_rows_raises(hub_dir, count):
    with pytest.raises(DataError, match=re.escape("sft.hub_sources[0].count")):
        sft.hub_examples(hub_cfg(hub_dir, count=count), seed=0)


def test_hub_bad_column_or_dataset_raises(hub_dir, tmp_path):
    with pytest.raises(DataError, match=re.escape("sft.hub_sources[0].messages_field")):
        sft.hub_examples(hub_cfg(hub_dir, count=1, messages_field="conversation"), seed=0)
    with pytest.raises(DataError, match=re.escape("sft.hub_sources[0].reasoning_field")):
        sft.hub_examples(hub_cfg(hub_dir, count=1, reasoning_field="thinking"), seed=0)
    with pytest.raises(DataError, match=re.escape("sft.hub_sources[0].reasoning_field")):
        sft.hub_examples(hub_cfg(hub_dir, count=1, reasoning_field="messages"), seed=0)  # not a flag
    with pytest.raises(DataError, match=re.escape("sft.hub_sources[0].dataset")):
        sft.hub_examples(hub_cfg(tmp_path / "absent", count=1), seed=0)


def _params(seed: int = 0, **sft_changes):
    """Params for sft.build: a params mapping sets every key, so the default profile with its
    sft section spelt out in full (the values these tests have always used: SftConfig's, with
    `sft_changes`) and `seed`."""
    raw = render_profile("default")
    raw["seed"] = seed
    raw["sft"] = {**dataclasses.asdict(SftConfig()), **sft_changes}
    return from_dict(raw)


def test_build_from_hub_sources(hub_dir, tokenizer, tmp_path):
    params = _params(source="hub", validation_fraction=0.25, canvas_length=4, hub_sources=[
        {"name": "toy-math", "dataset": str(hub_dir), "category": "math", "count": 12},
        {"name": "toy-chat", "dataset": str(hub_dir), "category": "instruction", "count": 8},
    ])
    manifest = sft.build(params, tokenizer, tmp_path / "out")
    counts = manifest["counts"]
    assert counts["train"]["examples"] + counts["validation"]["examples"] == 20
    assert sum(counts[s]["by_source"].get("toy-chat", 0) for s in sft.SPLITS) == 8
    assert sum(counts[s]["by_category"].get("math", 0) for s in sft.SPLITS) == 12


# --------------------------------------------------------------------------- canvases


def test_canvases_block_aligned_inside_response(tokenizer, offline):
    cfg = SftConfig(canvas_length=16, canvases_per_example=8, max_prompt_tokens=32, max_response_tokens=96)
    examples = offline[::4]
    arrays = sft.to_canvases(examples, tokenizer, cfg, seed=0)
    off, can = arrays.offsets, arrays.canvases
    assert arrays.tokens.dtype == np.int32 and len(off) == len(examples)
    assert len(can) == 8 * len(examples)
    assert np.array_equal(can["example"], np.repeat(np.arange(len(examples)), 8))
    assert int(off["start"][-1] + off["prompt_len"][-1] + off["response_len"][-1]) == arrays.tokens.size
    assert np.all(off["prompt_len"] <= 32) and np.all((off["response_len"] >= 1) & (off["response_len"] <= 96))
    assert np.all(can["start"] % 16 == 0)
    assert np.all(can["start"] < off["response_len"][can["example"]])
    assert np.all((can["t"] > 0) & (can["t"] < 1))
    # stratified times: the example's i-th canvas falls in stratum [i/8, (i+1)/8]
    strata = np.floor(can["t"].astype(np.float64).reshape(-1, 8) * 8)
    assert np.array_equal(strata, np.tile(np.arange(8), (len(examples), 1)))
    # long responses use more than their first block
    assert len(set(can["start"].tolist())) > 1


def test_canvas_tokens_match_encode_with_truncation(tokenizer, offline):
    cfg = SftConfig(canvas_length=8, canvases_per_example=2, max_prompt_tokens=24, max_response_tokens=40)
    examples = [offline[0], offline[-1]]  # a long HumanEval prompt, a short arithmetic one
    arrays = sft.to_canvases(examples, tokenizer, cfg, seed=0)
    eos = tokenizer.eos_token_id
    # DiffusionGemma's no-think turn: the markers stay, the content keeps its last tokens
    before = tokenizer.encode("<|turn>user\n", add_special_tokens=False)
    after = tokenizer.encode("<turn|>\n<|turn>model\n", add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<turn|>")
    for i, e in enumerate(examples):
        start, p_len, r_len = (int(v) for v in arrays.offsets[i])
        content = tokenizer.encode(e["prompt"].strip(), add_special_tokens=False)
        prompt = before + content[max(0, len(content) - (24 - len(before) - len(after))):] + after
        response = (tokenizer.encode(e["response"], add_special_tokens=False) + [end, eos])[:40]
        assert arrays.tokens[start : start + p_len].tolist() == prompt
        assert arrays.tokens[start + p_len : start + p_len + r_len].tolist() == response
    assert arrays.tokens[int(arrays.offsets[1]["start"]) + int(arrays.offsets[1]["prompt_len"]) +
                         int(arrays.offsets[1]["response_len"]) - 1] == eos  # short response keeps EOS
    assert int(arrays.offsets[0]["prompt_len"]) == 24  # the long prompt is cut to the budget, markers kept
    with pytest.raises(ConfigError, match="sft.max_prompt_tokens: 12 tokens leave no room"):
        sft.to_canvases(examples, tokenizer, SftConfig(canvas_length=8, max_prompt_tokens=12), seed=0)


def test_canvases_deterministic_and_order_independent(tokenizer, offline):
    cfg = SftConfig(canvas_length=8)
    examples = offline[:6]
    a = sft.to_canvases(examples, tokenizer, cfg, seed=3)
    b = sft.to_canvases(examples, tokenizer, cfg, seed=3)
    assert np.array_equal(a.canvases, b.canvases) and np.array_equal(a.tokens, b.tokens)
    assert not np.array_equal(a.canvases["t"], sft.to_canvases(examples, tokenizer, cfg, seed=4).canvases["t"])
    rev = sft.to_canvases(examples[::-1], tokenizer, cfg, seed=3)
    assert np.array_equal(a.canvases[["start", "t"]].reshape(6, -1)[::-1], rev.canvases[["start", "t"]].reshape(6, -1))
    # each example draws its own canvases (not one shared stream replayed per example)
    assert len(set(a.canvases["t"][::8].tolist())) == 6
    empty = sft.to_canvases([], tokenizer, cfg, seed=3)
    assert empty.tokens.size == 0 and empty.canvases.size == 0


def test_empty_response_raises(tokenizer):
    cfg = SftConfig(max_response_tokens=1)
    tok = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)  # no EOS to append
    with pytest.raises(DataError, match="'x-1'"):
        sft.to_canvases([{"id": "x-1", "prompt": "hi", "response": ""}], tok, cfg, seed=0)


# --------------------------------------------------------------------------- build


def test_split_depends_on_id_only(offline):
    forward = sft.split_examples(offline, 0.2)
    backward = sft.split_examples(offline[::-1], 0.2)
    for name in sft.SPLITS:
        assert {e["id"] for e in forward[name]} == {e["id"] for e in backward[name]}
    assert 0.1 < len(forward["validation"]) / len(offline) < 0.3


def test_split_is_the_same_in_every_process():
    """The split hash must not be Python's per-process salted ``hash``."""
    code = ("from tadm.data.sft import is_validation; "
            "print([i for i in range(500) if is_validation(f'arith-{i}', 0.3)])")
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": str(salt)}).stdout
        for salt in (1, 2)
    }
    assert len(outputs) == 1


def test_build_is_reproducible_and_splits_disjoint(tokenizer, tmp_path):
    params = _params(7, arithmetic_examples=40, validation_fraction=0.2, canvas_length=16, max_prompt_tokens=64,
                     max_response_tokens=128)
    first = sft.build(params, tokenizer, tmp_path / "a")
    second = sft.build(params, tokenizer, tmp_path / "b")
    assert first == second
    names = {"manifest.json"} | {f"{s}{suffix}" for s in sft.SPLITS
                                 for suffix in (".jsonl", "_tokens.npy", "_offsets.npy", "_canvases.npy")}
    assert {p.name for p in (tmp_path / "a").iterdir()} == names
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert set(first["sha256"]) == names - {"manifest.json"}

    ids = {s: [json.loads(line)["id"] for line in (tmp_path / "a" / f"{s}.jsonl").read_text().splitlines()]
           for s in sft.SPLITS}
    assert ids["validation"] and not set(ids["train"]) & set(ids["validation"])
    assert len(ids["train"]) + len(ids["validation"]) == 164 + 270 + 40
    counts = first["counts"]
    assert counts["train"]["examples"] == len(ids["train"])
    assert sum(counts[s]["by_source"]["arithmetic"] for s in sft.SPLITS) == 40
    assert first["params"]["arithmetic_examples"] == 40 and first["stage"] == "sft"

    canvases = np.load(tmp_path / "a" / "train_canvases.npy", mmap_mode="r")
    offsets = np.load(tmp_path / "a" / "train_offsets.npy", mmap_mode="r")
    tokens = np.load(tmp_path / "a" / "train_tokens.npy", mmap_mode="r")
    assert len(canvases) == 8 * len(ids["train"]) == counts["train"]["canvases"]
    assert len(offsets) == len(ids["train"]) and tokens.size == counts["train"]["tokens"]

    other_seed = sft.build(_params(8, **dataclasses.asdict(params.sft)), tokenizer, tmp_path / "c")
    assert other_seed["sha256"]["train_canvases.npy"] != first["sha256"]["train_canvases.npy"]
