"""The ASRD comparison: ASRD against the remasking baselines on two tasks and two models.

Models (both trained by the pipeline):
- ``masked``: the absorbing-state MDLM of ``models/asrd_mdlm`` (`tadm.asrd.train`), on the
  fixed [prompt | response] layout, both tasks (arithmetic, numbers in words);
- ``diffusiongemma``: the post-train DiffusionGemma base (uniform-state, ``models/dg_base``)
  on the arithmetic task (the task it was trained on), plus ASRD on the time-anchored
  DiffusionGemma (the trained fusion of ``models/dg_tadm``, anchor refreshed every K passes).

Methods (`tadm.asrd.decode`): plain (MDLM ancestral), ReMDM-loop, low-confidence remasking
(LLaDA), low-confidence with the parallel-commit threshold (ASRD's base), ASRD, and ASRD with
one mechanism off; on the time-anchored DiffusionGemma, ASRD + TADM and its matched row
(low-confidence + threshold + TADM: the same settings and K without ASRD's mechanisms), so the
table reads ASRD's effect on TADM apart from TADM's own. Each ASRD row names its base (`base`)
and the table gives its accuracy against it. Each is run with every seed of ``asrd.seeds``;
accuracy is the mean (and sd) over seeds. Tokens/s counts generated positions over the
decoding loop's wall time (all seeds and batches; the methods interleaved batch by batch), and
the speed-up is against low-confidence remasking measured in the same run: the median over
batches of the paired time ratio, ± its bootstrap se; model calls and
transformer-layer calls are per decoded batch (ASRD's checks ride on its generation passes:
no verification call), checked / remasked candidates per sequence. On LLaDA (paper profile) the
group ends with training-free cache rows (`tadm.experiments.asrd.llada.cache_variants`), each read against
its reference row: "Compute × own base" is weighted layer calls against that row's, "matched"
only within 0.01 of TADM's share at the row's refresh interval K.

Sweeps (`sweep_points`, `run_sweeps`): the anchor tokens cache's capacity
(asrd.sweep_capacity), the window k (asrd.sweep_window) and the block size
(asrd.sweep_block_size, with ASRD's base at each), one at a time around the default, on the
masked model and both tasks, with the first seed on the first asrd.sweep_examples examples.

Where it runs: the device and autocast of a `tadm.runtime.Dist` (``runtime.setup(p.runtime)``; the
notebook overrides runtime.device / runtime.precision). In several processes
(`tadm.experiments.worker.processes`: runtime.nproc > 1, or on a CPU runtime.cpu_processes > 1)
``run`` relaunches itself under torchrun (`tadm.experiments.worker`): the decoded batches of every (method, seed)
are split over the processes (batch j by process j mod N; a batch's draws depend only on the
seed), and the completions, per-example correctness, counters and decoding seconds are gathered
in batch order, so accuracies, calls and remasks are those of one process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from tadm import runtime
from tadm.asrd import tasks as T
from tadm.asrd.backends import Backend, DiffusionGemmaBackend, MaskedBackend
from tadm.asrd.decode import DecodeSettings, decode
from tadm.asrd.train import MODEL_DIR, task_sets
from tadm.config import Params
from tadm.data.tokenizer import load_tokenizer
from tadm.errors import DataError
from tadm.experiments import diffusiongemma, worker
from tadm.experiments.asrd.llada import llada_plan  # the seed's own model family (paper profile; none by default)
from tadm.experiments.asrd.runner import ASRD_BASE, BASELINE, Batches, Tally, Variant, _settings, backend_of, variants  # noqa: F401 - the comparison's names
from tadm.experiments.table1_render import speed_cell
from tadm.experiments.worker import optional_path
from tadm.io import atomic_write_json
from tadm.metrics import aup as aup_score
from tadm.metrics.bootstrap import paired_speedup
from tadm.models import load_pretrained

SWEEPS = ("capacity", "window", "block_size")


@dataclass
class SweepPoint:
    sweep: str  # one of SWEEPS: the one setting moved away from the default
    value: int
    asrd: DecodeSettings
    base: DecodeSettings  # ASRD's base at the same block size
    default: DecodeSettings  # ASRD at asrd.*

    @property
    def is_default(self) -> bool:
        return self.asrd == self.default


def sweep_points(p: Params) -> list[SweepPoint]:
    """One-at-a-time sweeps around the default ASRD on the masked model: asrd.sweep_capacity,
    asrd.sweep_window, asrd.sweep_block_size (its base, low-confidence + threshold, is run at
    each block size too)."""
    a = p.asrd
    _, base, asrd = _settings(p, a.steps)
    points = [SweepPoint("capacity", c, asrd.replace(capacity=c), base, asrd) for c in a.sweep_capacity]
    points += [SweepPoint("window", k, asrd.replace(window=k), base, asrd) for k in a.sweep_window]
    points += [SweepPoint("block_size", b, asrd.replace(block_size=b), base.replace(block_size=b), asrd)
               for b in a.sweep_block_size]
    return points


def _subset(task: T.TaskSet, n: int) -> T.TaskSet:
    """The first n examples of `task` (n = 0: all)."""
    if n == 0 or n >= len(task):
        return task
    return dataclasses.replace(task, prompts=task.prompts[:n], responses=task.responses[:n], answers=task.answers[:n])


class MaskedRunner(Batches):
    """The masked model on the fixed layout."""

    name = "masked"

    def __init__(self, p: Params, tokenizer, root: Path, dist: runtime.Dist | None = None):
        self.dist = dist or runtime.setup(p.runtime)
        self.model = load_pretrained(root / MODEL_DIR, map_location=self.dist.device)
        self.layout = T.Layout(tokenizer, p.asrd.prompt_tokens, p.asrd.response_tokens)
        if self.model.seq_len != self.layout.length:
            raise DataError(f"{root / MODEL_DIR} was trained on length {self.model.seq_len}, asrd.prompt_tokens + "
                            f"asrd.response_tokens is {self.layout.length}: retrain it (python -m tadm asrd-model --restart)")
        self.batch = p.asrd.batch_size

    def backend(self, refresh_every: int) -> Backend:
        return MaskedBackend(self.model, refresh_every)

    def decoder(self, backend: Backend, task: T.TaskSet, settings: DecodeSettings) -> Callable:
        canvases, region = self.layout.encode(task.prompts), self.layout.region

        def decode_batch(lo: int):
            r = decode(backend, canvases[lo: lo + self.batch], region, settings)
            return r, self.layout.decode(runtime.host(r.tokens)), len(r.tokens) * int(region.sum())

        return decode_batch


class DiffusionGemmaRunner(Batches):
    """The post-train DiffusionGemma: the prompt in the encoder cache, one canvas generated."""

    name = "diffusiongemma"

    def __init__(self, p: Params, root: Path, dist: runtime.Dist | None = None):
        self.dist = dist or runtime.setup(p.runtime)
        # Table 1's loading (base, split, trained fusion, tokenizer), prompt encoding and
        # completion decoding
        _, self.tadm, _, tok = diffusiongemma.load_models(p, root, self.dist, control=False)
        self.io = diffusiongemma.PromptIO(tok, self.dist.device)
        self.canvas, self.batch = p.posttrain.canvas_length, p.asrd.batch_size

    def backend(self, refresh_every: int) -> Backend:
        fusion = self.tadm.fusion if refresh_every > 1 else None
        return DiffusionGemmaBackend(self.tadm.split, fusion, refresh_every)

    def decoder(self, backend: DiffusionGemmaBackend, task: T.TaskSet, settings: DecodeSettings) -> Callable:
        region = torch.ones(self.canvas, dtype=torch.bool)

        def decode_batch(lo: int):
            context, mask = self.io.encode(task.prompts[lo: lo + self.batch])
            backend.set_context(context, mask)  # each method has its own backend: set per batch
            canvas = torch.full((len(context), self.canvas), self.io.pad, dtype=torch.long)
            r = decode(backend, canvas, region, settings)
            return r, self.io.decode(runtime.host(r.tokens), 0), r.tokens.numel()

        return decode_batch


def worker_job(p: Params, d: runtime.Dist, args: dict) -> dict:
    """Worker job "asrd" (`tadm.experiments.worker`): :func:`run` in one torchrun process."""
    log = print if d.main else (lambda *_: None)
    return run(p, root=Path(args["root"]), out=optional_path(args.get("out")), log=log, dist=d)


def run(p: Params, root: Path = Path("."), out: Path | None = None, log=print,
        dist: runtime.Dist | None = None) -> dict:
    """Every (task, model, method) over asrd.seeds; writes results/asrd.json. On the device of
    `dist` (None: `runtime.setup(p.runtime)`); with runtime.nproc > 1 (and not under torchrun
    already) in torchrun workers (`tadm.experiments.worker`), whose result is returned."""
    if worker.needs_launch(p, "asrd"):
        return worker.launch("asrd", p, {"root": str(root), "out": str(out or root / "results" / "asrd.json")})
    a = p.asrd
    d = dist or runtime.setup(p.runtime)
    sets = {name: pair[1] for name, pair in task_sets(p, root).items()}
    masked = MaskedRunner(p, load_tokenizer(root / "data" / "tokenizer"), root, d)
    dg = DiffusionGemmaRunner(p, root, d)
    plan = [("arithmetic", masked, variants(p, a.steps, False)), ("spelling", masked, variants(p, a.steps, False)),
            ("arithmetic", dg, variants(p, a.dg_steps, True))]

    for name, task, runner, vs in llada_plan(p, d):
        plan.append((name, runner, vs))
        sets[name] = task
    results = {"profile": p.profile, "seeds": list(a.seeds), "groups": []}
    bar = tqdm(total=sum(len(v) for _, _, v in plan) * len(a.seeds), desc="asrd", unit="run", disable=not d.main)
    for task_name, runner, vs in plan:
        task = sets[task_name]
        backends = {v.label: backend_of(runner, v) for v in vs}
        tallies = {v.label: Tally() for v in vs}
        for seed in a.seeds:  # methods interleaved batch by batch, so machine-speed drift hits them alike
            jobs = [(runner.decoder(backends[v.label], task, v.settings.replace(seed=seed)), tallies[v.label]) for v in vs]
            for v, acc in zip(vs, runner.run_interleaved(task, jobs)):
                tallies[v.label].accuracies.append(acc)
            bar.update(len(vs))
        rows = {v.label: {**tallies[v.label].row(), "refresh_every": v.refresh_every, "base": v.base,
                          "family": v.family or v.label,
                          "budget_x": getattr(backends[v.label], "budget_x", None),
                          "settings": dataclass_dict(v.settings)} for v in vs}
        results["groups"].append({"task": task_name, "model": runner.name, "n": len(task), "methods": rows})
        if d.main:
            log(f"asrd[{task_name}/{runner.name}]: " + ", ".join(f"{k} {r['accuracy']:.1f}%" for k, r in rows.items()))
    bar.close()
    results["sweeps"] = run_sweeps(p, masked, sets, log if d.main else (lambda *_: None))
    if d.main:
        atomic_write_json(out or root / "results" / "asrd.json", results)
    return results


def run_sweeps(p: Params, runner: MaskedRunner, sets: dict[str, T.TaskSet], log=print) -> dict:
    """The one-at-a-time sweeps (`sweep_points`) on the masked model, both tasks, with the
    first seed of asrd.seeds on the first asrd.sweep_examples examples of each task. Each
    distinct setting is decoded once; the default point and the base are shared."""
    a = p.asrd
    points = sweep_points(p)
    seed = a.seeds[0]
    out = {"seed": seed, "examples": a.sweep_examples, "points": []}
    if not points:
        return out
    backend = runner.backend(1)
    for task_name in ("arithmetic", "spelling"):
        task = _subset(sets[task_name], a.sweep_examples)
        done: dict[DecodeSettings, dict] = {}
        for pt in points:
            for settings in (pt.asrd, pt.base):
                if settings not in done:
                    tally = Tally()
                    tally.accuracies.append(runner.run(backend, task, settings.replace(seed=seed), tally))
                    done[settings] = tally.row()
            out["points"].append({"task": task_name, "n": len(task), "sweep": pt.sweep, "value": pt.value,
                                  "default": pt.is_default, "asrd": done[pt.asrd], "base": done[pt.base]})
        log(f"asrd sweeps[{task_name}]: {len(done)} settings decoded on {len(task)} examples")
    return out


def dataclass_dict(settings: DecodeSettings) -> dict:
    return {k: v for k, v in dataclasses.asdict(settings).items() if k != "seed"}


# ----------------------------------------------------------------------------- the table


def frame(results: dict):
    """One line per (task, model, method). `delta_base_pts`: against the row that is the same
    method without ASRD's mechanisms (NaN where there is none). `speedup_x` (± `speedup_se`):
    against low-confidence remasking, the median over batches of its time / the method's on the
    same batch (`tadm.metrics.bootstrap.paired_speedup`; `run` decodes every batch with each
    method in turn, so each batch is a paired comparison). `compute_x`: weighted layer calls
    (`DecodeCounters.layer_calls_weighted`) against the own base's (NaN without one);
    `matched`: within 0.01 of the row's budget `budget_x` (TADM's share at its K; the LLaDA
    cache rows refreshed every K), never for a row without one."""
    import pandas as pd  # lazy: pandas takes ~0.4 s to import; only the results frame needs it

    lines = []
    for g in results["groups"]:
        ms = g["methods"]
        base = ms[BASELINE]
        for label, m in ms.items():
            own = ms[m["base"]]["accuracy"] if m.get("base") else float("nan")
            speedup, se = paired_speedup(base["batch_seconds"], m["batch_seconds"])
            compute = _weighted(m) / _weighted(ms[m["base"]]) if m.get("base") else float("nan")
            budget = float("nan") if m.get("budget_x") is None else m["budget_x"]
            lines.append({"task": g["task"], "model": g["model"], "method": label, "accuracy": m["accuracy"],
                          "sd": m["accuracy_sd"], "delta_pts": m["accuracy"] - base["accuracy"],
                          "base": m.get("base") or "", "delta_base_pts": m["accuracy"] - own,
                          "tokens_per_s": m["tokens_per_s"], "speedup_x": speedup, "speedup_se": se,
                          "calls": m["calls_per_batch"], "layer_calls": m["layer_calls_per_batch"],
                          "compute_x": compute, "budget_x": budget, "matched": abs(compute - budget) <= 0.01,
                          "remasked": m["remasked_per_sequence"],
                          "checked": m.get("verified_per_sequence", 0.0)})
    return pd.DataFrame(lines)


def _weighted(m: dict) -> float:
    """Weighted layer calls per batch (results written before they were counted: the plain count)."""
    return m.get("layer_calls_weighted_per_batch", m["layer_calls_per_batch"])


def _compute(x: float, budget: float, matched: bool) -> str:
    if x != x:
        return "—"
    return f"{x:.3f}" + ("" if budget != budget else f" (budget {budget:.3f}{', matched' if matched else ''})")


def _pts(x: float) -> str:
    return "—" if x != x else f"{x:+.1f}"  # NaN: no matched base


def to_markdown(df) -> str:
    head = ("| Task | Model | Method | Accuracy (%) | Δ vs LLaDA (pts) | Δ vs own base (pts) | Tokens/s | Speed-up "
            "| Model calls / batch | Layer calls / batch | Compute × own base | Checked / seq. | Remasked / seq. |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r.task} | {r.model} | {r.method} | {r.accuracy:.1f} ± {r.sd:.1f} | {r.delta_pts:+.1f} | {_pts(r.delta_base_pts)} | "
        f"{r.tokens_per_s:,.0f} | {speed_cell(r.speedup_x, r.speedup_se)} | {r.calls:.1f} | {r.layer_calls:.0f} | "
        f"{_compute(r.compute_x, r.budget_x, r.matched)} | {r.checked:.2f} | {r.remasked:.2f} |\n"
        for r in df.itertuples())
    return head + body


def aup_frame(results: dict):
    """AUP (`tadm.metrics.aup`, the d3LLM leaderboard's score) of every family with two rows or more
    in a (task, model) group -- one method at several settings (`Variant.family`: ASRD and its
    base with and without TADM's anchor reuse; each LLaDA cache at its intervals) -- over tokens
    per forward (generated tokens / model calls, the leaderboard's rho) and over tokens per
    full-model-equivalent forward (generated tokens / (weighted layer calls / the layers of one full
    call, read off the low-confidence row, whose every call is full); this project's reading);
    y_max the group's best row. Rows of results written before families were recorded form none."""
    import pandas as pd  # lazy: pandas takes ~0.4 s to import; only the AUP frame needs it

    lines = []
    for g in results["groups"]:
        ms = g["methods"]
        full = round(ms[BASELINE]["layer_calls_per_batch"] / ms[BASELINE]["calls_per_batch"])  # layers of one full call
        y_max = max(m["accuracy"] for m in ms.values())
        families: dict[str, list[tuple[str, dict]]] = {}
        for label, m in ms.items():
            if "family" in m and "tokens_per_batch" in m:
                families.setdefault(m["family"], []).append((label, m))
        for family, rows in families.items():
            if len(rows) < 2:
                continue
            ys = [m["accuracy"] for _, m in rows]
            tpf = [aup_score.tokens_per_forward(m["tokens_per_batch"], m["calls_per_batch"]) for _, m in rows]
            eq = [aup_score.equivalent_rho(m["tokens_per_batch"], _weighted(m), full) for _, m in rows]
            score = {name: aup_score.aup(rho, ys, y_max) if y_max > 0 else None for name, rho in (("tpf", tpf), ("eq", eq))}
            lines.append({"task": g["task"], "model": g["model"], "family": family,
                          "settings": " / ".join(label for label, _ in rows), "y_max": y_max,
                          "aup_tpf": score["tpf"], "aup_equivalent": score["eq"],
                          "unscored": aup_score.unscored_reason(tpf, ys) or ""})
    return pd.DataFrame(lines, columns=["task", "model", "family", "settings", "y_max", "aup_tpf", "aup_equivalent",
                                        "unscored"])


def aup_markdown(results: dict) -> str:
    """The AUP section under the ASRD table (`aup_frame`); empty where no family has two rows."""
    a = aup_frame(results)
    if not len(a):
        return ""
    cell = lambda v: "not scored" if v is None or v != v else f"{v:.1f}"  # noqa: E731
    rows = "".join(f"| {r.task} | {r.model} | {r.family} | {r.settings} | {r.y_max:.1f} | {cell(r.aup_tpf)} | "
                   f"{cell(r.aup_equivalent)} |\n" for r in a.itertuples())
    return ("\n**AUP** (accuracy under parallelism, the d3LLM leaderboard's score; `tadm.metrics.aup`, alpha = "
            f"{aup_score.ALPHA:g}, offset = {aup_score.OFFSET:g}; docs/glossary.md) of each method with two settings "
            "or more in its group, y_max the group's best row: over tokens per forward (generated tokens / model calls, "
            "the leaderboard's axis) and over tokens per full-model-equivalent forward (weighted layer calls / the "
            "layers of one full call, this project's reading, which sees anchor reuse and caches).\n\n"
            "| Task | Model | Method | Settings | y_max (%) | AUP, tokens / forward | AUP, tokens / full-model forward |\n"
            "|---|---|---|---|---|---|---|\n" + rows)


def metrics_dict(df) -> dict:
    out = {}
    for r in df.itertuples():
        key = f"{r.task}_{r.model}_" + "".join(ch for ch in r.method if ch.isalnum())
        out.update({f"{key}_accuracy": round(r.accuracy, 3), f"{key}_speedup_x": round(r.speedup_x, 4),
                    f"{key}_calls": round(r.calls, 3)})
    return out


# ----------------------------------------------------------------------------- the sweeps


def sweep_frame(results: dict):
    """One line per (task, sweep, value): ASRD and its base (low-confidence + threshold at the
    same block size) on the sweeps' examples and seed."""
    import pandas as pd  # lazy: pandas takes ~0.4 s to import; only the sweep frame needs it

    lines = []
    for pt in results.get("sweeps", {}).get("points", []):
        s, b = pt["asrd"], pt["base"]
        lines.append({"task": pt["task"], "n": pt["n"], "sweep": pt["sweep"], "value": pt["value"],
                      "default": pt["default"], "accuracy": s["accuracy"], "base_accuracy": b["accuracy"],
                      "delta_base_pts": s["accuracy"] - b["accuracy"], "tokens_per_s": s["tokens_per_s"],
                      "speedup_x": s["tokens_per_s"] / b["tokens_per_s"], "calls": s["calls_per_batch"],
                      "base_calls": b["calls_per_batch"], "checked": s["verified_per_sequence"],
                      "remasked": s["remasked_per_sequence"]})
    return pd.DataFrame(lines)


def sweep_caption(p: Params, results: dict) -> str:
    sw = results.get("sweeps", {})
    n = "all" if not sw.get("examples") else f"the first {sw['examples']}"
    return (f"ASRD sweeps ({p.profile} profile): the anchor tokens cache's capacity, the consistency window k and the "
            f"semi-AR block size, one at a time around the default (capacity {p.asrd.capacity}, k = {p.asrd.window}, "
            f"block {p.asrd.block_size}; * marks it), on the masked model; one seed ({sw.get('seed')}) and {n} examples "
            f"of each task, so the accuracies are noisier than the main table's; ASRD's base is low-confidence + "
            f"threshold at the same block size (response length {p.asrd.response_tokens}, {p.asrd.steps} steps)")


def sweep_markdown(df) -> str:
    head = ("| Task | Sweep | Value | ASRD accuracy (%) | Base accuracy (%) | Δ vs base (pts) | Tokens/s | Speed-up vs base "
            "| Model calls / batch | Base calls / batch | Checked / seq. | Remasked / seq. |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r.task} | {r.sweep} | {r.value}{'*' if r.default else ''} | {r.accuracy:.1f} | {r.base_accuracy:.1f} | "
        f"{r.delta_base_pts:+.1f} | {r.tokens_per_s:,.0f} | {r.speedup_x:.2f}x | {r.calls:.1f} | {r.base_calls:.1f} | "
        f"{r.checked:.2f} | {r.remasked:.2f} |\n"
        for r in df.itertuples())
    return head + body
