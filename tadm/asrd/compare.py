"""The ASRD comparison: ASRD against the remasking baselines on two tasks and two models.

Models (both trained by the pipeline):
- ``masked``: the absorbing-state MDLM of ``models/asrd_mdlm`` (`tadm.asrd.train`), on the
  fixed [prompt | response] layout, both tasks (arithmetic, numbers in words);
- ``diffusiongemma``: the post-train DiffusionGemma base (uniform-state, ``models/dg_base``)
  on the arithmetic task (the task it was trained on), plus ASRD on the time-anchored
  DiffusionGemma (the trained fusion of ``models/dg_tadm``, anchor refreshed every K passes).

Methods (`tadm.asrd.decode`): plain (MDLM ancestral), ReMDM-loop, low-confidence remasking
(LLaDA), low-confidence with the parallel-commit threshold (ASRD's base), ASRD, and ASRD with
one mechanism off. Each is run with every seed of ``asrd.seeds``; accuracy is the mean (and
sd) over seeds. Tokens/s counts generated positions over the decoding loop's wall time (all
seeds and batches; the methods interleaved seed by seed), and the speed-up is against
low-confidence remasking measured in the same run; model calls, verification calls and transformer-layer calls are per decoded batch.

Where it runs: the device and autocast of a `tadm.runtime.Dist` (``runtime.setup(p.runtime)``; the
notebook overrides runtime.device / runtime.precision). With runtime.nproc > 1 ``run`` relaunches
itself under torchrun (`tadm.experiments.worker`): the decoded batches of every (method, seed)
are split over the processes (batch j by process j mod N; a batch's draws depend only on the
seed), and the completions, per-example correctness, counters and decoding seconds are gathered
in batch order, so accuracies, calls and remasks are those of one process.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from tadm import runtime
from tadm.asrd import tasks as T
from tadm.asrd.backends import Backend, DiffusionGemmaBackend, MaskedBackend
from tadm.asrd.decode import DecodeSettings, decode
from tadm.asrd.train import MODEL_DIR, task_sets
from tadm.config import Params
from tadm.errors import DataError
from tadm.io import atomic_write_json

BASELINE = "Low-confidence (LLaDA)"


@dataclass
class Variant:
    label: str
    settings: DecodeSettings
    refresh_every: int = 1  # > 1: the time-anchored model (anchor reused between refreshes)


def variants(p: Params, steps: int, time_anchored: bool) -> list[Variant]:
    a = p.asrd
    base = DecodeSettings(steps=steps, block_size=a.block_size, temperature=a.temperature, eta=a.eta, t_on=a.t_on,
                          t_off=a.t_off, alpha_on=a.alpha_on, capacity=a.capacity, window=a.window,
                          verify_below=a.verify_below)
    asrd = base.replace(method="asrd", threshold=a.threshold, guidance=a.guidance, perturbation=a.perturbation)
    out = [Variant("Plain (MDLM ancestral)", base.replace(method="plain")),
           Variant("ReMDM-loop", base.replace(method="remdm")),
           Variant(BASELINE, base.replace(method="low-confidence")),
           Variant("Low-confidence + threshold", base.replace(method="low-confidence", threshold=a.threshold)),
           Variant("ASRD", asrd),
           Variant("ASRD, guidance only", asrd.replace(perturbation=0.0)),
           Variant("ASRD, verification only", asrd.replace(guidance=0.0))]
    if time_anchored:
        out.append(Variant(f"ASRD + TADM K={a.refresh_every}", asrd, a.refresh_every))
    return out


@dataclass
class Tally:
    accuracies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    tokens: int = 0
    batches: int = 0
    calls: int = 0
    verify_calls: int = 0
    layer_calls: int = 0
    refreshes: int = 0
    remasked: int = 0
    sequences: int = 0
    examples: list[str] = field(default_factory=list)

    def row(self) -> dict:
        acc = self.accuracies
        per_batch = lambda v: v / self.batches  # noqa: E731
        return {"accuracy": statistics.mean(acc), "accuracy_sd": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                "accuracy_seeds": acc, "tokens_per_s": self.tokens / self.seconds,
                "calls_per_batch": per_batch(self.calls), "verify_calls_per_batch": per_batch(self.verify_calls),
                "layer_calls_per_batch": per_batch(self.layer_calls), "refreshes_per_batch": per_batch(self.refreshes),
                "remasked_per_sequence": self.remasked / self.sequences, "examples": self.examples[:5]}


class _Batches:
    """Decodes a task's batches (`decode_batch(lo)` -> (result, texts)) split over the processes of
    `dist`, scores each where it ran, and puts counters, scores and texts back in batch order."""

    dist: runtime.Dist
    batch: int

    def _run_batches(self, task: T.TaskSet, tally: Tally, decode_batch) -> float:
        starts = list(range(0, len(task), self.batch))
        mine = []
        for j in runtime.shard(len(starts), self.dist):
            with self.dist.autocast():
                r, texts, generated = decode_batch(starts[j])
            c = r.counters
            mine.append({"texts": texts, "correct": [bool(task.score(starts[j] + k, t)) for k, t in enumerate(texts)],
                         "generated": generated, "seconds": r.seconds, "calls": c.calls, "verify_calls": c.verify_calls,
                         "layer_calls": c.layer_calls, "refreshes": c.refreshes, "remasked": r.remasked,
                         "sequences": len(r.tokens)})
        batches = runtime.gather(mine, len(starts), self.dist)
        for b in batches:
            _count(tally, b)
        texts = [t for b in batches for t in b["texts"]]
        correct = [c for b in batches for c in b["correct"]]
        if not tally.examples:
            tally.examples = texts[:5]
        return 100.0 * sum(correct) / len(correct)


class MaskedRunner(_Batches):
    """The masked model on the fixed layout."""

    name = "masked"

    def __init__(self, p: Params, tokenizer, root: Path, dist: runtime.Dist | None = None):
        from tadm.models import load_pretrained

        self.dist = dist or runtime.setup(p.runtime)
        self.model = load_pretrained(root / MODEL_DIR, map_location=self.dist.device)
        self.layout = T.Layout(tokenizer, p.asrd.prompt_tokens, p.asrd.response_tokens)
        if self.model.seq_len != self.layout.length:
            raise DataError(f"{root / MODEL_DIR} was trained on length {self.model.seq_len}, asrd.prompt_tokens + "
                            f"asrd.response_tokens is {self.layout.length}: rerun the asrd_model stage")
        self.batch = p.asrd.batch_size

    def backend(self, refresh_every: int) -> Backend:
        return MaskedBackend(self.model, refresh_every)

    def run(self, backend: Backend, task: T.TaskSet, settings: DecodeSettings, tally: Tally) -> float:
        canvases, region = self.layout.encode(task.prompts), self.layout.region

        def decode_batch(lo: int):
            r = decode(backend, canvases[lo: lo + self.batch], region, settings)
            return r, self.layout.decode(runtime.host(r.tokens)), len(r.tokens) * int(region.sum())

        return self._run_batches(task, tally, decode_batch)


class DiffusionGemmaRunner(_Batches):
    """The post-train DiffusionGemma: the prompt in the encoder cache, one canvas generated."""

    name = "diffusiongemma"

    def __init__(self, p: Params, root: Path, dist: runtime.Dist | None = None):
        from tadm.posttrain import table1

        self.dist = dist or runtime.setup(p.runtime)
        # Table 1's loading (base, split, trained fusion, tokenizer) and its prompt encoding /
        # completion decoding
        methods, tok = table1.build_methods(p, root, self.dist)
        self.tadm = methods[0].tadm
        self.io = table1.Runner(p, tok, [], self.dist)
        self.canvas, self.batch = p.posttrain.canvas_length, p.asrd.batch_size

    def backend(self, refresh_every: int) -> Backend:
        fusion = self.tadm.fusion if refresh_every > 1 else None
        return DiffusionGemmaBackend(self.tadm.split, fusion, refresh_every)

    def run(self, backend: DiffusionGemmaBackend, task: T.TaskSet, settings: DecodeSettings, tally: Tally) -> float:
        region = torch.ones(self.canvas, dtype=torch.bool)

        def decode_batch(lo: int):
            context, mask = self.io.encode(task.prompts[lo: lo + self.batch])
            backend.set_context(context, mask)
            canvas = torch.full((len(context), self.canvas), self.io.pad, dtype=torch.long)
            r = decode(backend, canvas, region, settings)
            return r, self.io.decode(runtime.host(r.tokens), 0), r.tokens.numel()

        return self._run_batches(task, tally, decode_batch)


def _count(tally: Tally, b: dict) -> None:
    tally.seconds += b["seconds"]
    tally.tokens += b["generated"]
    tally.batches += 1
    tally.calls += b["calls"]
    tally.verify_calls += b["verify_calls"]
    tally.layer_calls += b["layer_calls"]
    tally.refreshes += b["refreshes"]
    tally.remasked += b["remasked"]
    tally.sequences += b["sequences"]


def run(p: Params, root: Path = Path("."), out: Path | None = None, log=print,
        dist: runtime.Dist | None = None) -> dict:
    """Every (task, model, method) over asrd.seeds; writes results/asrd.json. On the device of
    `dist` (None: `runtime.setup(p.runtime)`); with runtime.nproc > 1 (and not under torchrun
    already) in torchrun workers (`tadm.experiments.worker`), whose result is returned."""
    from tadm.data.tokenizer import load_tokenizer
    from tadm.experiments import worker

    if worker.needs_launch(p):
        return worker.launch("asrd", p, {"root": str(root), "out": str(out or root / "results" / "asrd.json")})
    a = p.asrd
    d = dist or runtime.setup(p.runtime)
    sets = {name: pair[1] for name, pair in task_sets(p, root).items()}
    masked = MaskedRunner(p, load_tokenizer(root / "data" / "tokenizer"), root, d)
    dg = DiffusionGemmaRunner(p, root, d)
    plan = [("arithmetic", masked, variants(p, a.steps, False)), ("spelling", masked, variants(p, a.steps, False)),
            ("arithmetic", dg, variants(p, a.dg_steps, True))]
    results = {"profile": p.profile, "seeds": list(a.seeds), "groups": []}
    bar = tqdm(total=sum(len(v) for _, _, v in plan) * len(a.seeds), desc="asrd", unit="run", disable=not d.main)
    for task_name, runner, vs in plan:
        task = sets[task_name]
        backends = {v.label: runner.backend(v.refresh_every) for v in vs}
        tallies = {v.label: Tally() for v in vs}
        for seed in a.seeds:  # methods interleaved, so machine-speed drift hits them alike
            for v in vs:
                tally = tallies[v.label]
                tally.accuracies.append(runner.run(backends[v.label], task, v.settings.replace(seed=seed), tally))
                bar.update()
        rows = {v.label: {**tallies[v.label].row(), "refresh_every": v.refresh_every,
                          "settings": dataclass_dict(v.settings)} for v in vs}
        results["groups"].append({"task": task_name, "model": runner.name, "n": len(task), "methods": rows})
        if d.main:
            log(f"asrd[{task_name}/{runner.name}]: " + ", ".join(f"{k} {r['accuracy']:.1f}%" for k, r in rows.items()))
    bar.close()
    if d.main:
        atomic_write_json(out or root / "results" / "asrd.json", results)
    return results


def dataclass_dict(settings: DecodeSettings) -> dict:
    return {k: v for k, v in dataclasses.asdict(settings).items() if k != "seed"}


# ----------------------------------------------------------------------------- the table


def frame(results: dict):
    """One line per (task, model, method)."""
    import pandas as pd

    lines = []
    for g in results["groups"]:
        base = g["methods"][BASELINE]
        for label, m in g["methods"].items():
            lines.append({"task": g["task"], "model": g["model"], "method": label, "accuracy": m["accuracy"],
                          "sd": m["accuracy_sd"], "delta_pts": m["accuracy"] - base["accuracy"],
                          "tokens_per_s": m["tokens_per_s"], "speedup_x": m["tokens_per_s"] / base["tokens_per_s"],
                          "calls": m["calls_per_batch"], "verify_calls": m["verify_calls_per_batch"],
                          "layer_calls": m["layer_calls_per_batch"], "remasked": m["remasked_per_sequence"]})
    return pd.DataFrame(lines)


def to_markdown(df) -> str:
    head = ("| Task | Model | Method | Accuracy (%) | Δ vs LLaDA (pts) | Tokens/s | Speed-up | Model calls / batch "
            "| of which verification | Layer calls / batch | Remasked / seq. |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r.task} | {r.model} | {r.method} | {r.accuracy:.1f} ± {r.sd:.1f} | {r.delta_pts:+.1f} | {r.tokens_per_s:,.0f} | "
        f"{r.speedup_x:.2f}x | {r.calls:.1f} | {r.verify_calls:.1f} | {r.layer_calls:.0f} | {r.remasked:.2f} |\n"
        for r in df.itertuples())
    return head + body


def metrics_dict(df) -> dict:
    out = {}
    for r in df.itertuples():
        key = f"{r.task}_{r.model}_" + "".join(ch for ch in r.method if ch.isalnum())
        out.update({f"{key}_accuracy": round(r.accuracy, 3), f"{key}_speedup_x": round(r.speedup_x, 4),
                    f"{key}_calls": round(r.calls, 3)})
    return out
