"""Table 2's throughput results: one timing block's file, the blocks combined, the paired ratios
read from them and the Markdown table (the timing itself: `tadm.experiments.throughput`).

Per budget it reports each row's median tokens/s over the rounds (± the bootstrap sd of that
median over rounds) and its speed relative to ADLM and to MDLM as the median over rounds of the
paired per-round ratios (row tokens/s / reference tokens/s in the same round, seconds apart),
± its bootstrap se over rounds -- `tadm.metrics.bootstrap.paired_speedup`, Table 1's estimator.
Beside each ratio: the FLOP-bound speed-up, the reference's FLOPs per generated token over the
row's, both counted by the sampling counters (`tadm.sampling.counters.ComputeCounter`, the
FLOPs of `record["counters"]`) during the very calls that were timed and scaled to a trajectory
like the seconds, and measured / bound (benchmarks/sample_throughput.py's definition: 1 = the
row is exactly as much faster as its FLOPs allow). :func:`paired_ratio` reads (or, for another
reference, computes) one measured ratio, :func:`bound_ratio` one FLOP-bound one, :func:`batch1_ratio`
the measured one at batch 1 (None without a batch-1 timing).

results/throughput.json (``FORMAT`` 2)::

    {"format": 2,
     "rows": [row, ...],                      # the timed rows, in ROWS order
     "references": ["adlm", "mdlm"],          # the rows every ratio is also given against (`speed_references`)
     "rounds": R, "batch": b, "seq_len": L,   # R rounds at batch b (sample.throughput_batch or batch_size)
     "window": W,                             # reverse steps timed per diffusion row, budget and round
     "start_steps": {"<T>": s},               # where every row's window starts, per budget
     "seed": s, "device": <the device, e.g. cuda:0>, "precision": "bf16", "autocast": "bf16"|"fp32",
     "threads": torch threads, "processes": 1,
     "warmup": {"T": first budget, "seconds": {row: s}},   # the untimed run to s(T) (AR: a draw)
     "schedule": [[round, T, row], ...],      # every timed call, in the order it ran (AR: first budget only)
     "budgets": {"<T>": {
         "T": T, "K": K,
         "rounds": [{"round": r, "order": [row, ...], "seconds": {row: s}}, ...],   # R entries
         "rows": {row: {
             "label": Table 2's label, "model_dir": "models/<model>", "sampler": ..., "policy": ...|null,
             "bypass_fusion": bool, "tokens": b x L (the tokens of the trajectory a call stands for),
             "timed": "window" | "draw",      # AR: its whole draw
             "start_step": s | null, "steps_timed": W (AR: L - 1), "trajectory_steps": S (AR: L - 1),
             "scale": S / W (1 for a draw),   # a call's seconds x scale = the trajectory's seconds
             "start_sha256": SHA-256 of the int64 canvas the window starts from | null,
             "masked_at_start": fraction of that canvas still masked | null,
             "tokens_sha256": SHA-256 of the int64 canvas at the end of the timed call (AR: the row
                              stage's first batch when the batch is sample.batch_size),
             "same_every_round": whether every round ended on that same canvas,
             "refresh_steps": [trajectory steps of the anchor refreshes inside the window] | null,
             "counters": what the timed call's ComputeCounter counted (model_calls, reused_calls,
                         anchor_calls, anchor/denoiser_layer_calls, layer_calls, flops, layer_tokens),
             "flops_per_token": counters.flops x scale / tokens,
             "seconds": [s per round, round order], "tokens_per_s": [tokens / (s x scale) per round],
             "tokens_per_s_median": median over rounds, "tokens_per_s_se": bootstrap sd of it | null,
             "vs": {ref: {"ratio": median of paired per-round ratios, "se": bootstrap se | null,
                          "bound": ref flops_per_token / row flops_per_token | null,
                          "measured_over_bound": ratio / bound | null,
                          "measured_over_bound_se": se / bound | null}}}}}},
     "batch1": {"batch": 1, "rounds": R1, "warmup": ..., "schedule": ..., "budgets": ...} | null,
                                              # the same at batch 1 (null: throughput_batch1_rounds 0)
     "setup_seconds": wall seconds of loading and the paused states' trajectories,
     "seconds": total wall seconds of the stage (setup, warm-ups and rounds)}

``write_table`` writes paper_figures/table2_throughput.md from it; Table 2's tokens/s and
"vs ADLM" columns read it (`tadm.experiments.tables.table2_frame`).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from tadm.errors import DataError
from tadm.experiments.table2 import ROWS
from tadm.io import atomic_write_text
from tadm.metrics import invocations
from tadm.metrics.bootstrap import paired_speedup, resamples, spread
FORMAT = 3  # results/throughput.json: the blocks combined (`combine`)
BLOCK_FORMAT = 2  # results/throughput/block_<b>.json: one timing block (`run`)
OUT = Path("results/throughput.json")
BLOCKS_DIR = Path("results/throughput")
TABLE = Path("paper_figures/table2_throughput.md")
# what a timed call's ComputeCounter counted (a resumed window books no trajectory, so its per-token
# and per-trajectory fields would not be that; flops_per_token below is the window's, scaled)
def speed_references(rows=None) -> tuple[str, ...]:
    """The rows every speed ratio is also given against: those with a ``Row.speed_reference``,
    in its rank (ADLM, then MDLM); read when asked, so a row registered later counts."""
    rows = ROWS if rows is None else rows
    refs = sorted((row.speed_reference, name) for name, row in rows.items() if row.speed_reference is not None)
    return tuple(name for _, name in refs)


def _none_if_nan(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _trajectory_seconds(row: dict) -> list[float]:
    """A row's per-round seconds scaled to its whole trajectory (`scale`; 1 when absent)."""
    scale = float(row.get("scale", 1.0))
    return [s * scale for s in row["seconds"]]


def ratio_vs(row: dict, ref: dict) -> tuple[float, float | None]:
    """Median over rounds of row tokens/s / ref tokens/s in the same round, and its bootstrap se
    (None with one round): `paired_speedup` of the two rows' per-round trajectory seconds (the
    ref's scaled by the tokens ratio, 1 when both time the same batch)."""
    scale = row["tokens"] / ref["tokens"]
    ratio, se = paired_speedup([s * scale for s in _trajectory_seconds(ref)], _trajectory_seconds(row))
    return float(ratio), _none_if_nan(se)


def flop_bound(row: dict, ref: dict) -> float | None:
    """The speed-up over `ref` that `row`'s counted FLOPs allow: ref FLOPs per generated token over
    row's (None when either was not counted)."""
    a, b = ref.get("flops_per_token"), row.get("flops_per_token")
    if not a or not b:
        return None
    return float(a) / float(b)


def median_se(values: list[float], B: int = 1000) -> float | None:
    """Bootstrap sd over rounds of the median of `values` (None with fewer than 2)."""
    if len(values) < 2:
        return None
    v = np.asarray(values, np.float64)
    return _none_if_nan(spread(np.median(v[resamples(len(v), B)], axis=1)))


def summarize(budget: dict, references=None) -> None:
    """Fill each row of one budget (its "seconds", "tokens" per call and optionally "scale" and
    "flops_per_token") with tokens/s per round, their median (± se) and, against each reference
    row present (default: `speed_references`), the paired ratio, the FLOP bound and measured / bound."""
    rows = budget["rows"]
    references = speed_references() if references is None else references
    for row in rows.values():
        row["tokens_per_s"] = [row["tokens"] / s for s in _trajectory_seconds(row)]
        row["tokens_per_s_median"] = float(statistics.median(row["tokens_per_s"]))
        row["tokens_per_s_se"] = median_se(row["tokens_per_s"])
    for row in rows.values():
        row["vs"] = {}
        for ref in references:
            if ref in rows:
                ratio, se = ratio_vs(row, rows[ref])
                bound = flop_bound(row, rows[ref])
                row["vs"][ref] = {"ratio": ratio, "se": se, "bound": bound,
                                  "measured_over_bound": None if bound is None else ratio / bound,
                                  "measured_over_bound_se": None if bound is None or se is None else se / bound}


def _section(result: dict, batch: int | None) -> tuple[dict, str]:
    """The timing of `batch` in a result (None: the main one) and how to name it in errors."""
    if batch is None or batch == result.get("batch"):
        return result, "results/throughput.json"
    other = result.get("batch1")
    if batch == 1 and other is not None:
        return other, "results/throughput.json (batch 1)"
    raise KeyError(f"results/throughput.json has no timing at batch {batch} (it has {result.get('batch')}"
                   + (", 1" if other is not None else "") + ")")


def _rows_at(result: dict, T: int, names, batch: int | None) -> dict:
    section, where = _section(result, batch)
    budget = section["budgets"].get(str(int(T)))
    if budget is None:
        raise KeyError(f"{where} has no budget T={T} (it has {sorted(section['budgets'], key=int)})")
    rows = budget["rows"]
    for name in names:
        if name not in rows:
            raise KeyError(f"{where} has no row {name!r} at T={T} (it has {sorted(rows)})")
    return rows


def paired_ratio(result: dict, T: int, row: str, ref: str, *, batch: int | None = None) -> tuple[float, float | None]:
    """`row`'s throughput over `ref`'s at budget T: in a combined result (results/throughput.json)
    exp(mean of the blocks' log ratios) ± its se over the blocks (on ``ratio_entry(...)["df"]`` df), in
    one block the median over rounds of the paired per-round ratios ± its bootstrap se (None with
    one round). Read from the result when it holds it (references adlm, mdlm), else computed the
    same way (a combined result: per block, then combined). `batch`: None (the main timing) or 1
    (the batch-1 one). KeyError when T, `row`, `ref` or the batch was not timed."""
    rows = _rows_at(result, T, (row, ref), batch)
    stored = rows[row].get("vs", {}).get(ref)
    if stored is not None:
        return float(stored["ratio"]), _none_if_nan(stored["se"])
    if result.get("block_results"):
        per = [paired_ratio(b, T, row, ref, batch=batch) for b in result["block_results"]]
        c = invocations.combine([r for r, _ in per], [se for _, se in per])
        return c["ratio"], c["se"]
    return ratio_vs(rows[row], rows[ref])


def bound_ratio(result: dict, T: int, row: str, ref: str, *, batch: int | None = None) -> float | None:
    """The FLOP-bound speed-up of `row` over `ref` at budget T: ref's counted FLOPs per generated
    token over row's, from the timed calls (None when not counted). measured / FLOP-bound is
    ``paired_ratio(...)[0] / bound_ratio(...)``. KeyError as `paired_ratio`."""
    rows = _rows_at(result, T, (row, ref), batch)
    stored = rows[row].get("vs", {}).get(ref)
    if stored is not None and "bound" in stored:
        return _none_if_nan(stored["bound"])
    return flop_bound(rows[row], rows[ref])


def batch1_ratio(result: dict, T: int, row: str, ref: str) -> tuple[float, float | None] | None:
    """`paired_ratio` at batch 1 (the batch-1 timing, ``sample.throughput_batch1_rounds``), or None
    when the result has no batch-1 timing of T, `row` and `ref`."""
    if not result.get("batch1"):
        return None
    try:
        return paired_ratio(result, T, row, ref, batch=1)
    except KeyError:
        return None


def block_path(block: int, directory: str | Path = BLOCKS_DIR) -> Path:
    """Where timing block `block` is written: <directory>/block_<block>.json."""
    return Path(directory) / f"block_{int(block)}.json"


# a block's per-row fields the combined row keeps as they are (the same in every block)
_FIXED = ("label", "model_dir", "sampler", "policy", "bypass_fusion", "tokens", "timed", "steps_timed",
          "trajectory_steps", "scale")


def _gmean(values) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def _combine_section(sections: list[dict], where: str) -> dict:
    """The budgets of one batch's timing (one section per block, block order) combined."""
    first = sections[0]["budgets"]
    budgets = {}
    for T, budget in first.items():
        per = []
        for b, section in enumerate(sections):
            other = section["budgets"].get(T)
            if other is None or set(other["rows"]) != set(budget["rows"]) or other["K"] != budget["K"]:
                raise DataError(f"{where}: block {b} did not time the rows and K of block 0 at T={T}")
            per.append(other)
        rows = {}
        for name, row in budget["rows"].items():
            blocks = [p["rows"][name] for p in per]
            tps = [r["tokens_per_s_median"] for r in blocks]
            log_tps = [math.log(v) for v in tps]
            gm = _gmean(tps)
            ses = [r.get("tokens_per_s_se") for r in blocks]
            within = statistics.fmean((e / v) ** 2 for e, v in zip(ses, tps)) if all(ses) else 0.0
            se = (gm * math.sqrt(max(statistics.variance(log_tps), within) / len(tps))) if len(tps) > 1 else None
            flops = [r.get("flops_per_token") for r in blocks]
            entry = {k: row.get(k) for k in _FIXED}
            entry.update(start_steps=[r.get("start_step") for r in blocks], tokens_per_s_blocks=tps,
                         tokens_per_s=gm, tokens_per_s_se=se,
                         flops_per_token=statistics.fmean(flops) if all(flops) else None,
                         seconds=[s for r in blocks for s in r["seconds"]],
                         same_every_round=all(r.get("same_every_round", True) for r in blocks), vs={})
            for ref in row.get("vs", {}):
                vs = [r["vs"][ref] for r in blocks]
                combined = invocations.combine([v["ratio"] for v in vs], [v.get("se") for v in vs])
                bounds = [v.get("bound") for v in vs]
                bound = _gmean(bounds) if all(bounds) else None
                combined.update(bound=bound, bound_blocks=bounds,
                                measured_over_bound=None if bound is None else combined["ratio"] / bound,
                                measured_over_bound_se=None if bound is None or combined["se"] is None
                                else combined["se"] / bound)
                entry["vs"][ref] = combined
            rows[name] = entry
        budgets[T] = {"T": budget["T"], "K": budget["K"], "rows": rows}
    return budgets


def combine(blocks: list[dict], where: str = str(BLOCKS_DIR)) -> dict:
    """The timing blocks (`run`'s results, blocks 0..B-1 of sample.throughput_blocks = B) combined:
    per budget, row and reference, the ratio exp(mean of the blocks' log ratios), se =
    sqrt(max(between-block variance, within-block variance) / B) on B - 1 df, the within- and
    between-block sd and Cochran's Q (`tadm.metrics.invocations.combine`); tokens/s the blocks'
    geometric mean (± its se the same way);
    the FLOP bound the blocks' geometric mean. DataError when the blocks are not one set."""
    if not blocks:
        raise DataError(f"{where}: no timing blocks: run `python -m tadm throughput --block 0` (and the others)")
    blocks = sorted(blocks, key=lambda b: b.get("block", -1))
    B = blocks[0].get("blocks")
    for b in blocks:
        if b.get("format") != BLOCK_FORMAT:
            raise DataError(f"{where}: block {b.get('block')} has format {b.get('format')!r}, this tadm reads "
                            f"{BLOCK_FORMAT}: rerun the throughput blocks")
    if [b.get("block") for b in blocks] != list(range(B or 0)) or any(b.get("blocks") != B for b in blocks):
        raise DataError(f"{where}: holds blocks {[b.get('block') for b in blocks]} of "
                        f"{sorted({b.get('blocks') for b in blocks}, key=str)}, not the blocks 0..B-1 of one "
                        "sample.throughput_blocks = B: rerun the throughput blocks")
    keys = ("rows", "references", "rounds", "batch", "seq_len", "window", "seed", "device", "precision", "autocast")
    for b in blocks[1:]:
        for k in keys:
            if b.get(k) != blocks[0].get(k):
                raise DataError(f"{where}: block {b['block']} has {k} {b.get(k)!r}, block 0 {blocks[0].get(k)!r}: "
                                "the blocks must time the same rows in the same settings")
    has1 = [b.get("batch1") is not None for b in blocks]
    if any(has1) and not all(has1):
        raise DataError(f"{where}: only some blocks have a batch-1 timing: rerun the throughput blocks")
    result: dict[str, Any] = {k: blocks[0][k] for k in keys}
    result.update(format=FORMAT, blocks=B, threads=[b.get("threads") for b in blocks],
                  batch_seeds=[b["batch_seed"] for b in blocks],
                  start_steps={T: [b["start_steps"][T] for b in blocks] for T in blocks[0]["start_steps"]},
                  budgets=_combine_section(blocks, where),
                  batch1=({"batch": 1, "rounds": blocks[0]["batch1"]["rounds"],
                           "budgets": _combine_section([b["batch1"] for b in blocks], f"{where} (batch 1)")}
                          if all(has1) else None),
                  block_seconds=[b["seconds"] for b in blocks],
                  block_results=[{k: v for k, v in b.items() if k not in ("schedule",)} for b in blocks])
    return result


def load_blocks(directory: str | Path = BLOCKS_DIR) -> list[dict]:
    """Every block_<b>.json in `directory` (a one-line DataError when there is none)."""
    directory = Path(directory)
    files = sorted(directory.glob("block_*.json")) if directory.is_dir() else []
    if not files:
        raise DataError(f"{directory} holds no timing block: run the throughput blocks "
                        "(`dvc repro throughput_block` or `python -m tadm throughput --block B`)")
    return [json.loads(f.read_text()) for f in files]


def load(path: str | Path = OUT) -> dict:
    """results/throughput.json, or a one-line DataError naming it when it is missing."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} is missing: Table 2's tokens/s come from the throughput stage "
                        "(`dvc repro throughput` or `python -m tadm throughput`)")
    result = json.loads(path.read_text())
    if result.get("format") != FORMAT:
        raise DataError(f"{path} has format {result.get('format')!r}, this tadm reads {FORMAT}: rerun the throughput stage")
    return result


def row_tokens_per_s(row: dict) -> tuple[float, float | None]:
    """A row's tokens/s and its se: in a combined result the blocks' geometric mean, in one block
    the median over rounds."""
    if isinstance(row.get("tokens_per_s"), (int, float)):
        return float(row["tokens_per_s"]), row.get("tokens_per_s_se")
    return float(row["tokens_per_s_median"]), row.get("tokens_per_s_se")


def ratio_entry(result: dict, T: int, row: str, ref: str, *, batch: int | None = None) -> dict | None:
    """The stored comparison of `row` with `ref` at T (ratio, se, df and, in a combined result,
    the within / between parts and Q), or None when the result does not store it."""
    rows = _rows_at(result, T, (row, ref), batch)
    return rows[row].get("vs", {}).get(ref)


def _pm(value: float | None, se: float | None, decimals: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:,.{decimals}f}" + (f" ± {se:,.{decimals}f}" if se is not None else "")


def _ratio_cell(v: dict | None) -> str:
    """One "vs reference" cell: the ratio ± se (FLOP bound; measured / bound), "–" when not timed."""
    if v is None:
        return "–"
    bound = "–" if v.get("bound") is None else f"{v['bound']:.2f}"
    return f"{_pm(v['ratio'], v['se'])} ({bound}; {_pm(v.get('measured_over_bound'), v.get('measured_over_bound_se'))})"


def _tables(section: dict, refs: list[str], order: list[str]) -> list[str]:
    lines = []
    for budget in sorted(section["budgets"].values(), key=lambda b: b["T"]):
        lines += [f"T = {budget['T']}, K = {budget['K']}", "",
                  "| Method | tok/s | " + " | ".join(f"vs {ROWS[r].label if r in ROWS else r} (FLOP bound; measured/bound)"
                                                   for r in refs) + " | seconds per round |",
                  "|---|---|" + "---|" * len(refs) + "---|"]
        for name in sorted(budget["rows"], key=lambda n: order.index(n) if n in order else len(order)):
            row = budget["rows"][name]
            cells = [_ratio_cell(row["vs"].get(r)) for r in refs]
            secs = ", ".join(f"{s:.3f}" for s in row["seconds"])
            what = "" if row.get("timed", "window") == "window" else " (whole draw)"
            lines.append(f"| {row['label']}{what} | {_pm(row['tokens_per_s_median'], row['tokens_per_s_se'], 1)} | "
                         + " | ".join(cells) + f" | {secs} |")
        lines.append("")
    return lines


def block_markdown(result: dict) -> str:
    """One timing block: one table per budget (and per batch): median tokens/s over rounds, the
    paired ratios vs ADLM and MDLM with their FLOP bounds and measured / bound."""
    refs = result["references"]
    W, starts = result["window"], result["start_steps"]
    where = ", ".join(f"T = {T}: steps {s}..{s + W - 1}" for T, s in sorted(starts.items(), key=lambda x: int(x[0])))
    lines = [f"Table 2 throughput, timing block {result.get('block', 0)} of {result.get('blocks', 1)} (batch seed "
             f"{result.get('batch_seed', result['seed'])}): every row timed in turns in one process, {result['rounds']} "
             f"rounds at batch {result['batch']} (the order rotates and alternates between rounds), {result['device']}, "
             f"autocast {result['autocast']}, {result['threads']} threads. A diffusion row's timed call is {W} reverse "
             f"steps of its own trajectory ({where}; whole refresh cycles, resumed every round from the same paused "
             "state), scaled to its whole trajectory by its number of steps; AR's is its whole draw. tok/s: median over "
             "rounds (± bootstrap sd); ratios: median over rounds of the paired per-round ratios (± bootstrap se over "
             "rounds); FLOP bound: the reference's counted FLOPs per token over the row's.", ""]
    lines += _tables(result, refs, result["rows"])
    if result.get("batch1"):
        lines += [f"Batch 1, {result['batch1']['rounds']} rounds, the same design", ""]
        lines += _tables(result["batch1"], refs, result["rows"])
    return "\n".join(lines)


def _combined_tables(section: dict, refs: list[str], order: list[str]) -> list[str]:
    lines = []
    first = refs[0] if refs else None
    for budget in sorted(section["budgets"].values(), key=lambda b: b["T"]):
        label = lambda r: ROWS[r].label if r in ROWS else r  # noqa: E731
        head = ["Method", "tok/s"] + [f"vs {label(r)} (FLOP bound; measured/bound)" for r in refs]
        if first:
            head += [f"blocks vs {label(first)}", "within / between sd (log)", "Q (p)"]
        lines += [f"T = {budget['T']}, K = {budget['K']}", "", "| " + " | ".join(head) + " |",
                  "|---|" + "---|" * (len(head) - 1)]
        for name in sorted(budget["rows"], key=lambda n: order.index(n) if n in order else len(order)):
            row = budget["rows"][name]
            cells = [_ratio_cell(row["vs"].get(r)) for r in refs]
            if first:
                v = row["vs"].get(first)
                if v is None:
                    cells += ["–"] * 3
                else:
                    sd = lambda x: "–" if x is None else f"{x:.3f}"  # noqa: E731
                    cells += [", ".join(f"{x:.2f}" for x in v["blocks"]),
                              f"{sd(v.get('within_sd'))} / {sd(v.get('between_sd'))}",
                              "–" if v.get("q") is None else f"{v['q']:.1f} ({v['q_p']:.2g})"]
            what = "" if row.get("timed", "window") == "window" else " (whole draw)"
            tps, se = row_tokens_per_s(row)
            lines.append(f"| {row['label']}{what} | {_pm(tps, se, 1)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def to_markdown(result: dict) -> str:
    """The blocks combined (`combine`): one table per budget (and per batch) with each row's
    tokens/s, its ratios vs ADLM and MDLM (± their se over the blocks) with their FLOP bounds and
    measured / bound, the blocks' own ratios vs ADLM, the within- / between-block sd and Q."""
    if result.get("format") == BLOCK_FORMAT:
        return block_markdown(result)
    refs, B, W = result["references"], result["blocks"], result["window"]
    where = "; ".join(f"T = {T}: windows from steps {', '.join(map(str, s))}"
                      for T, s in sorted(result["start_steps"].items(), key=lambda x: int(x[0])))
    lines = [f"Table 2 throughput across {B} timing blocks, each its own process run at another point of the "
             f"pipeline with its own batch seed and step window of {W} reverse steps ({where}). Inside a block "
             f"every row is timed in turns, {result['rounds']} rounds at batch {result['batch']} (the order rotates and "
             "alternates between rounds), each diffusion row's window of whole refresh cycles resumed from one paused "
             "state of its own trajectory and scaled to the whole trajectory (AR: its whole draw); a block's ratio is "
             "the median of its paired per-round ratios. Across blocks: ratio = exp(mean of the blocks' log ratios) ± "
             f"se = sqrt(max(between-block variance, within-block variance) / {B}) on {B - 1} df (never below what the "
             "blocks' own rounds show); tok/s the blocks' geometric mean (± the same); within "
             "sd: a block's own se of its log ratio (root mean square), between sd: what the blocks' spread adds "
             f"beyond it; Q: Cochran's Q of the blocks on {B - 1} df (p). FLOP bound: the reference's counted FLOPs "
             f"per token over the row's. {result['device']}, autocast {result['autocast']}.", ""]
    lines += _combined_tables(result, refs, result["rows"])
    if result.get("batch1"):
        lines += [f"Batch 1, {result['batch1']['rounds']} rounds per block, the same design", ""]
        lines += _combined_tables(result["batch1"], refs, result["rows"])
    return "\n".join(lines)


def write_table(result: dict, path: str | Path = TABLE) -> None:
    atomic_write_text(path, to_markdown(result))



__all__ = ["FORMAT", "BLOCK_FORMAT", "OUT", "BLOCKS_DIR", "TABLE", "speed_references", "ratio_vs", "flop_bound",
           "summarize", "paired_ratio", "bound_ratio", "batch1_ratio", "ratio_entry", "row_tokens_per_s", "block_path",
           "combine", "load_blocks", "load", "block_markdown", "to_markdown", "write_table"]
