"""MAUVE between two text sets, p and q (Table 2 calls it as ReMDM's evaluation does: p = the
human reference texts, q = the generated samples; `tadm.metrics.scorer.Scorer`).

Features always come from a :class:`~tadm.metrics.features.Featurizer` and are handed to
``mauve.compute_mauve(p_features=..., q_features=...)`` (mauve-text 0.4.0); its text path is
never used, since it downloads GPT-2 Large.

Settings follow ReMDM's protocol (mauve-text defaults, text cut at 1024 tokens by the
featurizer): k-means on PCA features keeping 90 % of the variance, 5 restarts of at most 500
iterations, scaling constant c = 5, 25 points on the divergence curve, seed 25 (fixed, so the
score is deterministic for the same features). ``num_buckets="auto"`` is mauve's own rule,
max(2, round(min(n_p, n_q) / 10)) histogram bins: with ReMDM's 5000 vs 5000 samples that is
500 bins, and it keeps about 10 samples per bin at any small n (100 vs 100 -> 10 bins).

The clustering runs on ``num_threads`` BLAS/OpenMP threads, 1 by default: the score then does
not depend on the machine's core count, and small inputs do not stall on thread pools that
torch keeps spinning (on 2 cores, 100 vs 100 takes 10 ms single-threaded and up to seconds
multi-threaded). Pass ``num_threads=None`` (all cores) for ReMDM-sized inputs on a big machine.

faiss's C++ k-means prints "WARNING clustering n points to k centroids: please provide at least
39k training points" to the process's stderr on every restart: mauve's own bucket rule (n / 10
bins) always sits under faiss's 39 points per centroid, so it is expected, not a fault, and it
would flood a notebook (hundreds of lines per Table 2 row). :func:`mauve_from_features` drops
exactly that line and passes any other stderr output through.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from typing import Iterator

import numpy as np

from tadm.metrics.features import Featurizer

DEFAULTS = dict(
    num_buckets="auto",
    pca_max_data=-1,
    kmeans_explained_var=0.9,
    kmeans_num_redo=5,
    kmeans_max_iter=500,
    divergence_curve_discretization_size=25,
    mauve_scaling_factor=5,
    seed=25,
)


def _check_texts(name: str, texts) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise ValueError(f"{name} must be a list of strings, got {type(texts).__name__}")
    if len(texts) < 2:
        raise ValueError(f"{name} needs at least 2 texts, got {len(texts)}")
    if not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{name} must contain only strings")
    return list(texts)


def _check_features(name: str, x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        raise ValueError(f"{name} must have shape (n >= 2, d >= 1), got {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or infinite values")
    return x


FAISS_WARNING = re.compile(r"^WARNING clustering \d+ points to \d+ centroids: please provide at least \d+ training points$")


@contextlib.contextmanager
def _without_faiss_warnings() -> Iterator[None]:
    """Capture file descriptor 2 (where faiss's C++ writes) for the block; then write every
    captured line except faiss's k-means size warning back to stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not FAISS_WARNING.match(line.rstrip("\n"))]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def mauve_from_features(p_features, q_features, num_threads: int | None = 1, **knobs):
    """The full ``compute_mauve`` result (``.mauve``, ``.frontier_integral``, histograms, ...)
    for precomputed (n, d) features; `knobs` override :data:`DEFAULTS`."""
    import mauve  # lazy: mauve-text takes ~6 s to import (faiss, scikit-learn); only scoring MAUVE needs it
    # lazy: optional dependency (threadpoolctl, through mauve-text's scikit-learn); only MAUVE needs it
    from threadpoolctl import threadpool_limits

    p = _check_features("p_features", p_features)
    q = _check_features("q_features", q_features)
    if p.shape[1] != q.shape[1]:
        raise ValueError(f"p_features and q_features differ in dimension: {p.shape[1]} vs {q.shape[1]}")
    unknown = set(knobs) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown MAUVE setting(s) {sorted(unknown)}; allowed: {sorted(DEFAULTS)}")
    settings = {**DEFAULTS, **knobs}
    buckets = settings["num_buckets"]
    if buckets != "auto" and not (isinstance(buckets, int) and 2 <= buckets <= min(len(p), len(q))):
        raise ValueError(f"num_buckets must be 'auto' or an integer in [2, {min(len(p), len(q))}], got {buckets!r}")
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be >= 1 or None (all cores), got {num_threads}")
    with threadpool_limits(limits=num_threads), _without_faiss_warnings():
        return mauve.compute_mauve(p_features=p, q_features=q, verbose=False, **settings)


def mauve_score_features(p_features, q_features, num_threads: int | None = 1, **knobs) -> float:
    """MAUVE in [0, 1] of precomputed features."""
    return float(mauve_from_features(p_features, q_features, num_threads, **knobs).mauve)


def mauve_score(p_texts: list[str], q_texts: list[str], featurizer: Featurizer, num_threads: int | None = 1,
                **knobs) -> float:
    """MAUVE in [0, 1] between generated texts `p_texts` and references `q_texts`."""
    p = featurizer.encode(_check_texts("p_texts", p_texts))
    q = featurizer.encode(_check_texts("q_texts", q_texts))
    return mauve_score_features(p, q, num_threads, **knobs)
