"""MDLM's wrap: documents -> fixed-length token sequences in memory-mapped shards.

Each document is tokenized without special tokens and followed by EOS; the token stream is
cut into pieces of L-2 tokens and each piece is wrapped as BOS ... EOS, so every sequence
has exactly L tokens. The final partial piece is dropped. Sequences are stored as ``.npy``
shards of shape (n, L) (uint16 when the vocabulary fits, else uint32) that
:class:`PackedTokens` opens with ``mmap_mode="r"``.
"""

from __future__ import annotations

import dataclasses
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from tqdm import tqdm

from tadm.config import PackingConfig
from tadm.errors import DataError
from tadm.io import atomic_path, read_jsonl, write_manifest

SPLITS = ("train", "validation")
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


def write_shards(seqs: Iterable[np.ndarray], out_dir: Path, seq_len: int, shard_sequences: int,
                 dtype: np.dtype) -> dict:
    """Write sequences into ``shard_00000.npy``... under out_dir (atomically, as a whole)."""
    n_seq, shards = 0, []
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for batch in _batches(seqs, shard_sequences):
            name = f"shard_{len(shards):05d}.npy"
            np.save(tmp / name, np.stack(batch).astype(dtype), allow_pickle=False)
            shards.append(name)
            n_seq += len(batch)
    return {"sequences": n_seq, "tokens": n_seq * seq_len, "shards": len(shards)}


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
        texts = (row["text"] for row in tqdm(read_jsonl(src), desc=f"pack[{split}]", unit="doc"))
        seqs = wrap(tokenize_docs(texts, tokenizer), cfg.seq_len, bos, eos)
        counts[split] = write_shards(seqs, out_dir / split, cfg.seq_len, cfg.shard_sequences, dtype)
        if counts[split]["sequences"] == 0:
            raise DataError(f"{src}: too little text for one sequence of packing.seq_len = {cfg.seq_len}")
    counts.update(seq_len=cfg.seq_len, dtype=dtype.name, vocab_size=len(tokenizer), bos_id=bos, eos_id=eos)
    return write_manifest(out_dir, "pack", counts, dataclasses.asdict(cfg))


class PackedTokens:
    """Read-only, memory-mapped view of one packed split: ``len()`` sequences of length L."""

    def __init__(self, split_dir: str | Path):
        split_dir = Path(split_dir)
        files = sorted(split_dir.glob("shard_*.npy"))
        if not files:
            raise DataError(f"no token shards in {split_dir}: run the pack stage first")
        self.shards = [np.load(f, mmap_mode="r", allow_pickle=False) for f in files]
        self.seq_len = self.shards[0].shape[1]
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
