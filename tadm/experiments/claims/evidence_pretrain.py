"""The evaluators of the pretraining findings and checks: Table 2's counted layer calls, its
throughput across timing blocks, its quality differences over training runs (MAUVE, Gen PPL),
the refresh sweep and the staleness measurements (`evidence` registers each by its name)."""

from __future__ import annotations

import math

from tadm.compute import cached_layer_calls
from tadm.experiments import throughput_results
from tadm.experiments.claims.claim import CONTRADICTED, Claim, Entry
from tadm.experiments.claims.evidence import PAPER_L, df_note, evaluator, fmt, pct, row_model, short
from tadm.experiments.claims.inputs import Inputs
from tadm.experiments.claims.rules import Rules, exact, paper_position, usable
from tadm.metrics.replicates import replicated_difference
from tadm.sampling.anchor_cache import PAPER_REFRESH_SCHEDULE


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
    c.shown = (fmt(ratio, se, 2, "x") + f" (T = {T}, K = {inp.refresh(T)}, batch {inp.throughput.get('batch')}"
               + (f"; measured / FLOP-bound {ratio / bound:.2f}" if usable(bound) else "") + ")")
    c.notes = f"{paper_position(ratio, se, *e.paper_ratio, rules=rules)} ({c.paper})"
    if entry.get("blocks"):
        c.notes += ("; blocks " + ", ".join(f"{x:.2f}x" for x in entry["blocks"])
                    + (f", log sd within {entry['within_sd']:.3f} / between {entry['between_sd']:.3f}"
                       if entry.get("within_sd") is not None and entry.get("between_sd") is not None else "")
                    + (f", Q = {entry['q']:.1f} on {entry['q_df']} df" if entry.get("q") is not None else ""))
    one = throughput_results.batch1_ratio(inp.throughput, T, a, b)
    if one is not None:
        c.notes += f"; at batch 1: {fmt(one[0], one[1], 2, 'x')}"


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
    effect = "" if e.sign > 0 else f"{short(b_row)} vs {short(a_row)} "
    if e.metric == "mauve":
        va, vb = (_mean_cells(inp, "mauve", r, T, seeds) for r in (a_row, b_row))
        c.shown = (f"{va:.3f} vs {vb:.3f} (mean of {len(seeds)} training runs): {effect}diff {fmt(c.value, c.se)}"
                   f"{df_note(c)} (T = {T})")
    else:
        va, vb = (math.exp(_mean_cells(inp, "log_ppl", r, T, seeds)) for r in (a_row, b_row))
        c.shown = (f"{va:.1f} vs {vb:.1f} (geometric mean of {len(seeds)} training runs): {effect}{pct(c.value)} "
                   f"(± {100 * c.se:.1f} %{df_note(c)}; T = {T})")
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
    c.shown = (f"Gen PPL {lo['gen_ppl']:.1f} (K = 1) -> {hi['gen_ppl']:.1f} (K = {kmax}): {pct(c.value)} "
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
    c.shown = (f"{fmt(g, gse, 1, 'x')} (KL {k1:.2e} at age 1 -> {kk:.2e} at age {top} nats/token; "
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
    c.shown = (fmt(c.value, c.se) + " of KL(fresh || stale prediction re-served) closed"
               + (f"; against the fusion bypassed, D(h_stale): {fmt(bypass, _f(rows[1], 'recovery_mean_se'))}"
                  if math.isfinite(bypass) else ""))
