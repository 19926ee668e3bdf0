"""The evaluators of the TADM:Post-train findings and checks, from Table 1: counted layer calls
against the fusion split's bound, the speed-up over the base across timing blocks, accuracy
against the base, the control and each training-free cache, over fusion runs (`evidence`
registers each by its name)."""

from __future__ import annotations

import math

import numpy as np

from tadm.experiments.claims.claim import Claim, Entry
from tadm.experiments.claims.evidence import df_note, evaluator, fmt
from tadm.experiments.claims.inputs import Inputs
from tadm.experiments.claims.rules import Rules, exact, paper_position, usable
from tadm.experiments.table1_stats import accuracy_delta, between_run, shared_seeds, welch
from tadm.metrics.replicates import Pooled


POSTTRAIN_MODEL = {"tadm": "dg_posttrain", "control": "dg_posttrain_fresh"}

# an effect's equivalence / non-inferiority margin (params claims.margin_*) and its judge, by metric


@evaluator
def posttrain_layer_calls(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """Table 1's counted layer calls of rows[0] at K = refresh over rows[1]'s (the base), against
    the bound the fusion's split (shallow / anchor / denoiser layers s / a / d) sets at that K:
    (s + d + a / K) / (s + a + d)."""
    if not inp.table1:
        return
    m = next(iter(inp.table1["tasks"].values()))["methods"]
    row, K = _t1_row(m, e.rows[0], e.refresh), e.refresh
    split = inp.table1.get("split")
    if row and split and len(split) == 3:
        s, a, d = split
        bound = (s + d + a / K) / (s + a + d)
        c.value = row[1]["layer_calls"] / _t1_row(m, e.rows[1])[1]["layer_calls"]
        c.shown = f"{c.value:.4f}x (split {split}; its bound {bound:.4f}x)"
        c.verdict = exact(c.value, bound)
        c.notes = f"the {split[0]}/{split[1]}/{split[2]} split bounds K = {K} at ({s} + {d} + {a}/{K}) / {s + a + d}"


@evaluator
def posttrain_throughput(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """rows[0] at its largest K over rows[1] (the base) in Table 1, minus 1: per task its speed-up
    across timing blocks (the scored pass and the timing-only blocks, exp of the mean block log
    ratio, se on the blocks' df; without blocks the scored pass's median of paired batch-time
    ratios), over several tasks their geometric mean (the fewest df); the paper's range placed
    against this run's interval."""
    if not inp.table1:
        return
    a, ref = e.rows
    per, logs, var, mbs, dfs = [], [], 0.0, [], []
    for name, t in inp.table1["tasks"].items():
        m = t["methods"]
        kmax = _kmax(m, a)
        row = _t1_row(m, a, kmax)[1]
        base = _t1_row(m, ref)[1]
        r, se = row["throughput_x"], row.get("throughput_se")
        dfs.append(row.get("throughput_df"))
        bound = base["flops"] / row["flops"] if row.get("flops") else float("nan")
        per.append(f"{name}: {fmt(r, se, 2, 'x')} at K = {kmax}" + (f", measured / FLOP-bound {r / bound:.2f}"
                                                                     if usable(bound) else ""))
        logs.append(math.log(r))
        mbs.append(math.log(r / bound) if usable(bound) else float("nan"))
        var += (se / r) ** 2 if usable(se) else float("nan")
        blocks = (row.get("speed_blocks") or {}).get("blocks")
        c.n = (c.n or 0) + (len(blocks) if blocks else len(row["seconds"]) if isinstance(row.get("seconds"), list) else 0)
        if blocks:
            c.n_unit = "timing blocks"
            sb = row["speed_blocks"]
            per[-1] += ("; blocks " + ", ".join(f"{x:.2f}x" for x in blocks)
                        + (f", log sd within {sb['within_sd']:.3f} / between {sb['between_sd']:.3f}"
                           if sb.get("within_sd") is not None and sb.get("between_sd") is not None else ""))
    c.df = min(dfs) if dfs and all(d is not None for d in dfs) else None
    ratio = math.exp(sum(logs) / len(logs))
    se = ratio * math.sqrt(var) / len(logs) if usable(var) else None
    if all(map(math.isfinite, mbs)):
        c.extra["measured_over_bound"] = math.exp(sum(mbs) / len(mbs))  # over several tasks: the geometric mean
    c.value, c.se = ratio - 1.0, se
    c.shown = fmt(ratio, se, 2, "x") + f" ({'; '.join(per)})"
    c.notes = f"{paper_position(ratio, se, *e.paper_ratio, rules=rules)} ({c.paper})"


# --------------------------------------------------------------------------- findings: Table 1


def _t1_row(methods: dict, family: str, k: int | None = None) -> tuple[str, dict] | None:
    """The (label, row) of Table 1's `family` (at refresh interval k when given)."""
    for label, row in methods.items():
        if row.get("family") == family and (k is None or row.get("refresh_every") == k):
            return label, row
    return None


def _kmax(methods: dict, family: str) -> int:
    """The largest refresh interval of Table 1's `family`."""
    return max(v["refresh_every"] for v in methods.values() if v.get("family") == family)


def _t1_merged(tasks: list[dict]) -> dict[str, dict]:
    """Table 1's method rows of several tasks as one task: every run's per-example correctness
    concatenated over the tasks' examples (each run's accuracy recomputed over them); one task as
    it is."""
    if len(tasks) == 1:
        return tasks[0]["methods"]
    out = {}
    for label, row in tasks[0]["methods"].items():
        rows = [t["methods"][label] for t in tasks]

        def joined(per_task: list) -> list[list[int]]:
            return [sum((t[s] for t in per_task), []) for s in range(len(per_task[0]))]

        merged = {k: row[k] for k in ("family", "refresh_every", "control") if k in row}
        merged["correct_seeds"] = joined([r["correct_seeds"] for r in rows])
        if row.get("runs"):
            merged["runs"] = []
            for i, run in enumerate(row["runs"]):
                correct = joined([r["runs"][i]["correct_seeds"] for r in rows])
                merged["runs"].append({"seed": run.get("seed"), "correct_seeds": correct,
                                       "accuracy": 100.0 * float(np.mean(correct))})
        out[label] = merged
    return out


def _t1_delta(tasks: list[dict], a: str, ref: str) -> tuple[float, float, Pooled | None, int, int]:
    """(accuracy a - ref in points, se, the pool, examples, fusion runs of a) over `tasks` together,
    with Table 1's own estimator (`tadm.experiments.table1_stats.between_run`, `accuracy_delta`)."""
    rows = _t1_merged(tasks)
    pool, _ = between_run(rows)
    delta, se = accuracy_delta(rows[a], rows[ref], pool)
    return delta, se, pool, len(rows[a]["correct_seeds"][0]), len(rows[a].get("runs") or [None])


def _t1_accuracy(inp: Inputs, c: Claim, family: str, k: int, ref_family: str) -> None:
    """`c` filled with `family` at refresh interval k minus the `ref_family` row (the base and the
    control at their own K, a cache at k), pooled over every task of Table 1, each task in the
    notes; the reference side's training runs count where it is a trained fusion."""
    tasks = inp.table1["tasks"]
    methods0 = next(iter(tasks.values()))["methods"]
    a, ref = _t1_row(methods0, family, k), _t1_row(methods0, ref_family, k if ref_family not in ("base", "control") else None)
    if a is None or ref is None:
        c.notes = f"no {ref_family} row in results/table1.json"
        return
    per = {}
    for name, t in tasks.items():
        d, se, _, n, runs = _t1_delta([t], a[0], ref[0])
        per[name] = (d, se, n)
    c.value, c.se, pool, c.n, runs = _t1_delta(list(tasks.values()), a[0], ref[0])
    c.df = pool.df if pool is not None else None
    c.training = pool
    ref_runs = len(_t1_merged(list(tasks.values()))[ref[0]].get("runs") or [None])
    c.training_arms = (runs, ref_runs if ref_family in POSTTRAIN_MODEL else 0) if pool else None
    c.covers = ("examples and sampling seeds (bootstrap over examples)"
                + (f"; fusion training runs ({runs} of TADM at K = {k}; between-run variance pooled over the trained "
                   f"rows' runs, each run's sampling variance subtracted, {pool.df} df)" if pool
                   else "; one fusion training run (no training variance)"))
    c.shown = (f"{fmt(c.value, c.se, 1, ' pts')}{df_note(c)} (K = {k} vs {'the ' + ref_family if ref_family in ('base', 'control') else ref[0]}"
               f"; {len(tasks)} task{'s' if len(tasks) > 1 else ''} pooled, {c.n} examples)")
    c.notes = "; ".join(f"{name}: {fmt(d, se, 1, ' pts')} ({n} examples)" for name, (d, se, n) in per.items())
    c.notes += _run_level(list(tasks.values()), a[0], ref[0])


def _run_level(tasks: list[dict], a: str, ref: str) -> str:
    """The sensitivity line: the difference of run-level accuracies with the se from the runs'
    spread alone (Welch where both sides have two runs or more; else one side's runs against the
    other's one figure), and whether the runs share their sampling seeds."""
    rows = _t1_merged(tasks)
    runs = lambda r: [x["accuracy"] for x in rows[r].get("runs") or []]  # noqa: E731
    ra, rb = runs(a), runs(ref)
    got = welch(ra, rb)
    if got is None and len(ra) >= 2:
        b = rb[0] if rb else 100.0 * float(np.mean(rows[ref]["correct_seeds"]))
        got = (float(np.mean(ra)) - b, float(np.std(ra, ddof=1)) / math.sqrt(len(ra)), len(ra) - 1)
    if got is None:
        return ""
    arms = [r for r in (a, ref) if rows[r].get("runs")]
    shared = "the runs share their sampling seeds" if shared_seeds(rows, arms) else "each run its own sampling seeds"
    return (f"; sensitivity, run-level accuracies alone ({shared}): {got[0]:+.1f} pts ± {got[1]:.1f} pts, "
            f"{got[2]:.1f} df" + (" (Welch)" if len(rb) >= 2 else ""))


def _posttrain_rests_on(*families: str) -> tuple[str, ...]:
    """The trained fusions behind Table 1's `families`."""
    return tuple(POSTTRAIN_MODEL[f] for f in families if f in POSTTRAIN_MODEL)


@evaluator
def posttrain_accuracy(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """Accuracy of rows[0] at its largest K minus rows[1]'s (the base or the control), pooled over
    every task of Table 1, each task in the notes; against the base also how often TADM writes its
    fusion-bypassed row's very completion."""
    a, ref = e.rows
    c.rests_on = _posttrain_rests_on(a, ref)
    if not inp.table1:
        return
    tasks = inp.table1["tasks"]
    kmax = _kmax(next(iter(tasks.values()))["methods"], a)
    _t1_accuracy(inp, c, a, kmax, ref)
    if ref != "base":
        return
    bypass = [f"{t}: {100 * r['same_output_as_bypass']:.0f} %" for t, task in tasks.items()
              for label, r in task["methods"].items()
              if r.get("family") == a and r.get("refresh_every") == kmax and "same_output_as_bypass" in r]
    if bypass:
        c.notes += "; TADM writes the fusion-bypassed row's very completion on " + ", ".join(bypass)


@evaluator
def training_free(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """Accuracy of rows[0] at the largest K against the entry's training-free cache (one of
    claims.training_free_comparator, named before the run) at the same K, pooled over the tasks;
    every K and the cache's compute, speed and shared completions in the notes."""
    a, name = e.rows[0], e.comparator
    c.rests_on = _posttrain_rests_on(a, name)
    if not inp.table1:
        return
    m = next(iter(inp.table1["tasks"].values()))["methods"]
    ks = sorted(v["refresh_every"] for v in m.values() if v.get("family") == a and v["refresh_every"] > 1
                and _t1_row(m, name, v["refresh_every"]))
    if not ks:
        c.notes = f"no `{name}` cache row in results/table1.json (posttrain.cache_methods)"
        return
    notes = []
    for k in ks:
        _t1_accuracy(inp, c, a, k, name)
        row = _t1_row(m, name, k)[1]
        t = _t1_row(m, a, k)[1]
        calls = row["layer_calls_weighted"] / t["layer_calls_weighted"]
        speed = t["throughput_x"] / row["throughput_x"]
        same = row.get("same_output_as_tadm")
        notes.append(f"K = {k}: {c.shown} (its layer calls {calls:.3f}x TADM's; TADM's measured speed {speed:.2f}x its"
                     + ("" if same is None else f"; TADM's very completion {same:.0%} of the time") + f"; {c.notes})")
    c.notes = "; ".join(notes)
