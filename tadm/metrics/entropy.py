"""Token entropy of generated samples (MDLM / ReMDM's diversity check).

For each generated sequence of token ids, the entropy (nats) of the empirical distribution
of its tokens, -sum_v p_v log p_v with p_v = count(v) / length; the reported number is the
mean over samples. Every position counts, special tokens included (ReMDM scores the whole
1024-token canvas); `ignore_ids` drops some ids (e.g. padding) first. A sample that repeats
one token scores 0; k distinct tokens used equally often score log k.
"""

from __future__ import annotations

import numpy as np
import torch


def _rows(samples) -> list[torch.Tensor]:
    if isinstance(samples, (torch.Tensor, np.ndarray)):
        t = torch.as_tensor(samples)
        if t.ndim != 2:
            raise ValueError(f"samples must be 2-D (num_samples, length), got shape {tuple(t.shape)}")
        rows = list(t)
    elif isinstance(samples, (list, tuple)):
        rows = [torch.as_tensor(r) for r in samples]
        if any(r.ndim != 1 for r in rows):
            raise ValueError("samples must be a list of 1-D token id sequences")
    else:
        raise ValueError(f"samples must be a tensor, an array or a list of sequences, got {type(samples).__name__}")
    if not rows:
        raise ValueError("samples is empty")
    if any(r.dtype.is_floating_point or r.dtype == torch.bool for r in rows):
        raise ValueError("samples must hold integer token ids")
    return rows


def sample_entropy(samples, ignore_ids=()) -> np.ndarray:
    """(N,) entropy in nats of each sample's token distribution."""
    out = []
    for i, row in enumerate(_rows(samples)):
        if len(ignore_ids):
            row = row[~torch.isin(row, torch.as_tensor(list(ignore_ids), dtype=row.dtype, device=row.device))]
        if row.numel() == 0:
            raise ValueError(f"samples[{i}] has no token left to count")
        _, counts = torch.unique(row, return_counts=True)
        p = counts.double() / counts.sum()
        out.append(float(-(p * p.log()).sum()))
    return np.asarray(out, dtype=np.float64)


def mean_entropy(samples, ignore_ids=()) -> float:
    """Mean over samples of the per-sample token entropy (nats)."""
    return float(sample_entropy(samples, ignore_ids).mean())
