"""The evidence behind the claims: one evaluator per shape of evidence, registered by its name
(`EVIDENCE`), which a catalog entry (`Entry.evidence`) names. `measure` makes an entry's `Claim`
and hands it to its evaluator, which fills in this run's figure (value, se, df, shown, n, covers,
notes; a check's verdict) from the `Inputs`; findings are decided afterwards, all together
(`rules.decide`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tadm.compute import cached_layer_calls
from tadm.experiments import throughput_results
from tadm.experiments.claims.claim import CONTRADICTED, DIRECTION, EQUIVALENCE, INCONCLUSIVE, NON_INFERIORITY, Claim, Entry
from tadm.experiments.claims.inputs import Inputs
from tadm.experiments.claims.rules import Rules, exact, paper_position, usable
from tadm.experiments.table1_stats import accuracy_delta, between_run, shared_seeds, welch
from tadm.experiments.table2 import ROWS
from tadm.metrics.replicates import Pooled, replicated_difference
from tadm.sampling.anchor_cache import PAPER_REFRESH_SCHEDULE

PAPER_L = 1024  # the paper's sequence length: its T = 1024 is L, T = 2048 is 2L


def row_model(row: str) -> str:
    """The trained checkpoint (a run of train.models) Table 2 row `row` samples from, read from
    the rows when asked (a row registered later too); KeyError for the Data row or an unknown one."""
    model = ROWS[row].model
    if model is None:
        raise KeyError(row)
    return model


def _short(row: str) -> str:
    """How prose names a Table 2 row (`Row.short`), or the key itself."""
    return ROWS[row].short if row in ROWS else row


# the trained fusion each Table 1 family samples with (the base and the training-free caches: none)
POSTTRAIN_MODEL = {"tadm": "dg_posttrain", "control": "dg_posttrain_fresh"}

# an effect's equivalence / non-inferiority margin (params claims.margin_*) and its judge, by metric
MARGIN = {"mauve": lambda cfg: cfg.margin_mauve, "log_ppl": lambda cfg: math.log(1 + cfg.margin_gen_ppl_rel),
          "accuracy": lambda cfg: cfg.margin_accuracy_pts}
JUDGE = {"mauve": "mauve", "log_ppl": "gen_ppl"}

Evaluator = Callable[[Inputs, Entry, Claim, Rules], None]
EVIDENCE: dict[str, Evaluator] = {}


def evaluator(fn: Evaluator) -> Evaluator:
    """Register `fn` as an evaluator under its own name, the name an `Entry.evidence` gives."""
    EVIDENCE[fn.__name__] = fn
    return fn


def measure(e: Entry, inp: Inputs, rules: Rules) -> Claim:
    """The claim entry `e` declares, its templates filled for this profile, measured by its evaluator."""
    cfg = inp.params.claims
    T = None if e.budget is None else inp.budget(e.budget)

    def text(template: str) -> str:
        return template.format(T=T, claims=cfg)

    c = Claim(e.id, text(e.claim), e.paper, e.kind, test=text(e.test), source=text(e.source), paper_value=e.paper_value,
              margin=MARGIN[e.metric](cfg) if e.kind in (EQUIVALENCE, NON_INFERIORITY) else None, covers=e.covers,
              n_unit=e.n_unit, rests_on=e.rests_on, judged_by=JUDGE.get(e.metric), family=e.family,
              mechanism=e.mechanism, speed=e.speed, metric=e.metric)
    if e.kind == DIRECTION and e.metric in MARGIN:  # a direction finding's smallest effect of interest
        c.extra["smallest_effect"] = MARGIN[e.metric](cfg)
    EVIDENCE[e.evidence](inp, e, c, rules)
    if e.speed and usable(c.value):
        _speed_condition(c, rules, e.paper_bound)
    return c


def _speed_condition(c: Claim, rules: Rules, paper_bound: str) -> None:
    """A speed finding's size: reproduced only when measured / FLOP-bound (its evaluator's
    c.extra["measured_over_bound"]) lies in [claims.speed_bound_lo, claims.speed_bound_hi]; the
    paper's own measured / bound at its settings in the notes beside it."""
    mb = c.extra.get("measured_over_bound")
    lo, hi = rules.speed_bound_lo, rules.speed_bound_hi
    if usable(mb):
        c.conditions.append((f"measured / FLOP-bound {mb:.2f} outside [{lo:g}, {hi:g}]", lo <= mb <= hi, INCONCLUSIVE))
    else:
        c.conditions.append(("no FLOP bound counted for this speed-up", False, INCONCLUSIVE))
    if paper_bound:
        c.notes = (c.notes + "; " if c.notes else "") + paper_bound + (
            f" (this run's: {mb:.2f})" if usable(mb) else "")


def _fmt(v: float | None, se: float | None = None, digits: int = 3, suffix: str = "") -> str:
    if v is None or not math.isfinite(v):
        return "–"
    if se is None or not math.isfinite(se):
        return f"{v:.{digits}f}{suffix}"
    return f"{v:.{digits}f}{suffix} ± {se:.{digits}f}{suffix}"


def _pct(log_ratio: float) -> str:
    return f"{100 * (math.exp(log_ratio) - 1):+.1f} %"


def _df(c: Claim) -> str:
    return "" if c.df is None else f", t with {c.df:g} df"


# --------------------------------------------------------------------------- implementation checks


@evaluator
def layer_calls(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """Layer calls of rows[0] (TADM) relative to rows[1] (MDLM) at T = budget x L, counted at this
    profile's depths from the sampling records, against the design's ratio at this run's K and
    depths (C_cache / C_MDLM, Sec. 3.3): the paper's figure when the profile keeps the paper's K,
    another K's own ratio otherwise."""
    T = inp.budget(e.budget)
    t, m = (inp.cell(row, T) for row in e.rows)
    if not (t and m and t.get("layer_calls") and m.get("layer_calls")):
        return
    K, depths = inp.refresh(T), inp.params.model
    design = cached_layer_calls(T, K, depths.anchor_layers, depths.denoiser_layers) / (T * depths.mdlm_layers)
    c.value = t["layer_calls"] / m["layer_calls"]
    paper_K = PAPER_REFRESH_SCHEDULE.get(PAPER_L * e.budget)
    c.shown = f"{c.value:.4f}x (T = {T}, K = {K})" + (
        "" if K == paper_K else f"; the paper's K = {paper_K}: this K's design ratio is {design:.4f}x")
    c.verdict = exact(c.value, design)


@evaluator
def layer_calls_paper_depths(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """Layer calls of rows[0] relative to rows[1] at the paper's T = budget x 1024, counted at the
    paper's depths (the compute_column stage), against the paper's ratio."""
    cc = inp.compute_column or {}
    T = PAPER_L * e.budget
    a, b = (f"T{T}_{row}" for row in e.rows)
    if a in cc and b in cc:
        c.value = cc[a] / cc[b]
        c.shown = f"{c.value:.4f}x (T = {T})"
        c.verdict = exact(c.value, e.paper_value)


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


# --------------------------------------------------------------------------- findings: speed


@evaluator
def paired_throughput(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """rows[0]'s throughput over rows[1]'s at T = budget x L, minus 1: the throughput stage's
    timing blocks combined (exp of the mean block log ratio, se = sqrt(max(between-, within-block var) / B) on
    B - 1 df), with its measured / FLOP-bound ratio and the within- / between-block parts in the
    notes; the paper's figure placed against this run's interval."""
    T = inp.budget(e.budget)
    if inp.throughput is None or T is None:
        return
    a, b = e.rows
    try:
        ratio, se = throughput_results.paired_ratio(inp.throughput, T, a, b)
        entry = throughput_results.ratio_entry(inp.throughput, T, a, b) or {}
    except KeyError:
        return
    c.value, c.se, c.n = ratio - 1.0, se, inp.throughput.get("blocks")
    c.df = entry.get("df")
    bound = throughput_results.bound_ratio(inp.throughput, T, a, b)
    if usable(bound):
        c.extra["measured_over_bound"] = ratio / bound
    c.shown = (_fmt(ratio, se, 2, "x") + f" (T = {T}, K = {inp.refresh(T)}, batch {inp.throughput.get('batch')}"
               + (f"; measured / FLOP-bound {ratio / bound:.2f}" if usable(bound) else "") + ")")
    c.notes = f"{paper_position(ratio, se, *e.paper_ratio, rules=rules)} ({c.paper})"
    if entry.get("blocks"):
        c.notes += ("; blocks " + ", ".join(f"{x:.2f}x" for x in entry["blocks"])
                    + (f", log sd within {entry['within_sd']:.3f} / between {entry['between_sd']:.3f}"
                       if entry.get("within_sd") is not None and entry.get("between_sd") is not None else "")
                    + (f", Q = {entry['q']:.1f} on {entry['q_df']} df" if entry.get("q") is not None else ""))
    one = throughput_results.batch1_ratio(inp.throughput, T, a, b)
    if one is not None:
        c.notes += f"; at batch 1: {_fmt(one[0], one[1], 2, 'x')}"


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
        per.append(f"{name}: {_fmt(r, se, 2, 'x')} at K = {kmax}" + (f", measured / FLOP-bound {r / bound:.2f}"
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
    c.shown = _fmt(ratio, se, 2, "x") + f" ({'; '.join(per)})"
    c.notes = f"{paper_position(ratio, se, *e.paper_ratio, rules=rules)} ({c.paper})"


# --------------------------------------------------------------------------- findings: Table 2


def _replicated(inp: Inputs, metric: str, a_row: str, b_row: str, T: int | None) -> dict | None:
    """a - b in `metric` ("mauve": MAUVE(a) - MAUVE(b); "log_ppl": log(PPL a / PPL b)) over the
    training runs both rows were drawn from (the package docstring): {"value", "se", "df", "n"
    (samples per draw), "runs", "per_seed", "pool", "main" (the tables' run: value, se)}; None when
    a row has no draw. With fewer than two runs of each (no training variance measured) value and
    se are the tables' run's alone and "pool" is None."""
    if T is None or inp.params.eval.bootstrap < 2:
        return None
    got = inp.paired_diffs(metric, a_row, b_row, T)
    seeds = sorted(got["per_seed"])
    if not seeds:
        return None
    per = {s: got["per_seed"][s][0] for s in seeds}
    var = {s: got["per_seed"][s][1] for s in seeds}
    main = inp.params.seed if inp.params.seed in per else seeds[0]
    pool = inp.pool(metric, T) if len(seeds) >= 2 else None
    out = {"n": got["n"], "runs": len(seeds), "per_seed": per, "pool": pool,
           "main": (per[main], math.sqrt(var[main]))}
    if pool is None:
        return out | {"value": per[main], "se": math.sqrt(var[main]), "df": None}
    a, b = inp.cells(metric, a_row, T), inp.cells(metric, b_row, T)  # mean(a) - mean(b) = the mean paired difference
    value, se = replicated_difference([a[s][0] for s in seeds], [b[s][0] for s in seeds],
                                      sum(var.values()) / len(seeds) ** 2, pool)
    return out | {"value": value, "se": se, "df": pool.df}


def _covers(got: dict, metric: str) -> str:
    sampled = "samples and references" if metric == "mauve" else "samples"
    if got["pool"] is None:
        return f"{sampled} (paired bootstrap) of one training run per model: no training variance"
    return (f"training runs ({got['runs']} per model; between-run variance pooled over the replicated rows, "
            f"{got['pool'].df} df) and each run's {sampled} (paired bootstraps)")


def _mean_cells(inp: Inputs, metric: str, row: str, T: int, seeds) -> float:
    cells = inp.cells(metric, row, T)
    return sum(cells[s][0] for s in seeds) / len(seeds)


@evaluator
def table2_quality(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """rows[0] - rows[1] (sign -1: rows[1] - rows[0]) of `metric` ("mauve" or "log_ppl") at
    T = budget x L, over the training runs both rows were drawn from; the claim rests on both
    rows' checkpoints."""
    a_row, b_row = e.rows
    T = inp.budget(e.budget)
    c.rests_on = tuple(sorted({row_model(a_row), row_model(b_row)}))
    c.extra["separately_trained"] = row_model(a_row) != row_model(b_row)
    c.extra["compared"] = {"rows": (a_row, b_row), "T": T, "metric": e.metric}  # what the preconditions check
    got = _replicated(inp, e.metric, a_row, b_row, T)
    if not got:
        return
    c.value, c.se, c.df, c.n = e.sign * got["value"], got["se"], got["df"], got["n"]
    c.training = got["pool"]
    c.training_arms = (got["runs"], got["runs"]) if got["pool"] else None
    c.covers = _covers(got, e.metric)
    seeds = sorted(got["per_seed"])
    # the rows in the claim's (and the paper column's) order; the effect named where it runs b vs a
    effect = "" if e.sign > 0 else f"{_short(b_row)} vs {_short(a_row)} "
    if e.metric == "mauve":
        va, vb = (_mean_cells(inp, "mauve", r, T, seeds) for r in (a_row, b_row))
        c.shown = (f"{va:.3f} vs {vb:.3f} (mean of {len(seeds)} training runs): {effect}diff {_fmt(c.value, c.se)}"
                   f"{_df(c)} (T = {T})")
    else:
        va, vb = (math.exp(_mean_cells(inp, "log_ppl", r, T, seeds)) for r in (a_row, b_row))
        c.shown = (f"{va:.1f} vs {vb:.1f} (geometric mean of {len(seeds)} training runs): {effect}{_pct(c.value)} "
                   f"(± {100 * c.se:.1f} %{_df(c)}; T = {T})")
    runs = "; ".join(f"seed {s}: {e.sign * d:+.3f}" for s, d in got["per_seed"].items())
    c.notes = f"per training run ({'MAUVE diff' if e.metric == 'mauve' else 'log ratio'}): {runs}"
    if got["pool"] is not None:
        c.notes += (f"; between-run sd {got['pool'].sd_between:.3f} (pooled per-run variance {got['pool'].var_runs:.2e}, "
                    f"its within-run part {got['pool'].var_within:.2e} subtracted)")


@evaluator
def refresh_sweep(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """log(Gen PPL at the sweep's largest fixed K / at K = 1), paired over samples of one trained
    model, with the compute ratio and the MAUVE of both ends."""
    fixed = {}
    for r in inp.sweep:
        for T, m in r["budgets"].items():
            pol = str(m.get("policy"))
            if pol.startswith("FixedInterval(K="):
                fixed[int(pol.split("=")[1].rstrip(")"))] = (r["_name"], int(T), r["row"], m)
    if 1 not in fixed or len(fixed) <= 1:
        return
    kmax = max(fixed)
    (n1, T, row, lo), (nk, _, _, hi) = fixed[1], fixed[kmax]
    if inp.params.eval.bootstrap < 2:
        return
    got = inp.paired_ratio(f"samples/sweep/{nk}/{row}", f"samples/sweep/{n1}/{row}", T)
    if got is None:
        return
    c.value, c.se, c.n = got
    compute = hi["layer_calls"] / lo["layer_calls"]
    c.covers = "samples (paired bootstrap); one trained model on both sides (its variation over training runs not drawn)"
    c.shown = (f"Gen PPL {lo['gen_ppl']:.1f} (K = 1) -> {hi['gen_ppl']:.1f} (K = {kmax}): {_pct(c.value)} "
               f"(± {100 * c.se:.1f} %); MAUVE {lo['mauve']:.3f} -> {hi['mauve']:.3f}; compute {compute:.3f}x")
    c.conditions.append((f"compute did not fall with K ({compute:.3f}x the layer calls of K = 1)", compute < 1,
                         CONTRADICTED))


# --------------------------------------------------------------------------- findings: staleness


def _f(row: dict, key: str) -> float:
    v = row.get(key)
    return float(v) if v not in (None, "") else float("nan")


def _growth(after: float, before: float) -> float:
    """after / before: a KL's growth from cache age 1; inf when it starts at exactly 0 and
    grows, nan when it stays 0."""
    if before > 0:
        return after / before
    return math.inf if after > 0 else math.nan


def _staleness_rows(inp: Inputs, c: Claim) -> dict[int, dict] | None:
    """The staleness summary's rows by cache age, with `c`'s n (its sequences); None when it has no
    age beyond 1, or predates the per-sequence columns (the reason in `c`'s notes)."""
    rows = {int(float(r["age"])): r for r in inp.staleness or []}
    if 1 not in rows or max(rows) <= 1:
        return None
    if "growth_reused_se" not in rows[1] or "recovery_vs_reused_mean" not in rows[1]:
        c.notes = "paper_figures/anchor_staleness.csv predates the per-sequence and mean-recovery columns: rerun dvc repro staleness"
        return None
    n = rows[1].get("sequences")
    c.n = int(float(n)) if n not in (None, "") else None
    return rows


@evaluator
def staleness_growth(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """The anchor's own staleness: KL(fresh || the prediction served again from step i - k)
    (kl_reused) at the largest cache age over age 1, minus 1; the fusion's KL beside it."""
    rows = _staleness_rows(inp, c)
    if rows is None:
        return
    top = max(rows)
    k1, kk = _f(rows[1], "kl_reused"), _f(rows[top], "kl_reused")
    f1, fk = _f(rows[1], "kl_fused"), _f(rows[top], "kl_fused")
    g, gse = _f(rows[top], "growth_reused"), _f(rows[top], "growth_reused_se")
    if math.isfinite(g):
        c.value, c.se = g - 1.0, gse
    else:  # KL 0 at age 1: the growth is the KL at the top age itself
        c.value, c.se = kk, _f(rows[top], "kl_reused_se")
    fused = f"{_growth(fk, f1):.1f}x" if f1 > 0 else "unbounded" if fk > 0 else "none"
    c.shown = (f"{_fmt(g, gse, 1, 'x')} (KL {k1:.2e} at age 1 -> {kk:.2e} at age {top} nats/token; "
               f"after the fusion {f1:.2e} -> {fk:.2e}, {fused})")


@evaluator
def fusion_recovery(inp: Inputs, e: Entry, c: Claim, rules: Rules) -> None:
    """The fusion's recovery of the staleness gap: the mean over ages of 1 - kl_fused / kl_reused;
    against the fusion bypassed (D(h_stale)) beside it."""
    rows = _staleness_rows(inp, c)
    if rows is None:
        return
    c.value, c.se = _f(rows[1], "recovery_vs_reused_mean"), _f(rows[1], "recovery_vs_reused_mean_se")
    bypass = _f(rows[1], "recovery_mean")
    c.shown = (_fmt(c.value, c.se) + " of KL(fresh || stale prediction re-served) closed"
               + (f"; against the fusion bypassed, D(h_stale): {_fmt(bypass, _f(rows[1], 'recovery_mean_se'))}"
                  if math.isfinite(bypass) else ""))


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
    c.shown = (f"{_fmt(c.value, c.se, 1, ' pts')}{_df(c)} (K = {k} vs {'the ' + ref_family if ref_family in ('base', 'control') else ref[0]}"
               f"; {len(tasks)} task{'s' if len(tasks) > 1 else ''} pooled, {c.n} examples)")
    c.notes = "; ".join(f"{name}: {_fmt(d, se, 1, ' pts')} ({n} examples)" for name, (d, se, n) in per.items())
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
    """Accuracy of rows[0] at the largest K against the training-free cache named in
    claims.training_free_comparator at the same K (named before the run), pooled over the tasks;
    every K and the cache's compute, speed and shared completions in the notes."""
    a, name = e.rows[0], inp.params.claims.training_free_comparator
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
