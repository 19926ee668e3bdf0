"""AUP (accuracy under parallelism), the score of the d3LLM release's dLLM leaderboard
(hao-ai-lab/d3LLM, `AUP_leaderboard/aup_utils.py` and `AUP_leaderboard/main.py`), written from
reading it; pure python.

A method is a set of settings, each a point (rho, y): rho its parallelism, y its accuracy in
percent. With the points sorted by rho (stably: equal rho keep their input order) and y_1 the
accuracy at the smallest rho,

    W(y) = min(exp(-alpha (1 - y / y_max)), 1)
    AUP  = rho_1 y_1 + sum_{i >= 2} (rho_i - rho_{i-1}) (y_i W(y_i) + y_{i-1} W(y_{i-1})) / 2

over the points with y_i >= y_1 - offset (the first term is not weighted). y_max is the best
accuracy of any method on the task, the autoregressive reference included; alpha = 3 and
offset = 5 are the release's constants. A method with one setting scores rho y.

The release refuses to score a method whose point at the largest rho is more than `offset`
below y_1 (an assertion on the last sorted point only; points in between that fall below
y_1 - offset are dropped). Here such a method gets no score: `aup` returns None and
`unscored_reason` says why.

rho on the leaderboard is TPF, tokens per forward: generated tokens over model calls
(`tokens_per_forward`; a one-token-a-step decode gives 1). This project also reads rho as
tokens per full-model-equivalent forward, generated tokens over weighted layer calls / L
(`equivalent_rho`), so that methods which run part of the model per call (caches) sit on the
same axis; that reading is not the leaderboard's.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

ALPHA = 3.0  # the release's penalty factor
OFFSET = 5.0  # the release's y_min_offset: points below y_1 - OFFSET are dropped


def weight(y: float, y_max: float, alpha: float = ALPHA) -> float:
    """The quality weight W(y) = min(exp(-alpha (1 - y / y_max)), 1)."""
    if not y_max > 0:
        raise ValueError(f"y_max: must be > 0, got {y_max!r}")
    return min(math.exp(-alpha * (1.0 - y / y_max)), 1.0)


def _points(rho: Sequence[float], y: Sequence[float]) -> list[tuple[float, float]]:
    rho, y = list(rho), list(y)
    if len(rho) != len(y):
        raise ValueError(f"rho: {len(rho)} values against {len(y)} accuracies in y")
    if not rho:
        raise ValueError("rho: no points")
    for i, r in enumerate(rho):
        if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
            raise ValueError(f"rho[{i}]: must be a finite number > 0, got {r!r}")
    for i, acc in enumerate(y):
        if not (isinstance(acc, (int, float)) and math.isfinite(acc) and 0 <= acc <= 100):
            raise ValueError(f"y[{i}]: must be an accuracy in percent (0..100), got {acc!r}")
    return sorted(zip(rho, y), key=lambda p: p[0])  # stable


def unscored_reason(rho: Sequence[float], y: Sequence[float], offset: float = OFFSET) -> str | None:
    """Why the release would not score these points (its degradation check), or None."""
    pts = _points(rho, y)
    y_1, y_last = pts[0][1], pts[-1][1]
    if y_1 - y_last > offset:
        return (f"accuracy at the largest rho ({y_last:g}) is more than {offset:g} below the accuracy "
                f"at the smallest ({y_1:g})")
    return None


def aup(rho: Sequence[float], y: Sequence[float], y_max: float, alpha: float = ALPHA,
        offset: float = OFFSET) -> float | None:
    """AUP of the points (rho_i, y_i) against the task's best accuracy `y_max` (module
    docstring); None where the release refuses to score them (`unscored_reason`)."""
    pts = _points(rho, y)
    if not (isinstance(y_max, (int, float)) and math.isfinite(y_max) and y_max > 0):
        raise ValueError(f"y_max: must be a finite accuracy > 0, got {y_max!r}")
    if not offset >= 0:
        raise ValueError(f"offset: must be >= 0, got {offset!r}")
    if unscored_reason(rho, y, offset) is not None:
        return None
    y_1 = pts[0][1]
    kept = [(r, acc) for r, acc in pts if acc >= y_1 - offset]
    total = kept[0][0] * kept[0][1]
    for (r0, y0), (r1, y1) in zip(kept, kept[1:]):
        total += 0.5 * (r1 - r0) * (y1 * weight(y1, y_max, alpha) + y0 * weight(y0, y_max, alpha))
    return total


def aup_by_family(families: Mapping[str, Iterable[tuple[float, float]]], y_max: float | None = None,
                  alpha: float = ALPHA, offset: float = OFFSET) -> dict[str, float | None]:
    """AUP of each family's (rho, y) points, against `y_max` (default: the best accuracy of any
    point of any family, as the leaderboard takes it per task)."""
    pts = {name: list(points) for name, points in families.items()}
    for name, p in pts.items():
        if not p:
            raise ValueError(f"families[{name!r}]: no points")
    if y_max is None:
        y_max = max(acc for p in pts.values() for _, acc in p)
    return {name: aup([r for r, _ in p], [acc for _, acc in p], y_max, alpha, offset) for name, p in pts.items()}


def tokens_per_forward(generated: float, calls: float) -> float:
    """TPF, the leaderboard's rho: generated tokens per sequence over model calls per sequence."""
    if not calls > 0:
        raise ValueError(f"calls: must be > 0, got {calls!r}")
    return generated / calls


def equivalent_rho(generated: float, layer_calls_weighted: float, n_layers: int) -> float:
    """Tokens per full-model-equivalent forward: generated tokens over weighted layer calls / L
    (this project's extension; equals TPF when every call runs the whole model)."""
    if not layer_calls_weighted > 0:
        raise ValueError(f"layer_calls_weighted: must be > 0, got {layer_calls_weighted!r}")
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers: must be an integer >= 1, got {n_layers!r}")
    return generated / (layer_calls_weighted / n_layers)


__all__ = ["ALPHA", "OFFSET", "aup", "aup_by_family", "equivalent_rho", "tokens_per_forward", "unscored_reason",
           "weight"]
