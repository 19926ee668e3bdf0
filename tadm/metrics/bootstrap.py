"""Uncertainty of the quality metrics: bootstrap over samples.

Every quality cell of a table (MAUVE, Gen PPL, entropy) is a statistic of N generated samples
(and, for MAUVE, of the reference set too). Its uncertainty is the standard deviation of the
statistic over `B` bootstrap resamples: the N samples are drawn with replacement (the reference
set too, independently, for MAUVE), the statistic is recomputed, and the spread of the B values
is reported as ``<metric>_se``. The resamples come from one seeded generator, so the same inputs
give the same uncertainties.

- Gen PPL: exp(sum of the resampled samples' NLL / sum of their scored tokens), the corpus-level
  definition of `tadm.metrics.gen_ppl`;
- entropy: the mean of the resampled per-sample entropies;
- MAUVE: `mauve_score_features` of the resampled features (its clustering seed fixed, as for
  the point estimate), so the spread covers both finite sample sets.
"""

from __future__ import annotations

import numpy as np

from tadm.errors import DataError
from tadm.metrics.mauve import mauve_score_features

SEED = 0xB007


def resamples(n: int, B: int, seed: int = SEED) -> np.ndarray:
    """(B, n) indices, each row n draws with replacement from range(n)."""
    if n < 1 or B < 1:
        raise ValueError(f"resamples: need n >= 1 and B >= 1, got n={n}, B={B}")
    return np.random.default_rng(seed).integers(0, n, size=(B, n))


def spread(values) -> float:
    """Standard deviation (ddof 1) of bootstrap values; nan with fewer than 2."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.std(ddof=1)) if len(v) > 1 else float("nan")


def gen_ppl_se(nll: np.ndarray, tokens: np.ndarray, B: int, seed: int = SEED) -> float:
    nll, tokens = np.asarray(nll, np.float64), np.asarray(tokens, np.float64)
    idx = resamples(len(nll), B, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        return spread(np.exp(nll[idx].sum(1) / tokens[idx].sum(1)))


def mean_se(values: np.ndarray, B: int, seed: int = SEED) -> float:
    values = np.asarray(values, np.float64)
    return spread(values[resamples(len(values), B, seed)].mean(1))


def mauve_se(p_features: np.ndarray, q_features: np.ndarray, B: int, seed: int = SEED) -> float:
    """MAUVE's bootstrap sd; p = the references, q = the samples (the released call order)."""
    ip, iq = resamples(len(p_features), B, seed + 1), resamples(len(q_features), B, seed)
    return spread([mauve_score_features(p_features[a], q_features[b]) for a, b in zip(ip, iq)])


def paired_mauve_diff(reference: np.ndarray, a_features: np.ndarray, b_features: np.ndarray, B: int,
                      seed: int = SEED) -> tuple[float, float]:
    """MAUVE(a) - MAUVE(b), both against the same `reference` features, and the standard
    deviation of that difference over B paired resamples: in each resample ONE draw of the
    references serves both rows and one index vector draws both rows' samples (the rows share the
    reference set, so their MAUVEs move together; a difference's spread is not the quadrature of
    the two spreads). MAUVE is called as released (p = references, q = samples)."""
    if len(a_features) != len(b_features):
        raise ValueError(f"paired_mauve_diff: {len(a_features)} samples against {len(b_features)}")
    diff = mauve_score_features(reference, a_features) - mauve_score_features(reference, b_features)
    ir, iq = resamples(len(reference), B, seed + 1), resamples(len(a_features), B, seed)
    values = [mauve_score_features(reference[r], a_features[q]) - mauve_score_features(reference[r], b_features[q])
              for r, q in zip(ir, iq)]
    return float(diff), spread(values)


def paired_log_ppl_ratio(a_nll, a_tokens, b_nll, b_tokens, B: int, seed: int = SEED) -> tuple[float, float]:
    """log(Gen PPL(a) / Gen PPL(b)) from per-sample summed NLL and scored-token counts, and its
    paired bootstrap sd (one index vector resamples both rows: sample i of each row was drawn
    with the same seed). exp(value) - 1 is the relative difference."""
    a_nll, a_tok = np.asarray(a_nll, np.float64), np.asarray(a_tokens, np.float64)
    b_nll, b_tok = np.asarray(b_nll, np.float64), np.asarray(b_tokens, np.float64)
    if len(a_nll) != len(b_nll):
        raise ValueError(f"paired_log_ppl_ratio: {len(a_nll)} samples against {len(b_nll)}")
    value = a_nll.sum() / a_tok.sum() - b_nll.sum() / b_tok.sum()
    idx = resamples(len(a_nll), B, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = a_nll[idx].sum(1) / a_tok[idx].sum(1) - b_nll[idx].sum(1) / b_tok[idx].sum(1)
    return float(value), spread(values)


def paired_speedup(base_seconds, seconds, B: int = 1000, seed: int = 0) -> tuple[float, float]:
    """A method's speed-up over a base from paired batch times (the same batches, in the same
    order, each timed for both within seconds, as Table 1 and the ASRD comparison run them): the
    median over batches of base seconds / method seconds, and its bootstrap standard error (B
    resamples of the batches; nan with fewer than 2)."""
    if len(base_seconds) != len(seconds) or not len(seconds):
        raise ValueError(f"paired_speedup: {len(base_seconds)} base batch times against {len(seconds)}")
    ratios = np.asarray(base_seconds, dtype=np.float64) / np.asarray(seconds, dtype=np.float64)
    if len(ratios) < 2:
        return float(ratios[0]), float("nan")
    return float(np.median(ratios)), spread(np.median(ratios[resamples(len(ratios), B, seed)], axis=1))


def paired_accuracy_delta(correct_seeds, ref_seeds, B: int = 1000, seed: int = SEED) -> tuple[float, float]:
    """Accuracy of a method minus a reference's, in points, from per-example correctness on the
    same examples (one list per sampling seed, the same seeds for both, as Table 1 runs them), and
    its paired bootstrap standard error: each example's difference is averaged over the seeds, and
    the examples are resampled (B times), so the se covers which examples were asked and the
    sampling noise of each answer; nan with fewer than 2 examples. (An sd over seeds of per-seed
    differences, with 2 seeds, can be 0 when both seeds differ by the same example.)"""
    a, b = np.asarray(correct_seeds, np.float64), np.asarray(ref_seeds, np.float64)
    if a.ndim != 2 or a.shape != b.shape or not a.size:
        raise ValueError(f"paired_accuracy_delta: correctness of shape {a.shape} against {b.shape} "
                         "(seeds x examples, the same for both)")
    diffs = 100.0 * (a - b).mean(0)  # per example, averaged over seeds
    return float(diffs.mean()), mean_se(diffs, B, seed) if len(diffs) > 1 else float("nan")


def row_accuracy_delta(m: dict, ref: dict | None, source: str = "results/table1.json") -> tuple[float, float]:
    """:func:`paired_accuracy_delta` of two method rows of Table 1's results (their
    ``correct_seeds``: both rows answer the same examples with the same seeds); NaN without a
    reference row. A row from an older tadm, without per-example correctness, is a DataError."""
    if ref is None:
        return float("nan"), float("nan")
    if any("correct_seeds" not in row for row in (m, ref)):
        raise DataError(f"{source}: a method has no per-example correctness (correct_seeds; written by an older "
                        "tadm): rerun dvc repro table1")
    return paired_accuracy_delta(m["correct_seeds"], ref["correct_seeds"])


__all__ = ["resamples", "spread", "gen_ppl_se", "mean_se", "mauve_se", "paired_mauve_diff", "paired_log_ppl_ratio",
           "paired_speedup", "paired_accuracy_delta",
           "row_accuracy_delta"]
