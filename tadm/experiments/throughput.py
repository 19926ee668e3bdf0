"""Table 2's throughput, paired: every row that samples, timed in turns in one process.

Each Table 2 row stage (`tadm.experiments.table2.run_row`) also records the tokens/s of its own
draw, but the rows run in separate stages minutes apart on a shared machine, so their speeds mix
the methods with the machine's drift (MDLM, MDLM+FB and SEDD -- the same network, the same layer
calls -- read 13-15 % apart). The `throughput` stage (``python -m tadm throughput``) times them
against each other instead:

- every row of `ROWS` that samples (``model`` not None: not Data), with the sampler, model
  directory (``models/<row.model>``), fusion setting, device and autocast of its row stage: each
  timed call IS `tadm.experiments.sampling.draw_samples` (one batch of ``sample.throughput_batch``
  sequences seeded with ``seed``, i.e. batch seed 0), at every budget T of ``sample.steps`` with
  that budget's K (``sample.refresh_every``); nothing is scored or saved;
- every model directory is loaded once up front (the calls reuse the loaded module), and every
  row makes one untimed warm-up call (the timing batch at the first budget) before any timing;
- ``sample.throughput_rounds`` rounds. In round r every budget is timed, and at each budget every
  row once, in turns: the order starts at row r mod n and runs forward through the rows on even
  rounds and backward on odd ones, so each row goes first once in n rounds and a pair's order
  flips from one round to the next (but where the cycle wraps). The time of a call is the sampler loop's own (``record["seconds"]``, what the
  row stages' tokens/s divide by): model loading and the counters' bookkeeping are outside it.

The timing batch sets the absolute tokens/s (the default profile times 8 sequences, not the row
stages' 64, to keep the stage near 2 minutes; the paper profile times the row stages' batch); the
ratios compare the rows on the same batch.

Per budget it reports each row's median tokens/s over the rounds (± the bootstrap sd of that
median over rounds) and its speed relative to ADLM and to MDLM as the median over rounds of the
paired per-round ratios (row tokens/s / reference tokens/s in the same round, seconds apart),
± its bootstrap se over rounds -- `tadm.metrics.bootstrap.paired_speedup`, Table 1's estimator.
:func:`paired_ratio` reads (or, for another reference, computes) one such ratio.

results/throughput.json (``FORMAT`` 1)::

    {"format": 1,
     "rows": [row, ...],                      # the timed rows, in ROWS order
     "references": ["adlm", "mdlm"],          # the rows every ratio is also given against
     "rounds": R, "batch": b, "seq_len": L,   # R rounds of one b-sequence batch per row and budget
     "seed": s, "device": <the device, e.g. cuda:0>, "precision": "bf16", "autocast": "bf16"|"fp32",
     "threads": torch threads, "processes": 1,
     "warmup": {"T": first budget, "seconds": {row: s}},
     "schedule": [[round, T, row], ...],      # every timed call, in the order it ran
     "seconds": total wall seconds of the stage's timing (warm-up included),
     "budgets": {"<T>": {
         "T": T, "K": K,
         "rounds": [{"round": r, "order": [row, ...], "seconds": {row: s}}, ...],   # R entries
         "rows": {row: {
             "label": Table 2's label, "model_dir": "models/<model>", "sampler": ..., "policy": ...|null,
             "bypass_fusion": bool, "tokens": tokens per call (b x L),
             "tokens_sha256": SHA-256 of the first round's int64 tokens (the row stage's first
                              batch when sample.throughput_batch = sample.batch_size),
             "seconds": [s per round, round order], "tokens_per_s": [tok/s per round],
             "tokens_per_s_median": median over rounds, "tokens_per_s_se": bootstrap sd of it | null,
             "vs": {ref: {"ratio": median of paired per-round ratios, "se": bootstrap se | null}}}}}}}

``write_table`` writes paper_figures/table2_throughput.md from it; Table 2's tokens/s and
"vs ADLM" columns read it (`tadm.experiments.tables.table2_frame`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import statistics
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tadm import runtime
from tadm.config import Params, override
from tadm.errors import DataError
from tadm.experiments import sampling
from tadm.experiments.table2 import ROWS
from tadm.io import atomic_write_json, atomic_write_text
from tadm.metrics.bootstrap import paired_speedup, resamples, spread

FORMAT = 1
OUT = Path("results/throughput.json")
TABLE = Path("paper_figures/table2_throughput.md")
REFERENCES = ("adlm", "mdlm")


def timed_rows(rows=None) -> list[str]:
    """The rows that sample (a model; not Data), in ROWS order."""
    rows = ROWS if rows is None else rows
    return [name for name, row in rows.items() if row.model is not None]


def round_order(rows: list[str], r: int) -> list[str]:
    """Round r's turn order: from row r mod n, forward on even rounds, backward on odd ones."""
    n = len(rows)
    step = 1 if r % 2 == 0 else -1
    return [rows[(r + step * i) % n] for i in range(n)]


def sample_run(name: str, models_dir: str | Path = "models") -> sampling.SampleRun:
    """The `SampleRun` of Table 2 row `name`, as its row stage builds it (`table2.run_row`)."""
    row = ROWS[name]
    return sampling.SampleRun(name, str(Path(models_dir) / row.model), row.sampler, bypass_fusion=row.bypass_fusion)


@contextlib.contextmanager
def models_loaded_once(model_dirs: list[str], device) -> Iterator[dict[str, Any]]:
    """Load each model directory once; inside the block, `draw_samples` gets the loaded module
    back for those directories instead of reading the files again (its only loader,
    `sampling.load_pretrained`, is swapped for the block's duration; samplers never write the
    weights: they run under inference_mode)."""
    real = sampling.load_pretrained
    loaded = {str(d): real(d, map_location=device) for d in dict.fromkeys(map(str, model_dirs))}

    def load(directory, map_location=runtime.CPU):
        model = loaded.get(str(directory))
        return model if model is not None else real(directory, map_location=map_location)

    sampling.load_pretrained = load
    try:
        yield loaded
    finally:
        sampling.load_pretrained = real


def _none_if_nan(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def ratio_vs(row: dict, ref: dict) -> tuple[float, float | None]:
    """Median over rounds of row tokens/s / ref tokens/s in the same round, and its bootstrap se
    (None with one round): `paired_speedup` of the two rows' per-round seconds (the ref's scaled
    by the tokens ratio, 1 when both time the same batch)."""
    scale = row["tokens"] / ref["tokens"]
    ratio, se = paired_speedup([s * scale for s in ref["seconds"]], row["seconds"])
    return float(ratio), _none_if_nan(se)


def median_se(values: list[float], B: int = 1000) -> float | None:
    """Bootstrap sd over rounds of the median of `values` (None with fewer than 2)."""
    if len(values) < 2:
        return None
    v = np.asarray(values, np.float64)
    return _none_if_nan(spread(np.median(v[resamples(len(v), B)], axis=1)))


def summarize(budget: dict, references=REFERENCES) -> None:
    """Fill each row of one budget (its "seconds" and "tokens" per call) with tokens/s per round,
    their median (± se) and the paired ratios against each reference row present."""
    rows = budget["rows"]
    for row in rows.values():
        row["tokens_per_s"] = [row["tokens"] / s for s in row["seconds"]]
        row["tokens_per_s_median"] = float(statistics.median(row["tokens_per_s"]))
        row["tokens_per_s_se"] = median_se(row["tokens_per_s"])
    for row in rows.values():
        row["vs"] = {}
        for ref in references:
            if ref in rows:
                ratio, se = ratio_vs(row, rows[ref])
                row["vs"][ref] = {"ratio": ratio, "se": se}


def paired_ratio(result: dict, T: int, row: str, ref: str) -> tuple[float, float | None]:
    """`row`'s throughput over `ref`'s at budget T in a throughput result (results/throughput.json):
    the median over rounds of the paired per-round tokens/s ratios and its bootstrap se (None with
    one round). Read from the result when it holds it (references adlm, mdlm), else computed from
    the per-round seconds the same way. KeyError when T, `row` or `ref` was not timed."""
    budget = result["budgets"].get(str(int(T)))
    if budget is None:
        raise KeyError(f"results/throughput.json has no budget T={T} (it has {sorted(result['budgets'], key=int)})")
    rows = budget["rows"]
    for name in (row, ref):
        if name not in rows:
            raise KeyError(f"results/throughput.json has no row {name!r} at T={T} (it has {sorted(rows)})")
    stored = rows[row].get("vs", {}).get(ref)
    if stored is not None:
        return float(stored["ratio"]), _none_if_nan(stored["se"])
    return ratio_vs(rows[row], rows[ref])


def run(params: Params, *, models_dir: str | Path = "models", bos_id: int, rows: list[str] | None = None,
        dist: runtime.Dist | None = None, out: str | Path | None = OUT) -> dict:
    """Time every row (default: `timed_rows()`) in turns (module docstring) and return the result;
    written to `out` when given. One process: runtime.nproc is not used."""
    cfg = params.sample
    rows = list(rows or timed_rows())
    if not rows:
        raise DataError("throughput: no Table 2 row samples (every row of ROWS has model None)")
    unknown = [r for r in rows if r not in ROWS or ROWS[r].model is None]
    if unknown:
        raise DataError(f"throughput: {', '.join(map(repr, unknown))} is not a Table 2 row that samples "
                        f"(those are {', '.join(timed_rows())})")
    budgets = [int(T) for T in cfg.steps]
    d = dist or runtime.setup(params.runtime)
    if d.world != 1:
        raise DataError("throughput: the rows are timed against each other in one process; run it without torchrun")
    # the timed call: one batch of throughput_batch sequences, batch seed 0 (= params.seed)
    p = override(params, {"sample.batch_size": cfg.throughput_batch, "sample.num_samples": cfg.throughput_batch})
    runs = {name: sample_run(name, models_dir) for name in rows}
    for name, spec in runs.items():
        if not Path(spec.model_dir).is_dir():
            raise DataError(f"throughput: {spec.model_dir} (row {name}) does not exist: run the train stage first")
    import torch

    start = time.perf_counter()
    result: dict[str, Any] = {
        "format": FORMAT, "rows": rows, "references": [r for r in REFERENCES if r in rows],
        "rounds": cfg.throughput_rounds, "batch": cfg.throughput_batch, "seq_len": cfg.canvas_length,
        "seed": params.seed, "device": str(d.device), "precision": d.precision,
        "autocast": sampling.network_autocast(d), "threads": torch.get_num_threads(), "processes": 1,
        "warmup": {"T": budgets[0], "seconds": {}}, "schedule": [], "budgets": {}}
    for T, K in zip(budgets, cfg.refresh_every):
        result["budgets"][str(T)] = {"T": T, "K": int(K), "rounds": [], "rows": {}}
    with models_loaded_once([s.model_dir for s in runs.values()], d.device):
        for name in rows:  # warm-up: untimed
            _, record = sampling.draw_samples(runs[name], p, budgets[0], bos_id=bos_id, dist=d)
            result["warmup"]["seconds"][name] = record["seconds"]
        for r in range(cfg.throughput_rounds):
            order = round_order(rows, r)
            for T in budgets:
                budget = result["budgets"][str(T)]
                this_round = {"round": r, "order": order, "seconds": {}}
                for name in order:
                    tokens, record = sampling.draw_samples(runs[name], p, T, bos_id=bos_id, dist=d)
                    result["schedule"].append([r, T, name])
                    this_round["seconds"][name] = record["seconds"]
                    entry = budget["rows"].get(name)
                    if entry is None:
                        row = ROWS[name]
                        entry = budget["rows"][name] = {
                            "label": row.label, "model_dir": runs[name].model_dir, "sampler": record["sampler"],
                            "policy": record.get("policy"), "bypass_fusion": bool(record.get("bypass_fusion", False)),
                            "tokens": int(tokens.size),
                            "tokens_sha256": hashlib.sha256(np.ascontiguousarray(tokens, np.int64).tobytes()).hexdigest(),
                            "seconds": []}
                    entry["seconds"].append(record["seconds"])
                budget["rounds"].append(this_round)
    for budget in result["budgets"].values():
        summarize(budget)
    result["seconds"] = time.perf_counter() - start
    if out is not None:
        atomic_write_json(out, result)
    return result


def load(path: str | Path = OUT) -> dict:
    """results/throughput.json, or a one-line DataError naming it when it is missing."""
    import json

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} is missing: Table 2's tokens/s come from the throughput stage "
                        "(`dvc repro throughput` or `python -m tadm throughput`)")
    result = json.loads(path.read_text())
    if result.get("format") != FORMAT:
        raise DataError(f"{path} has format {result.get('format')!r}, this tadm reads {FORMAT}: rerun the throughput stage")
    return result


def _pm(value: float | None, se: float | None, decimals: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:,.{decimals}f}" + (f" ± {se:,.{decimals}f}" if se is not None else "")


def to_markdown(result: dict) -> str:
    """One table per budget: median tokens/s over rounds and the paired ratios vs ADLM and MDLM."""
    refs = result["references"]
    lines = [f"Table 2 throughput, paired: every row timed in turns in one process, {result['rounds']} rounds of one "
             f"{result['batch']}-sequence batch per row and budget (the order rotates and alternates between rounds), "
             f"{result['device']}, autocast {result['autocast']}, {result['threads']} threads. tok/s: median over rounds "
             "(± bootstrap sd); ratios: median over rounds of the paired per-round ratios (± bootstrap se over rounds).",
             ""]
    for budget in result["budgets"].values():
        lines += [f"T = {budget['T']}, K = {budget['K']}", "",
                  "| Method | tok/s | " + " | ".join(f"vs {ROWS[r].label if r in ROWS else r}" for r in refs)
                  + " | seconds per round |",
                  "|---|---|" + "---|" * len(refs) + "---|"]
        for name, row in budget["rows"].items():
            ratios = [_pm(row["vs"][r]["ratio"], row["vs"][r]["se"]) if r in row["vs"] else "–" for r in refs]
            secs = ", ".join(f"{s:.2f}" for s in row["seconds"])
            lines.append(f"| {row['label']} | {_pm(row['tokens_per_s_median'], row['tokens_per_s_se'], 1)} | "
                         + " | ".join(ratios) + f" | {secs} |")
        lines.append("")
    return "\n".join(lines)


def write_table(result: dict, path: str | Path = TABLE) -> None:
    atomic_write_text(path, to_markdown(result))


__all__ = ["FORMAT", "OUT", "TABLE", "REFERENCES", "timed_rows", "round_order", "sample_run", "models_loaded_once",
           "ratio_vs", "summarize", "paired_ratio", "run", "load", "to_markdown", "write_table"]
