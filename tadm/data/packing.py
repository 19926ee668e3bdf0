"""MDLM's wrap: documents -> fixed-length token sequences in memory-mapped shards.

Each document is tokenized without special tokens and followed by EOS; the token stream is
cut into pieces of L-2 tokens and each piece is wrapped as BOS ... EOS, so every sequence
has exactly L tokens. The final partial piece is dropped. Sequences are stored as ``.npy``
shards of shape (n, L) (uint16 when the vocabulary fits, else uint32) that
:class:`PackedTokens` opens with ``mmap_mode="r"``.
"""

from __future__ import annotations

import dataclasses
import json
import hashlib
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from tqdm import tqdm

from tadm.config import PackingConfig
from tadm.errors import DataError
from tadm.io import CHUNK, atomic_path, check_jsonl_input, file_identity, read_jsonl, read_manifest, write_manifest

SPLITS = ("train", "validation")
PACK_HINT = "rerun dvc repro pack"
CORPUS_HINT = "rerun dvc repro corpus"
TOKENIZE_BATCH = 256


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def _batches(it: Iterable, n: int) -> Iterator[list]:
    it = iter(it)
    while batch := list(islice(it, n)):
        yield batch


def wrap(docs: Iterable[list[int]], seq_len: int, bos: int, eos: int) -> Iterator[np.ndarray]:
    """Yield (seq_len,) int64 arrays: BOS + next L-2 stream tokens + EOS (MDLM wrap)."""
    body = seq_len - 2
    buf: list[int] = []
    for ids in docs:
        buf.extend(ids)
        buf.append(eos)
        while len(buf) >= body:
            piece, buf = buf[:body], buf[body:]
            yield np.asarray([bos, *piece, eos], dtype=np.int64)


def tokenize_docs(texts: Iterable[str], tokenizer) -> Iterator[list[int]]:
    for batch in _batches(texts, TOKENIZE_BATCH):
        yield from tokenizer(batch, add_special_tokens=False)["input_ids"]


# what write_shards writes into a split's folder: a rerun replaces a folder holding only these
# (tadm.io.atomic_path), and refuses one holding anything else
SHARD_FILES = ("shard_*.npy",)


def write_shards(seqs: Iterable[np.ndarray], out_dir: Path, seq_len: int, shard_sequences: int,
                 dtype: np.dtype) -> dict:
    """Write sequences into ``shard_00000.npy``... under out_dir (atomically, as a whole)."""
    n_seq, shards = 0, []
    with atomic_path(out_dir, "dir", ours=SHARD_FILES) as tmp:
        tmp.mkdir()
        for batch in _batches(seqs, shard_sequences):
            name = f"shard_{len(shards):05d}.npy"
            np.save(tmp / name, np.stack(batch).astype(dtype), allow_pickle=False)
            shards.append(name)
            n_seq += len(batch)
    return {"sequences": n_seq, "tokens": n_seq * seq_len, "shards": len(shards)}


def write_random(out_dir: str | Path, vocab: int, seq_len: int, sizes: dict[str, int], seed: int = 0) -> Path:
    """Random token sequences in the pack stage's layout (shards + a manifest that verifies),
    ids in [0, vocab - 1), BOS = EOS = vocab - 1: synthetic data for benchmarks and tests."""
    out_dir, rng, dtype = Path(out_dir), np.random.default_rng(seed), token_dtype(vocab)
    counts = {split: write_shards(iter(rng.integers(0, vocab - 1, (n, seq_len))), out_dir / split, seq_len, max(n, 1),
                                  dtype) for split, n in sizes.items()}
    counts.update(seq_len=seq_len, dtype=np.dtype(dtype).name, vocab_size=vocab, bos_id=vocab - 1, eos_id=vocab - 1)
    write_manifest(out_dir, "pack", counts, {"seq_len": seq_len, "synthetic": True})
    return out_dir


def build(cfg: PackingConfig, corpus_dir: str | Path, tokenizer, out_dir: str | Path) -> dict:
    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    if bos is None or eos is None:
        raise DataError("tokenizer has no BOS/EOS token: packing needs both (MDLM wrap)")
    dtype = token_dtype(len(tokenizer))
    counts = {}
    for split in SPLITS:
        src = corpus_dir / f"{split}.jsonl"
        if not src.is_file():
            raise DataError(f"corpus file {src} is missing: run the corpus stage first")
        check_jsonl_input(src, "corpus", CORPUS_HINT)
        texts = (row["text"] for row in tqdm(read_jsonl(src, {"text": str}, CORPUS_HINT), desc=f"pack[{split}]", unit="doc"))
        seqs = wrap(tokenize_docs(texts, tokenizer), cfg.seq_len, bos, eos)
        counts[split] = write_shards(seqs, out_dir / split, cfg.seq_len, cfg.shard_sequences, dtype)
        if counts[split]["sequences"] == 0:
            raise DataError(f"{src}: too little text for one sequence of packing.seq_len = {cfg.seq_len}")
    counts.update(seq_len=cfg.seq_len, dtype=dtype.name, vocab_size=len(tokenizer), bos_id=bos, eos_id=eos)
    return write_manifest(out_dir, "pack", counts, dataclasses.asdict(cfg))


@dataclasses.dataclass(frozen=True)
class _ShardScan:
    sha256: str
    dtype: np.dtype
    shape: tuple
    max_id: int
    min_id: int


_SCANS: dict[tuple, _ShardScan] = {}  # file identity -> scan: each shard read once per process


def _scan_shard(path: Path) -> _ShardScan:
    """One streaming pass over a ``.npy`` shard: its SHA-256 and, from the same bytes, its
    header (dtype, shape) and largest token id. Raises DataError on a damaged file."""
    key = file_identity(path)
    if key in _SCANS:
        return _SCANS[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        try:
            version = np.lib.format.read_magic(f)
            read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _fortran, dtype = read_header(f)
        except (ValueError, OSError, SyntaxError) as e:
            raise DataError(f"{path}: not a .npy array ({str(e).splitlines()[0] if str(e) else 'bad header'}); {PACK_HINT}") from None
        offset = f.tell()
        if dtype.hasobject or dtype.kind not in "ui":
            raise DataError(f"{path}: holds {dtype} values, not token ids; {PACK_HINT}")
        want = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        size = path.stat().st_size
        if size != want:
            what = "cut short" if size < want else "longer than its header says"
            raise DataError(f"{path}: {what}: {size} bytes, its header {shape} {dtype} needs {want}; {PACK_HINT}")
        f.seek(0)
        h.update(f.read(offset))
        top, bottom = -1, 0
        while block := f.read(CHUNK - CHUNK % dtype.itemsize):
            h.update(block)
            ids = np.frombuffer(block, dtype=dtype)
            top = max(top, int(ids.max()))
            if dtype.kind == "i":  # signed ids could be negative
                bottom = min(bottom, int(ids.min()))
    _SCANS[key] = _ShardScan(h.hexdigest(), dtype, tuple(shape), top, bottom)
    return _SCANS[key]


def _count(counts: dict, key: str, where: Path, kind: str):
    """counts[`key`], checked to be of `kind`: "positive" (an int > 0), "dtype" (the name of an
    integer numpy dtype) or "split" (an object whose shards and sequences are ints >= 0); one
    DataError line naming the field otherwise."""
    if key not in counts:
        raise DataError(f"{where}: counts has no {key!r}; {PACK_HINT}")
    value = counts[key]

    def count(v, low):
        return isinstance(v, int) and not isinstance(v, bool) and v >= low

    if kind == "positive":
        ok, want = count(value, 1), "an integer > 0"
    elif kind == "dtype":
        try:
            ok = isinstance(value, str) and np.dtype(value).kind in "ui"
        except TypeError:
            ok = False
        want = "the name of an integer dtype (e.g. \"uint16\")"
    else:
        ok = isinstance(value, dict) and all(count(value.get(k), 0) for k in ("shards", "sequences"))
        want = "an object with integer shards and sequences"
    if not ok:
        raise DataError(f"{where}: counts.{key} must be {want}, got {json.dumps(value)[:80]}; {PACK_HINT}")
    return value


def check_tokenizer_vocab(data_dir: Path, vocab_size: int) -> None:
    """The pack manifest's vocab_size is the tokenizer's, when the tokenizer stage's manifest
    sits beside the packed data (``data/tokenizer``)."""
    tok = data_dir.parent / "tokenizer" / "manifest.json"
    if tok.is_file():
        theirs = read_manifest(tok.parent, "tokenizer", "rerun dvc repro tokenizer")["counts"].get("vocab_size")
        if theirs != vocab_size:
            raise DataError(f"{data_dir / 'manifest.json'}: packed with vocab_size {vocab_size}, but the tokenizer "
                            f"{tok.parent} has {theirs}; {PACK_HINT}")


def verify_split(split_dir: str | Path) -> tuple[list[Path], dict]:
    """Check one packed split against the pack stage's manifest (``<split_dir>/../manifest.json``).

    Every shard the manifest lists exists, no other file sits in the split, each shard's
    SHA-256, dtype, shape (n, seq_len) and row total match the manifest, and every token id
    lies in [0, vocab_size) -- the mask id (= vocab_size) and anything above are refused.
    One streaming read per shard per process. Returns (shard paths, manifest counts).
    """
    split_dir = Path(split_dir)
    data_dir, split = split_dir.parent, split_dir.name
    m = read_manifest(data_dir, "pack", PACK_HINT)
    where = data_dir / "manifest.json"
    counts = m["counts"]
    seq_len, vocab = _count(counts, "seq_len", where, "positive"), _count(counts, "vocab_size", where, "positive")
    dtype = np.dtype(_count(counts, "dtype", where, "dtype"))
    check_tokenizer_vocab(data_dir, vocab)
    c = _count(counts, split, where, "split")
    listed = sorted(name for name in m["sha256"] if name.startswith(f"{split}/"))
    if not listed or len(listed) != c.get("shards"):
        raise DataError(f"{where}: lists {len(listed)} {split} shards, its counts say {c.get('shards')}; {PACK_HINT}")
    if not split_dir.is_dir():
        raise DataError(f"{split_dir}: missing (the pack manifest lists {len(listed)} shards); {PACK_HINT}")
    on_disk = {f"{split}/{f.name}" for f in split_dir.iterdir() if not f.name.startswith(".")}
    extra = sorted(on_disk - set(listed))
    if extra:
        raise DataError(f"{data_dir / extra[0]}: not listed in {where} (a shard added since the pack stage); {PACK_HINT}")
    paths, rows = [], 0
    for name in listed:
        path = data_dir / name
        if not path.is_file():
            raise DataError(f"{path}: missing (listed in {where}); {PACK_HINT}")
        scan = _scan_shard(path)
        if scan.dtype != dtype:
            raise DataError(f"{path}: dtype {scan.dtype}, manifest.json says {dtype}; {PACK_HINT}")
        if len(scan.shape) != 2 or scan.shape[1] != seq_len:
            raise DataError(f"{path}: shape {scan.shape}, manifest.json says (n, seq_len = {seq_len}); {PACK_HINT}")
        if scan.sha256 != m["sha256"][name]:
            raise DataError(f"{path}: sha256 differs from manifest.json (file changed since the pack stage wrote it); {PACK_HINT}")
        if scan.min_id < 0:
            raise DataError(f"{path}: holds token id {scan.min_id} (ids must lie in [0, vocab_size = {vocab})); {PACK_HINT}")
        if scan.max_id >= vocab:
            what = f"the mask id {vocab}" if scan.max_id == vocab else f"token id {scan.max_id}, above the vocabulary"
            raise DataError(f"{path}: holds {what} (ids must lie in [0, vocab_size = {vocab})); {PACK_HINT}")
        paths.append(path)
        rows += scan.shape[0]
    if rows != c.get("sequences"):
        raise DataError(f"{split_dir}: {rows} sequences, manifest.json says {c.get('sequences')}; {PACK_HINT}")
    return paths, counts


class PackedTokens:
    """Read-only, memory-mapped view of one packed split: ``len()`` sequences of length L.

    Opening it checks the split against its manifest (:func:`verify_split`)."""

    def __init__(self, split_dir: str | Path):
        files, counts = verify_split(split_dir)
        self.shards = [np.load(f, mmap_mode="r", allow_pickle=False) for f in files]
        self.seq_len, self.vocab_size = int(counts["seq_len"]), int(counts["vocab_size"])
        self._ends = np.cumsum([len(s) for s in self.shards])

    def __len__(self) -> int:
        return int(self._ends[-1])

    def unigram_entropy(self) -> float:
        """Entropy (nats) of the empirical distribution of every token of the split: the NLL
        per token of the best context-free predictor fitted on the split itself, the line a
        model that uses no context cannot get below."""
        flat = [np.asarray(s, dtype=np.int64).ravel() for s in self.shards]
        size = 1 + max(int(f.max()) for f in flat)
        counts = sum(np.bincount(f, minlength=size) for f in flat)
        q = counts[counts > 0] / counts.sum()
        return float(-(q * np.log(q)).sum())

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        k = int(np.searchsorted(self._ends, i, side="right"))
        start = 0 if k == 0 else int(self._ends[k - 1])
        return np.asarray(self.shards[k][i - start], dtype=np.int64)
