"""Table 1's statistics over one task's rows (the per-method dicts of results/table1.json): speed
from the timed batches and paired speed-ups over the base, the between-run variance of the trained
rows' fusion runs, and accuracy differences with their se over examples, sampling seeds and fusion
runs (`tadm.metrics.replicates`), written into the rows (:func:`add_statistics`)."""

from __future__ import annotations

import math
import statistics

import numpy as np

from tadm.metrics.bootstrap import paired_speedup
from tadm.metrics.replicates import pooled_between, replicated_accuracy_delta
from tadm.registry import DG_CACHES


def add_speedups(rows: dict[str, dict], base: str) -> None:
    """Each method's row of one task gets its throughput_x (± throughput_se; None where one
    batch gives no se) and decoder_speedup_x over the row `base`: :func:`paired_speedup` of
    their full batches' times, which `Runner.run_seed` records in the same order for every
    method."""
    for row in rows.values():
        row["throughput_x"], se = paired_speedup(rows[base]["seconds"], row["seconds"])
        row["throughput_se"] = se if se == se else None  # JSON has no nan
        row["decoder_speedup_x"], _ = paired_speedup(rows[base]["decoder_seconds"], row["decoder_seconds"])


def throughput(timed: list[tuple[int, float, float]], tokens_per_prompt: int) -> dict:
    """Speed of one method from its timed batches (prompts, seconds, decoder seconds) over every
    seed: the batches of the largest size (the full ones; a last, shorter batch of a task runs
    at another speed), their times, and tokens/s = its generated tokens / their median time."""
    size = max(n for n, _, _ in timed)
    full = [(s, ds) for n, s, ds in timed if n == size]
    seconds = [s for s, _ in full]
    return {"batch_prompts": size, "seconds": seconds, "decoder_seconds": [ds for _, ds in full],
            "tokens_per_s": size * tokens_per_prompt / statistics.median(seconds)}


def trained_row(row: dict) -> bool:
    """A row whose fusion was trained and acts: the control, TADM at K >= 2 (K = 1 is the base)."""
    return row["family"] == "control" or (row["family"] == "tadm" and (row["refresh_every"] or 1) > 1)


def _runs_of(row: dict) -> list[list[list[int]]]:
    """A row's runs as (sampling seeds x examples) 0/1 matrices: its fusion runs, or the row itself."""
    return [r["correct_seeds"] for r in row["runs"]] if row.get("runs") else [row["correct_seeds"]]


def within_run_var(correct_seeds: list[list[int]]) -> float | None:
    """The sampling variance (points^2) of one run's accuracy, the mean over its S seeds and n
    examples, given its fusion and the examples: sum_i s_i^2 / (n^2 S), s_i^2 the variance of
    example i's correctness over the seeds (unbiased, ddof 1); None with one seed."""

    x = np.asarray(correct_seeds, np.float64)
    if x.ndim != 2 or x.shape[0] < 2:
        return None
    S, n = x.shape
    return float(1e4 * x.var(axis=0, ddof=1).sum() / (n * n * S))


def shared_seeds(rows: dict[str, dict], arms: list[str]) -> bool:
    """Whether two fusion runs of one arm decoded with the same sampling seeds (a run record
    without its seeds counts as sharing): their sampling noise is then common to the runs, not
    independent of them."""
    for a in arms:
        seen = [tuple(r.get("seeds") or ()) for r in rows[a]["runs"]]
        if any(not s for s in seen) or len(set(seen)) < len(seen):
            return True
    return False


def between_run(rows: dict[str, dict]):
    """The between-run variance (points^2) of the trained rows' run-level accuracies, pooled over
    the arms -- TADM at every K >= 2 and the control (`tadm.metrics.replicates.pooled_between`) --
    and the arms' labels; (None, arms) when no arm has two runs. Each run's own sampling variance
    (:func:`within_run_var`) is subtracted only where the runs decoded with sampling seeds of their
    own and every run has two seeds or more: runs that share their seeds share that noise, and the
    run-level spread is then taken whole (the conservative side)."""

    arms = [label for label, row in rows.items() if trained_row(row) and row.get("runs")]
    values = [[r["accuracy"] for r in rows[a]["runs"]] for a in arms]
    if not any(len(v) >= 2 for v in values):
        return None, arms
    within = [[within_run_var(r["correct_seeds"]) for r in rows[a]["runs"]] for a in arms]
    if any(w is None for ws in within for w in ws) or shared_seeds(rows, arms):
        within = None
    return pooled_between(values, within), arms


def welch(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """Welch's comparison of two arms' run-level accuracies (points): (mean a - mean b, se,
    Welch-Satterthwaite df); None unless both arms have two runs or more."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / ((va ** 2 / (len(a) - 1)) + (vb ** 2 / (len(b) - 1))) if va + vb > 0 else math.inf
    return statistics.mean(a) - statistics.mean(b), se, df


def accuracy_delta(a: dict, b: dict, pooled) -> tuple[float, float]:
    """Row a's accuracy minus row b's in points, over fusion runs and sampling seeds, and its se
    (`tadm.metrics.replicates.replicated_accuracy_delta`): the example bootstrap of the per-example
    differences of the means over runs and seeds, plus the pooled between-run variance times 1/n for
    each trained side (:func:`trained_row`); an untrained side (base, caches, TADM K = 1) adds none."""

    if a is b:
        return 0.0, 0.0
    return replicated_accuracy_delta(_runs_of(a), _runs_of(b), pooled, trained_row(b), a_trained=trained_row(a))


def _num(x: float) -> float | None:
    return None if x != x else float(x)  # JSON has no NaN (one example: no bootstrap se)


def add_statistics(rows: dict[str, dict], base: str = "Base") -> dict | None:
    """Per row of one task: its accuracy's mean over fusion runs (``accuracy_mean_runs``) and Δ vs the
    base, the control and (a training-free cache) TADM at its K, each with its se over examples,
    sampling seeds and -- for a trained side -- fusion runs (:func:`accuracy_delta`). Returns the
    task's ``between_run`` record (None when no trained row has two runs)."""
    pooled, arms = between_run(rows)
    control = next((r for r in rows.values() if r["family"] == "control"), None)
    tadm = {r["refresh_every"]: r for r in rows.values() if r["family"] == "tadm"}
    for row in rows.values():
        row["accuracy_mean_runs"] = (statistics.mean(r["accuracy"] for r in row["runs"]) if row.get("runs")
                                     else row["accuracy"])
        for key, ref in (("delta_vs_base", rows[base]), ("delta_vs_control", control),
                         ("delta_vs_tadm", tadm.get(row["refresh_every"]) if row["family"] in DG_CACHES else None)):
            if ref is None:
                if key != "delta_vs_tadm":
                    row[key] = row[key + "_se"] = None
                continue
            d, se = accuracy_delta(row, ref, pooled)
            row[key], row[key + "_se"] = float(d), _num(se)
    if pooled is None:
        return None
    return {"var_between": pooled.var_between, "var_runs": pooled.var_runs, "var_within": pooled.var_within,
            "df": pooled.df, "runs": pooled.runs, "arms": arms}
