"""Table 2's throughput, paired: every row that samples, timed in turns in one process.

Each Table 2 row stage (`tadm.experiments.table2.run_row`) also records the tokens/s of its own
draw, but the rows run in separate stages minutes apart on a shared machine, so their speeds mix
the methods with the machine's drift (MDLM, MDLM+FB and SEDD -- the same network, the same layer
calls -- read 13-15 % apart). The `throughput` stage (``python -m tadm throughput``) times them
against each other instead.

What is timed. Every row of `ROWS` that samples (``model`` not None: not Data), with the sampler,
model directory (``models/<row.model>``), refresh policy, fusion setting, device, autocast and
weight cast of its row stage (`tadm.experiments.sampling`: `prepare_model`, `sampler_settings`,
`SampleRun.policy`, `make_adapter`), at every budget (T, K) of ``sample.budgets``, on a batch of ``sample.throughput_batch`` sequences (0: the row
stages' ``sample.batch_size``, 64 in the default profile) seeded like the row stage's first batch
(batch seed 0 = ``seed``). A whole draw per row, budget and round would cost minutes per round at
that batch, so a round times a *window* of every diffusion row's trajectory instead:

- the window is W = lcm of the budgets' K reverse steps (8 in the default and paper profiles),
  whole refresh cycles of every budget's K, from the common step s = W (`start_step`; 0 when
  T < 2W), so every row is timed over the same steps W..2W-1 of its own trajectory and TADM's
  rows make their anchor refresh exactly once per K steps inside it, at the steps where the whole
  draw makes them (s is a multiple of every K). Where the window starts hardly matters to its
  cost: measured paired on random-weight models of the default profile's size (T = 64, batch 64;
  MDLM, ReMDM, ADLM, TADM, MDLM+DFM; 1 thread), windows from s = 0, T/8, T/4, T/2 and 3T/4 cost
  the same within +-5 % with no trend (the network body, on the whole canvas, is most of a step);
  s = W keeps the untimed run to the start to one window, and past the trajectory's first step;
- the state at step s is made once per row, budget and batch before any timing: the row's own
  sampler runs its real trajectory from the all-mask canvas to step s and pauses there
  (`tadm.sampling.sample(..., stop=s)`, `tadm.sampling.loop` point 8: the canvas, the generator,
  the sampler's and the adapter's state, TADM's anchor cache included); every timed call resumes
  from that same state and stops after W steps (``sample(..., start=paused, stop=s + W)``), so a
  row does the very same work, bit for bit, in every round (``same_every_round``) and its
  window is the whole draw's steps s..s+W-1;
- a window's seconds stand for the whole trajectory scaled by its number of steps: tokens/s =
  B L / (seconds x S / W) with S = T (DFM: its longer grid, `tadm.sampling.correctors.dfm_grid`).
  This assumes the steps of a trajectory cost alike: the network body runs on the whole canvas
  at every step; only the output head, the nucleus draw (on the decoding rows) and TADM's
  refreshes vary, and the refreshes fall in the window as often as in the whole draw;
- AR cannot be paused mid-trajectory cleanly (its own KV-cached loop, `tadm.sampling.ar`, has
  no T and a step's cost grows with the prefix it attends to), so its timed call is its whole
  draw, the row stage's first batch (L - 1 one-position forwards; at the default profile's
  batch 64 about 0.6 of a window's cost); its tokens/s is B L / seconds, and it is the one row
  not timed over W steps. Its draw does not depend on T (its row stage draws once and saves it
  under every budget), so a round times it once, in its turn at the first budget, and every
  budget of the round reads that call.

Rounds. Every model directory is loaded once up front; the paused states of every row and
budget are made before any timing, and those untimed runs to s(T), at the batch that is then
timed, warm the rows up (AR, and a row whose window starts at step 0, make one untimed call
instead); then ``sample.throughput_rounds`` rounds: in round r every budget is timed, and at
each budget every row once, in turns: the order starts at row r mod n and runs forward through
the rows on even rounds and backward on odd ones, so each row goes first once in n rounds and a
pair's order flips from one round to the next (but where the cycle wraps). The time of a call is
the sampler loop's own (``SampleResult.seconds``): model loading, the adapter's hooks and the
paused state's setup are outside it. Batch 1 (``sample.throughput_batch1_rounds`` rounds, 0 =
off) is then timed the same way, with its own paused states (batch 1, seed ``seed``), warm-up
and rounds.

Cost (default profile, random-weight models of its size, 10 rows, T = 64 and 128, W = 8, batch
64, 10 rounds and 5 batch-1 rounds): 107 s at 1 thread on a free core of the 2-core machine, 95 s
of it the batch-64 windows (10 rounds x 2 budgets x 9 windows of 8 x 64 sequence-steps, plus AR),
2 s batch 1, 9 s loading and the paused states; the previous design (4 rounds of one whole
8-sequence draw per row and budget) took 57 s in the same conditions. A call's fixed cost (its
settings, conditioning vectors, the resumed state; 0.1-0.2 ms) is under 1 % of even a batch-1
window (~17 ms).

What it writes, and the ratios read from it: `tadm.experiments.throughput_results`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tadm import runtime
from tadm.config import Params
from tadm.errors import DataError
from tadm.experiments import sampling
from tadm.experiments.table2 import ROWS
from tadm.experiments.throughput_results import BLOCK_FORMAT, speed_references, summarize
from tadm.io import atomic_write_json
from tadm.registry import method_for
from tadm.sampling import make_adapter, sample, sample_ar


CALL_COUNTERS = ("model_calls", "reused_calls", "anchor_calls", "anchor_layer_calls", "denoiser_layer_calls",
                 "layer_calls", "flops", "layer_tokens")


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


def window_steps(refresh_every) -> int:
    """W: the reverse steps timed per row, budget and round, lcm of every budget's K (whole
    refresh cycles at every budget)."""
    return math.lcm(*(int(k) for k in refresh_every))


def start_step(T: int, window: int, block: int = 0, blocks: int = 1) -> int:
    """s(T): where every row's window starts in timing block `block` of `blocks`. The trajectory's
    n = T // window whole windows past the first are spread evenly over the blocks: block 0 starts
    at the end of the first window (step `window`), the last block at the last whole window, the
    others between; step 0 when T holds fewer than two windows. DataError when the window does not
    fit in T steps or the block is not one of `blocks`."""
    if window > T:
        raise DataError(f"throughput: budget T={T} is shorter than the timed window of {window} steps "
                        "(lcm of the budgets' K)")
    if not 0 <= block < blocks:
        raise DataError(f"throughput: block {block} is not one of sample.throughput_blocks={blocks} (0..{blocks - 1})")
    n = T // window
    if n < 2:
        return 0
    return window * (1 + (round(block * (n - 2) / (blocks - 1)) if blocks > 1 else 0))


def timing_batch(cfg) -> int:
    """The batch every row is timed at: sample.throughput_batch, or sample.batch_size when it is 0."""
    return int(cfg.throughput_batch or cfg.batch_size)


def _sha(tokens) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(tokens), np.int64).tobytes()).hexdigest()


@dataclass
class Timed:
    """One row at one budget and batch, ready to time: `call()` runs the timed call and returns
    its `SampleResult` (seconds, counters, tokens, refresh steps); `info` holds the JSON row's
    fixed fields."""

    name: str
    call: Callable[[], Any]
    info: dict[str, Any]
    warmup: float | None = None  # seconds of the untimed run to the window's start (None: none ran)


def prepare(name: str, spec: sampling.SampleRun, model, params: Params, d: runtime.Dist, T: int, batch: int,
            start: int, window: int, bos_id: int, block: int = 0) -> Timed:
    """Row `name` (its `SampleRun` and loaded, prepared model) at budget T and `batch`, seeded as
    sampling batch `block` of the run (block 0: the row stage's first batch): for a diffusion
    model its trajectory is run to step `start` and paused there (not timed); the call resumes
    from that state for `window` steps. AR: its whole draw."""
    cfg, L = params.sample, model.seq_len
    if cfg.canvas_length != L:
        raise DataError(f"sample.canvas_length={cfg.canvas_length} but {spec.model_dir} was trained with L={L}")
    autocast, seed = sampling.network_autocast(d), sampling.batch_seed(params.seed, block)
    row = ROWS[name]
    info: dict[str, Any] = {"label": row.label, "model_dir": spec.model_dir, "policy": None,
                            "bypass_fusion": spec.bypass_fusion, "tokens": batch * L}
    unit = method_for(model.model_type)
    if unit.adapter is None:  # AR: its own loop, timed whole
        def draw():
            return sample_ar(model, batch, L, bos_id=bos_id, nucleus_p=cfg.nucleus_p, seed=seed, batch_size=batch,
                             autocast=autocast)

        info.update(sampler="ar", timed="draw", start_step=None, steps_timed=L - 1, trajectory_steps=L - 1, scale=1.0,
                    start_sha256=None, masked_at_start=None)
        return Timed(name, draw, info)
    refresh = spec.policy(params, T) if unit.refreshes else None
    settings = dataclasses.replace(sampling.sampler_settings(spec, params, T, autocast), seed=seed, batch_size=batch)
    s = int(start)
    with make_adapter(model, refresh, bypass_fusion=spec.bypass_fusion) as adapter:
        before = sample(adapter, settings, num_samples=batch, seq_len=L, stop=s)
    paused = before.paused
    if s + window > paused.total:
        raise DataError(f"throughput: row {name} at T={T} has {paused.total} steps, fewer than {s} + {window}")

    def resume():
        with make_adapter(model, refresh, bypass_fusion=spec.bypass_fusion) as adapter:
            return sample(adapter, settings, num_samples=batch, seq_len=L, start=paused, stop=s + window)

    canvas = runtime.host(paused.z).numpy()
    info.update(sampler=settings.sampler, policy=repr(refresh) if refresh is not None else None, timed="window",
                start_step=s, steps_timed=window, trajectory_steps=paused.total, scale=paused.total / window,
                start_sha256=_sha(canvas), masked_at_start=float((canvas == model.mask_id).mean()))
    return Timed(name, resume, info, before.seconds if s else None)


def _time_rounds(timers: dict[int, dict[str, Timed]], refresh: dict[int, int], rows: list[str],
                 rounds: int) -> dict[str, Any]:
    """The warm-up and `rounds` paired rounds over `timers` ({T: {row: Timed}}, K = refresh[T]);
    the section's "warmup", "schedule" and "budgets" (summarized)."""
    budgets = list(timers)
    out: dict[str, Any] = {"warmup": {"T": budgets[0], "seconds": {}}, "schedule": [], "budgets": {}}
    for name in rows:  # warm-up: the untimed runs to the windows' start, or one untimed call
        first = timers[budgets[0]][name]
        out["warmup"]["seconds"][name] = first.warmup if first.warmup is not None else first.call().seconds
    ends: dict[tuple[int, str], set[str]] = {}
    for T in budgets:
        out["budgets"][str(T)] = {"T": T, "K": int(refresh[T]), "rounds": [], "rows": {}}
    for r in range(rounds):
        order = round_order(rows, r)
        drawn: dict[str, Any] = {}  # this round's call of each row that does not depend on T (AR)
        for T in budgets:
            budget = out["budgets"][str(T)]
            this_round = {"round": r, "order": order, "seconds": {}}
            for name in order:
                timed = timers[T][name]
                if timed.info["timed"] == "draw" and name in drawn:
                    res = drawn[name]  # the same draw at every budget, as its row stage saves it
                else:
                    res = timed.call()
                    out["schedule"].append([r, T, name])
                    if timed.info["timed"] == "draw":
                        drawn[name] = res
                this_round["seconds"][name] = res.seconds
                end = _sha(runtime.host(res.tokens).numpy())
                ends.setdefault((T, name), set()).add(end)
                entry = budget["rows"].get(name)
                if entry is None:
                    counters = {k: v for k, v in res.counters.as_dict().items() if k in CALL_COUNTERS}
                    refresh = None
                    if res.refresh_steps is not None and timed.info["start_step"] is not None:
                        refresh = [i for i in res.refresh_steps[0] if i >= timed.info["start_step"]]
                    entry = budget["rows"][name] = {
                        **timed.info, "tokens_sha256": end, "refresh_steps": refresh, "counters": counters,
                        "flops_per_token": counters["flops"] * timed.info["scale"] / timed.info["tokens"],
                        "seconds": []}
                entry["seconds"].append(res.seconds)
            budget["rounds"].append(this_round)
    for T in budgets:
        for name, entry in out["budgets"][str(T)]["rows"].items():
            entry["same_every_round"] = len(ends[(T, name)]) == 1
        summarize(out["budgets"][str(T)])
    return out


def run(params: Params, *, models_dir: str | Path = "models", bos_id: int, rows: list[str] | None = None,
        dist: runtime.Dist | None = None, out: str | Path | None = None, block: int = 0) -> dict:
    """Timing block `block` of sample.throughput_blocks: every row (default: `timed_rows()`) timed
    in turns (module docstring) from its own batch seed and step window; the block's result,
    written to `out` when given. One process: runtime.nproc is not used."""
    cfg = params.sample
    blocks = int(cfg.throughput_blocks)
    rows = list(rows or timed_rows())
    if not rows:
        raise DataError("throughput: no Table 2 row samples (every row of ROWS has model None)")
    unknown = [r for r in rows if r not in ROWS or ROWS[r].model is None]
    if unknown:
        raise DataError(f"throughput: {', '.join(map(repr, unknown))} is not a Table 2 row that samples "
                        f"(those are {', '.join(timed_rows())})")
    budgets = [int(T) for T in cfg.steps]
    W = window_steps([b.K for b in cfg.budgets])
    starts = {T: start_step(T, W, block, blocks) for T in budgets}
    d = dist or runtime.setup(params.runtime)
    if d.world != 1:
        raise DataError("throughput: the rows are timed against each other in one process; run it without torchrun")
    runs = {name: sample_run(name, models_dir) for name in rows}
    for name, spec in runs.items():
        if not Path(spec.model_dir).is_dir():
            raise DataError(f"throughput: {spec.model_dir} (row {name}) does not exist: run the train stage first")

    t0 = time.perf_counter()
    batch = timing_batch(cfg)
    result: dict[str, Any] = {
        "format": BLOCK_FORMAT, "block": block, "blocks": blocks, "batch_seed": sampling.batch_seed(params.seed, block),
        "rows": rows, "references": [r for r in speed_references() if r in rows],
        "rounds": cfg.throughput_rounds, "batch": batch, "seq_len": cfg.canvas_length, "window": W,
        "start_steps": {str(T): s for T, s in starts.items()},
        "seed": params.seed, "device": str(d.device), "precision": d.precision,
        "autocast": sampling.network_autocast(d), "threads": torch.get_num_threads(), "processes": 1}
    models = {}  # each model directory loaded and prepared (weights cast) once; kept with its CUDA-graph handle
    for spec in runs.values():
        if spec.model_dir not in models:
            models[spec.model_dir] = sampling.prepare_model(
                sampling.load_pretrained(spec.model_dir, map_location=d.device), params, d)
    setup = time.perf_counter() - t0
    refresh = {T: cfg.refresh_every(T) for T in budgets}
    sections = [(batch, cfg.throughput_rounds)] + ([(1, cfg.throughput_batch1_rounds)] if cfg.throughput_batch1_rounds
                                                   else [])
    timed = {}
    for b, rounds in sections:
        t = time.perf_counter()  # the paused states: each row's trajectory to s(T), untimed
        ready = {T: {name: prepare(name, runs[name], models[runs[name].model_dir][0], params, d, T, b, starts[T], W,
                                   bos_id, block) for name in rows} for T in budgets}
        setup += time.perf_counter() - t
        timed[b] = _time_rounds(ready, refresh, rows, rounds)
    result.update(timed[batch])
    result["batch1"] = {"batch": 1, "rounds": sections[1][1], **timed[1]} if len(sections) > 1 else None
    result["setup_seconds"] = setup
    result["seconds"] = time.perf_counter() - t0
    if out is not None:
        atomic_write_json(out, result)
    return result


__all__ = ["timed_rows", "round_order", "sample_run", "window_steps", "start_step", "timing_batch", "Timed", "prepare",
           "run"]
