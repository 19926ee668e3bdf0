"""A speed ratio across timing blocks run in separate processes.

One process's timing rounds share its state: the machine's clock and cache behaviour of that
minute, one batch, one step window. Their spread (the within-block se) understates how far two
invocations of the same timing disagree. So a speed-up is timed in B blocks, each in its own
process at another point of the pipeline, with its own batch seed and step window, and combined
on the log scale:

    y_b  = log(ratio of block b)                   (its within-block se s_b -> w_b = (s_b / ratio_b)^2)
    y    = mean_b y_b,   ratio = exp(y)
    se   = sqrt(max(var_b(y_b), mean_b w_b) / B)  on B - 1 df
                                                   (the blocks' own spread -- within and between --
                                                    and never below what their rounds alone show:
                                                    with a few blocks their sample variance can fall
                                                    far below it by chance)
    within  sd = sqrt(mean_b w_b)                  (what one block's rounds alone would claim)
    between sd = sqrt(max(0, var_b(y_b) - mean_b w_b))
    Q = sum_b (y_b - y_w)^2 / w_b on B - 1 df      (Cochran's Q, y_w the w-weighted mean: do the
                                                     blocks disagree beyond their within-block se?)

Example::

    >>> r = combine([1.8, 2.0, 1.9], [0.02, 0.03, 0.02])
    >>> round(r["ratio"], 3), r["df"], round(r["se"], 3)
    (1.898, 2, 0.058)
"""

from __future__ import annotations

import math

import numpy as np


def cochran_q(values, ses) -> tuple[float, int, float]:
    """Cochran's Q of estimates `values` with standard errors `ses` (about their inverse-variance
    weighted mean), its df (n - 1) and its chi-square upper-tail p-value; nan where any se is not
    positive or there are fewer than 2."""
    y, s = np.asarray(values, np.float64), np.asarray(ses, np.float64)
    if len(y) < 2 or not np.all(np.isfinite(s)) or np.any(s <= 0):
        return float("nan"), max(len(y) - 1, 0), float("nan")
    w = 1.0 / s ** 2
    q = float(np.sum(w * (y - np.sum(w * y) / np.sum(w)) ** 2))
    from scipy.stats import chi2  # lazy: scipy.stats takes ~1 s to import; only Cochran's Q needs it

    return q, len(y) - 1, float(chi2.sf(q, len(y) - 1))


def combine(ratios, ses=None) -> dict:
    """Block ratios (each > 0) and their within-block ses (None or nan: not known) combined on the
    log scale (module docstring): ratio, se (None with one block; never below the within-block
    part), df, log_ratio, log_se, within_sd, between_sd, q, q_df, q_p, blocks (the ratios) and
    block_se."""
    r = np.asarray(ratios, np.float64)
    if r.ndim != 1 or not len(r) or not np.all(np.isfinite(r)) or np.any(r <= 0):
        raise ValueError(f"combine: block ratios must be finite and positive, got {list(ratios)}")
    B = len(r)
    s = np.full(B, np.nan) if ses is None else np.asarray([np.nan if v is None else v for v in ses], np.float64)
    if len(s) != B:
        raise ValueError(f"combine: {B} block ratios against {len(s)} ses")
    y = np.log(r)
    mean = float(y.mean())
    ratio = math.exp(mean)
    w = (s / r) ** 2
    within = float(math.sqrt(w.mean())) if np.all(np.isfinite(w)) else None
    var = float(y.var(ddof=1)) if B > 1 else None
    log_se = None if var is None else math.sqrt(max(var, within ** 2 if within is not None else 0.0) / B)
    between = None if var is None or within is None else math.sqrt(max(0.0, var - within ** 2))
    q, q_df, q_p = cochran_q(y, np.sqrt(w)) if within is not None else (float("nan"), B - 1, float("nan"))
    nan = lambda v: None if v is None or not math.isfinite(v) else float(v)  # noqa: E731
    return {"ratio": ratio, "se": None if log_se is None else ratio * log_se, "df": B - 1, "log_ratio": mean,
            "log_se": log_se, "within_sd": within, "between_sd": between, "q": nan(q), "q_df": q_df, "q_p": nan(q_p),
            "blocks": [float(v) for v in r], "block_se": [nan(v) for v in s]}


__all__ = ["cochran_q", "combine"]
