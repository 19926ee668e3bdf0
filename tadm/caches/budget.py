"""Layer-call budgets of the training-free caches against TADM's (per canvas of T denoising steps).

Unit: one decoder-layer forward over the whole canvas (the paper's compute unit); a layer that
recomputes n of the canvas's N rows counts n / N. With the split (s, a, d), L = s + a + d layers
and R = ceil(T / K) refreshes of a canvas:

    base                        L T
    TADM, naive anchor reuse    (s + d) T + a R
    feature cache               T + (L - 1) [R + (T - R) n_sel / N]   (layer 0 always full)

:func:`matched_share` solves "feature cache = TADM" at the same refresh interval for n_sel / N.
"""

from __future__ import annotations

import math


def refreshes(steps: int, k: int) -> int:
    """R = ceil(T / K): the refreshes of one canvas of T steps (every canvas starts with one)."""
    return -(-steps // k)


def matched_share(split: tuple[int, int, int]) -> float:
    """rho* = (s + d - 1) / (L - 1): the recompute share at which the feature cache makes as many
    layer calls as TADM at the same refresh interval K (before flooring n_sel; see the package
    docstring for the derivation). It does not depend on K or T."""
    s, a, d = split
    return (s + d - 1) / (s + a + d - 1)


def selected_rows(share: float, rows: int) -> int:
    """n_sel = floor(share * N): the rows a partial layer recomputes. The 1e-9 keeps exact ratios
    such as 0.3 * 10 from flooring one row short through binary rounding."""
    return min(rows, math.floor(share * rows + 1e-9))


def tadm_layer_calls(steps: int, k: int, split: tuple[int, int, int]) -> int:
    """(s + d) T + a ceil(T / K): TADM's (and the naive reuse's) layer calls per canvas."""
    s, a, d = split
    return (s + d) * steps + a * refreshes(steps, k)


def feature_layer_calls(steps: int, k: int, depth: int, n_sel: int, rows: int) -> float:
    """T + (L - 1) [R + (T - R) n_sel / N]: the feature cache's weighted layer calls per canvas."""
    r = refreshes(steps, k)
    return steps + (depth - 1) * (r + (steps - r) * n_sel / rows)
