"""Table 1 as a table, from results/table1.json: the pandas frame (one line per task and method,
:func:`frame`), each family's AUP over its settings (:func:`aup_frame`), its Markdown with the
notes under it (paper_figures/table1.md, :func:`to_markdown`) and the figures of
metrics/table1.json (:func:`metrics_dict`)."""

from __future__ import annotations

import math
import statistics

from tadm.errors import DataError
from tadm.experiments.table1_stats import trained_row
from tadm.metrics import aup as aup_score
from tadm.registry import DG_CACHES

MATCHED = 0.01  # a cache row is at TADM's budget when their compute columns differ by at most this
FIRST_FAMILIES = ("base", "control", "tadm")  # the table's row order, then the caches' (results/table1.json sorts its keys)


def families() -> tuple[str, ...]:
    """Table 1's row families in the table's order: the base, the control, TADM, then each
    training-free cache of `tadm.registry.DG_CACHES` in its order."""
    return (*FIRST_FAMILIES, *DG_CACHES.names())


def _require(m: dict, keys: tuple[str, ...], source: str = "results/table1.json") -> None:
    missing = [k for k in keys if k not in m]
    if missing:
        raise DataError(f"{source}: a method has no {', '.join(missing)} (written by an older tadm): rerun dvc repro table1")


def _nan(x) -> float:
    return float("nan") if x is None else float(x)


def frame(results: dict):
    """Table 1 as a pandas frame: one line per (task, method), its accuracy the mean over the row's
    fusion runs (the main run alone for an untrained row) and its Δ columns those of
    :func:`add_statistics`. A training-free cache's row also gets its Δ vs the TADM row at the same
    K and whether its compute matches TADM's; a TADM row, how often it wrote the fusion-bypassed
    row's completion."""
    import pandas as pd  # lazy: pandas takes ~0.4 s to import; only the frame needs it

    lines, order_of = [], families()
    _require(results, ("canvas_length", "steps"))
    # the leaderboard's tokens per forward: every row decodes a canvas in the sampler's fixed steps
    tpf = aup_score.tokens_per_forward(results["canvas_length"], results["steps"])
    for task, r in results["tasks"].items():
        _require(r, ("between_run",))
        base = r["methods"]["Base"]
        between = r["between_run"] or {}
        for m in r["methods"].values():
            _require(m, ("family", "layer_calls_weighted", "seeds", "delta_vs_base", "delta_vs_control",
                         "accuracy_mean_runs"))
            if m["family"] in DG_CACHES:
                _require(m, ("same_output_as_tadm",))
            if m["family"] in ("tadm", "control"):
                _require(m, ("runs",))
        tadm = {m["refresh_every"]: m for m in r["methods"].values() if m["family"] == "tadm"}
        order = sorted(r["methods"].items(), key=lambda lm: (order_of.index(lm[1]["family"]), lm[1]["refresh_every"] or 0))
        for label, m in order:
            speedup, speedup_se, dec_speedup = m["throughput_x"], m["throughput_se"], m["decoder_speedup_x"]
            bound = base["flops"] / m["flops"]
            dec_bound = base["decoder_flops"] / m["decoder_flops"]
            compute = m["layer_calls_weighted"] / base["layer_calls_weighted"]
            ref = tadm.get(m["refresh_every"]) if m["family"] in DG_CACHES else None
            matched = (None if ref is None
                       else abs(compute - ref["layer_calls_weighted"] / base["layer_calls_weighted"]) <= MATCHED)
            runs = m.get("runs") or []
            replicated = trained_row(m) and between and len(runs) > 0
            bypass = [x.get("same_output_as_bypass") for x in runs if x.get("same_output_as_bypass") is not None]
            lines.append({"task": task, "method": label, "family": m["family"], "refresh_every": m["refresh_every"],
                          "accuracy": m["accuracy_mean_runs"], "accuracy_main_run": m["accuracy"],
                          # the ± of the accuracy: a trained row's pooled sd of one run's accuracy over
                          # fusion runs (with its sampling noise), else the sd over sampling seeds
                          "sd": math.sqrt(between["var_runs"]) if replicated else m["accuracy_sd"],
                          "runs": len(runs) if runs else 1, "seeds": len(m["seeds"]),
                          "run_accuracies": "/".join(f"{x['accuracy']:.1f}" for x in runs),
                          "run_seeds": "/".join(str(x["seed"]) for x in runs),
                          "delta_pts": m["delta_vs_base"], "delta_se": _nan(m["delta_vs_base_se"]),
                          "delta_control_pts": _nan(m["delta_vs_control"]), "delta_control_se": _nan(m["delta_vs_control_se"]),
                          "delta_tadm_pts": _nan(m.get("delta_vs_tadm")), "delta_tadm_se": _nan(m.get("delta_vs_tadm_se")),
                          "matched": matched,
                          "same_as_tadm": _nan(m.get("same_output_as_tadm")),
                          "same_as_bypass": _nan(m.get("same_output_as_bypass")),
                          "same_as_bypass_runs": "/".join(f"{x:.0%}" for x in bypass) if len(bypass) > 1 else "",
                          "between_var": _nan(between.get("var_between")), "between_var_runs": _nan(between.get("var_runs")),
                          "between_var_within": _nan(between.get("var_within")), "between_df": _nan(between.get("df")),
                          "tokens_per_s": m["tokens_per_s"],
                          "throughput_x": speedup, "throughput_se": speedup_se,
                          "layer_calls": m["layer_calls"], "compute_x": compute,
                          # tokens per full-model-equivalent forward: the base runs every layer per call
                          "tokens_per_forward": tpf, "rho_equivalent": tpf / compute,
                          "flop_bound_x": bound, "measured_over_bound": speedup / bound,
                          "decoder_share": statistics.median(m["decoder_seconds"]) / statistics.median(m["seconds"]),
                          "decoder_speedup_x": dec_speedup, "decoder_bound_x": dec_bound,
                          "decoder_measured_over_bound": dec_speedup / dec_bound})
    return pd.DataFrame(lines)


def aup_frame(df):
    """AUP (`tadm.metrics.aup`, the d3LLM leaderboard's score) of every Table 1 family with at least
    two settings (its K's), per task: over tokens per forward (the leaderboard's rho) and over
    tokens per full-model-equivalent forward (this project's reading, which sees a cache's cheaper
    forwards); y_max the task's best row (the base included), y a row's accuracy."""
    import pandas as pd  # lazy: pandas takes ~0.4 s to import; only the AUP frame needs it

    lines = []
    for task in dict.fromkeys(df.task):
        t = df[df.task == task]
        y_max = float(t.accuracy.max())
        for family in dict.fromkeys(t.family):
            f = t[t.family == family]
            if len(f) < 2:
                continue
            ys = [float(y) for y in f.accuracy]
            score = {rho: (aup_score.aup([float(x) for x in f[rho]], ys, y_max) if y_max > 0 else None)
                     for rho in ("tokens_per_forward", "rho_equivalent")}
            lines.append({"task": task, "family": family, "settings": "/".join(f"K={int(k)}" for k in f.refresh_every),
                          "y_max": y_max, "aup_tpf": score["tokens_per_forward"], "aup_equivalent": score["rho_equivalent"],
                          "unscored": aup_score.unscored_reason(list(f.rho_equivalent), ys) or ""})
    return pd.DataFrame(lines, columns=["task", "family", "settings", "y_max", "aup_tpf", "aup_equivalent", "unscored"])


def _aup_cell(v) -> str:
    return "not scored" if v is None or v != v else f"{v:.1f}"


def _aup_markdown(df) -> str:
    a = aup_frame(df)
    if not len(a):
        return ""
    rows = "".join(f"| {r.task} | {r.family} | {r.settings} | {_aup_cell(r.aup_tpf)} | {_aup_cell(r.aup_equivalent)} |\n"
                   for r in a.itertuples())
    return ("\n**AUP** (accuracy under parallelism, the d3LLM leaderboard's score; `tadm.metrics.aup`, its constants "
            f"alpha = {aup_score.ALPHA:g}, offset = {aup_score.OFFSET:g}; docs/glossary.md) of each family with two "
            "settings or more, y_max the task's best row. Tokens per forward is the leaderboard's axis: here every row "
            "decodes a canvas in the sampler's fixed steps, so it is the same for all, every trapezoid has zero width "
            "and the score is that rho times the accuracy at the family's first setting; tokens per full-model-equivalent forward (layer calls / layers, this project's reading) sees a "
            "cache's or TADM's cheaper forwards.\n\n"
            "| Task | Family | Settings | AUP (tokens per forward) | AUP (tokens per full-model-equivalent forward) |\n"
            "|---|---|---|---|---|\n" + rows)


def speed_cell(v: float, se: float | None) -> str:
    """A speed-up as a table cell, with its ± where there is one (None / NaN: a single batch)."""
    return f"{v:.2f}x" if se is None or se != se else f"{v:.2f}x ± {se:.2f}x"


def _pm(v: float, se: float) -> str:
    """A Δ cell: its value ± se; no ± where there is no se (one example)."""
    return "–" if v != v else f"{v:+.1f}" if se != se else f"{v:+.1f} ± {se:.1f}"


def _vs_tadm(r) -> str:
    """The Δ vs TADM cell: a cache row's Δ and how often it wrote TADM's very completion,
    marked where its compute is not TADM's."""
    cell = _pm(r.delta_tadm_pts, r.delta_tadm_se)
    if r.same_as_tadm == r.same_as_tadm:  # NaN off the cache rows
        cell += f"; {r.same_as_tadm:.0%} same text"
    return cell if r.matched is None or r.matched != r.matched or r.matched else f"{cell} (unmatched)"


def _accuracy_cell(r) -> str:
    runs = int(r.runs) if r.runs == r.runs else 1
    return f"{r.accuracy:.1f} ± {r.sd:.1f}" + (f" ({runs} runs)" if runs > 1 else "")


def _notes_of(df) -> str:
    """The lines under the table: each task's fusion runs and between-run variance, and how often
    TADM wrote the fusion-bypassed row's completion."""
    out = []
    for task in dict.fromkeys(df.task):
        t = df[df.task == task]
        trained = t[t.run_accuracies.astype(bool) & t.family.isin(["tadm", "control"]) & (t.runs > 1)]
        if len(trained):
            b = trained.iloc[0]
            seeds = b.run_seeds.replace("/", ", ")
            runs = "; ".join(f"{r.method} {r.run_accuracies.replace('/', ', ')}" for r in trained.itertuples())
            pooled = ("" if b.between_var != b.between_var else
                      f" Between-run variance of a run's accuracy, pooled over TADM (K ≥ 2) and the control: "
                      f"{b.between_var:.2f} pts² (" + (
                          f"the runs' variance {b.between_var_runs:.2f} minus their mean sampling variance "
                          f"{b.between_var_within:.2f}" if b.between_var_within > 0 else
                          "the runs' variance taken whole: the runs share their sampling seeds, so their sampling "
                          "noise is not subtracted") +
                      f"; {int(b.between_df)} df); it enters the ± and every Δ se of a trained row.")
            out.append(f"**{task}, fusion runs** (training seeds {seeds}; each fusion on the same frozen base, "
                       f"accuracy in %): {runs}.{pooled}")
        bypass = t[(t.family == "tadm") & t.same_as_bypass.notna()]
        if len(bypass):
            cells = ", ".join(f"{r.same_as_bypass:.0%} at K = {int(r.refresh_every)}"
                              + (f" (fusion runs: {r.same_as_bypass_runs})" if r.same_as_bypass_runs else "")
                              for r in bypass.itertuples())
            out.append(f"**{task}, does the fusion act?** TADM writes the fusion-bypassed row's (naive reuse, the "
                       f"same K) very completion on {cells} of (example, seed).")
    return "".join(f"\n{line}\n" for line in out)


def _caches_note(df) -> str:
    """Each training-free cache of the table, by its unit's label and description (DG_CACHES)."""
    present = set(df.family)
    return "".join(f"*{DG_CACHES[name].label}* {DG_CACHES[name].description} " for name in DG_CACHES.names()
                   if name in present)


def to_markdown(df) -> str:
    head = ("| Task | Method | Accuracy (%) | Δ vs base (pts) | Δ vs control (pts) | Δ vs TADM, same K (pts) | Tokens/s "
            "| Throughput | Compute | FLOP bound | measured/bound | decoder share of time | decoder speed-up "
            "| decoder FLOP bound | measured/bound |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r.task} | {r.method} | {_accuracy_cell(r)} | {_pm(r.delta_pts, r.delta_se)} | "
        f"{_pm(r.delta_control_pts, r.delta_control_se)} | {_vs_tadm(r)} | {r.tokens_per_s:,.0f} | "
        f"{speed_cell(r.throughput_x, r.throughput_se)} | {r.compute_x:.2f}x | {r.flop_bound_x:.2f}x | {r.measured_over_bound:.2f} | "
        f"{r.decoder_share:.0%} | {r.decoder_speedup_x:.2f}x | {r.decoder_bound_x:.2f}x | {r.decoder_measured_over_bound:.2f} |\n"
        for r in df.itertuples())
    seeds = ", ".join(f"{r.method} {int(r.seeds)}" for r in df.drop_duplicates("family").itertuples())
    note = ("\nAccuracy: the mean over the row's fusion runs (TADM, control: the main run and its replicates, each "
            "trained with its own seed and decoded on the same frozen base; the other rows are not trained) and "
            "sampling seeds, ± the sd of one fusion run's accuracy over training runs (pooled, with its sampling noise) "
            "for TADM (K ≥ 2) and the control, else the sd over sampling seeds. "
            "Δ: accuracy minus the base's / the control's / the TADM row's at the same K, ± its se: the bootstrap over "
            "examples of the per-example differences of the means over runs and seeds, plus the between-run variance "
            "over n runs for each trained side (tadm.metrics.replicates); \"same text\": the share of (example, seed) "
            "where a cache row wrote exactly TADM's completion. "
            f"Sampling seeds per row ({seeds}): the training-free caches decode at more seeds (posttrain.cache_seeds); "
            "throughput and compute are counted at the seeds every row decodes, with the main fusion runs. "
            "Control: the same fusion recipe (data, steps, seed, CE + KD) trained and evaluated with the anchor "
            "recomputed at every step; Δ vs control isolates anchor reuse from the fine-tuning of the CE term. "
            "Throughput: in each timing block (the scored pass and timing.table1_blocks - 1 timing-only processes "
            "on prompt batches and a sampling seed of their own) the median over prompt batches of the base's time / "
            "the method's on the same batch (the methods take turns on every batch); across blocks exp(mean of the "
            "blocks' log ratios) ± sqrt(max(between-block, within-block variance) / blocks) on blocks - 1 df. Decoder speed-up: the scored pass's median, the "
            "same way. "
            "Compute: decoder-layer calls over the base's, a partly recomputed layer counted at its share of the "
            f"canvas rows; a cache row is at TADM's budget when the two differ by at most {MATCHED:g} (else \"unmatched\").\n"
            + _notes_of(df) +
            "\nTraining-free caches (`tadm.caches`), on the same frozen base and sampler: " + _caches_note(df)
            + "Fast-dLLM's prefix KV cache is built into every row: DiffusionGemma's causal encoder writes the K/V of the prompt and of "
            "finished canvases once per canvas and the denoising steps only read them (exact here, as the base is "
            "block-causal), so *TADM + prefix cache* is the TADM row, and Fast-dLLM's dual cache has no suffix to act "
            "on.\n" + _aup_markdown(df))
    return head + body + note


def metrics_dict(df) -> dict:
    out = {}
    for r in df.itertuples():
        key = f"{r.task}_{r.method.replace(' ', '').replace('=', '').replace('(', '').replace(')', '')}"
        deltas = {f"{key}_delta_pts": round(r.delta_pts, 3)}
        if r.delta_se == r.delta_se:
            deltas[f"{key}_delta_se"] = round(r.delta_se, 3)
        if r.delta_control_pts == r.delta_control_pts:  # NaN without a control row
            deltas[f"{key}_delta_control_pts"] = round(r.delta_control_pts, 3)
        if r.delta_tadm_pts == r.delta_tadm_pts:  # a training-free cache's row
            deltas[f"{key}_delta_tadm_pts"] = round(r.delta_tadm_pts, 3)
            deltas[f"{key}_same_output_as_tadm"] = round(r.same_as_tadm, 4)
        if r.same_as_bypass == r.same_as_bypass:  # a TADM row with a naive row at its K
            deltas[f"{key}_same_output_as_bypass"] = round(r.same_as_bypass, 4)
        out.update({f"{key}_accuracy": round(r.accuracy, 3), **deltas, f"{key}_throughput_x": round(r.throughput_x, 4),
                    f"{key}_compute_x": round(r.compute_x, 4), f"{key}_measured_over_bound": round(r.measured_over_bound, 4),
                    f"{key}_decoder_measured_over_bound": round(r.decoder_measured_over_bound, 4)})
    for r in aup_frame(df).itertuples():
        for rho in ("tpf", "equivalent"):
            v = getattr(r, f"aup_{rho}")
            if v is not None and v == v:
                out[f"{r.task}_{r.family}_aup_{rho}"] = round(v, 3)
    for task in dict.fromkeys(df.task):
        b = df[df.task == task].iloc[0]
        if b.between_var == b.between_var:
            out[f"{task}_between_run_var"] = round(b.between_var, 4)
            out[f"{task}_between_run_df"] = int(b.between_df)
    return out
