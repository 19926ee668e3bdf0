"""Table 1's rows and their runner: the tasks (arithmetic and the suite's benchmarks), one
`Table1Method` per row (the base, the control, TADM at each K, each training-free cache at each
K >= 2, the fusion replicates) built on one frozen base (:func:`build_methods`), and the `Runner`
that generates a prompt batch with every method in turn, counts its decoder-layer calls and its
FLOPs (`tadm.experiments.table1` runs it over tasks and seeds)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from tadm import runtime
from tadm.caches.catalog import tadm_calls
from tadm.config import Params
from tadm.data import arithmetic
from tadm.errors import DataError
from tadm.experiments.diffusiongemma import (
    DecoderLayerCalls, DecoderProbe, PromptIO, count_flops, fusion_model, load_models,
)
from tadm.posttrain.anchored import sampling_kwargs
from tadm.posttrain.data import arithmetic_eval_set
from tadm.posttrain.train import fusion_runs
from tadm.registry import DG_CACHES
from tadm.tasks.suite import build_task


# max_new_tokens per task in the paper (Sec. 6); arithmetic: one canvas
PAPER_LENGTHS = {"gsm8k": 1024, "humaneval": 1024, "gpqa_diamond": 2048, "mmlu_pro": 2048,
                 "livecodebench": 2000, "aime": 4096}


@dataclass
class Task:
    name: str
    prompts: list[str]
    score: Callable[[int, str], bool]  # (example index, completion) -> correct
    max_new_tokens: int


def arithmetic_task(sft_dir: Path, limit: int, canvas_length: int) -> Task:
    rows = arithmetic_eval_set(sft_dir, limit)
    return Task("arithmetic", [r["prompt"] for r in rows],
                lambda i, text: arithmetic.is_correct(text, rows[i]["answer"]), canvas_length)


def load_task(name: str, p: Params, sft_dir: Path, unsafe_host_execution: bool = False) -> Task:
    """A Table 1 task: its prompts, its scorer and its generation length. `unsafe_host_execution`
    (default off) lets HumanEval / LiveCodeBench run completions on the host where the sandbox
    cannot isolate them (see `tadm.tasks.sandbox`); otherwise scoring them refuses there."""
    pt = p.posttrain
    if name == "arithmetic":
        return arithmetic_task(sft_dir, pt.eval_examples, pt.canvas_length)

    source = pt.task_sources.get(name) or (p.sft.gsm8k if name == "gsm8k" else None)
    prompts, score = build_task(name, source, limit=pt.eval_examples, unsafe_host_execution=unsafe_host_execution)
    length = PAPER_LENGTHS[name] if not pt.max_new_tokens else min(PAPER_LENGTHS[name], pt.max_new_tokens)
    return Task(name, prompts, score, length)


CONTROL = "Control (fresh anchor)"  # Table 1's control row (models/dg_fresh, K = 1)


class Table1Method:
    """One row of Table 1: a `model` that generates on the frozen `base` (None: the base's own
    ``generate``) with the refresh interval `k` (None for the base), of a `family`: "base",
    "control" (a TimeAnchoredDiffusionGemma whose fusion acts on the fresh anchor, K = 1),
    "tadm", or a training-free cache's name in `tadm.registry.DG_CACHES` ("naive", "feature").
    `split` is the decoder's (s, a, d), which sets the closed-form layer calls."""

    def __init__(self, label: str, base, model, refresh_every: int | None, family: str = "tadm",
                 split: tuple[int, int, int] | None = None, seeds: list[int] | None = None, row: str | None = None,
                 run_seed: int | None = None):
        self.label, self.base, self.model, self.k, self.family = label, base, model, refresh_every, family
        self.split = tuple(split or model.split.split)
        self.seeds = list(seeds or [])  # its sampling seeds (build_methods sets them)
        # a fusion replicate's run: the row it belongs to and its training seed (None: a row's main run)
        self.row, self.run_seed = row or label, run_seed

    @property
    def decoder_owner(self):
        """The object whose ``forward`` generate calls once per denoising step."""
        return self.base if self.model is None else self.model

    @property
    def partial_layer_calls(self) -> float:
        """Partly recomputed layers so far, each weighted by its share of the canvas rows (the
        feature cache's; 0 for the methods whose every layer call is whole)."""
        return float(getattr(self.model, "partial_layer_calls", 0.0))

    @property
    def decoder_steps(self) -> int:
        """Denoising steps (decoder calls) its model has counted so far (0 without counters: the
        base), read around each generation as `partial_layer_calls` is, for the rows whose layer
        calls have no closed form."""
        return int(getattr(getattr(self.model, "counters", None), "steps", 0))

    def generate(self, ids, mask, **kw):
        if self.model is None:
            return self.base.generate(ids, attention_mask=mask, **kw)
        return self.model.generate(ids, attention_mask=mask, refresh_every=self.k, **kw)

    def layer_calls_per_step(self, steps: int, rows: int | None = None) -> float | None:
        """The closed form of the (weighted) layer calls per denoising step at `steps` steps a
        canvas of `rows` positions (`tadm.caches.budget`): L for the base, (s + d) + a R / T for
        TADM, a training-free cache's own closed form over T (`CacheMethod.layer_calls`: TADM's for
        the naive reuse, T + (L - 1) [R + (T - R) n_sel / N] for the feature cache); None for a
        cache without one (dKV-Cache, d²Cache: the rows they recompute follow the decoding), whose
        row reports its counted calls per step instead."""
        if self.k is None:
            return float(sum(self.split))
        cache = DG_CACHES.get(self.family)
        calls = tadm_calls if cache is None else cache.layer_calls
        return None if calls is None else calls(steps, self.k, self.split, self.model, rows or 1) / steps


class Runner(PromptIO):
    """Generates with each method on a task (prompt batches, seeds) and times it; the prompt
    batches are split over the processes of `dist` (None: one process on the CPU)."""

    def __init__(self, p: Params, tokenizer, methods: list[Table1Method], dist: runtime.Dist | None = None):
        self.dist = dist or runtime.Dist()
        super().__init__(tokenizer, self.dist.device)
        self.p, self.methods = p, methods

    def kwargs(self, max_new_tokens: int) -> dict:
        pt = self.p.posttrain
        return sampling_kwargs(pt.sample_steps, pt.entropy_bound, tuple(pt.temperature), max_new_tokens, self.eos, self.pad)

    def batch_starts(self, n: int) -> list[int]:
        return list(range(0, n, self.p.posttrain.eval_batch_size))

    @torch.no_grad()
    def generate_batch(self, method: Table1Method, prompts: list[str], max_new_tokens: int, seed: int,
                       lo: int) -> tuple[list[str], float, float]:
        """Completions of one prompt batch (examples lo, lo + 1, ...), seeded with (seed, lo), and
        the wall time of its ``generate`` call and of the decoder calls inside it."""
        ids, mask = self.encode(prompts)
        torch.manual_seed(seed * 1_000_003 + lo)
        with DecoderProbe(method.decoder_owner) as probe, self.dist.autocast():
            runtime.synchronize(self.device)
            t0 = time.perf_counter()
            seqs = method.generate(ids, mask, **self.kwargs(max_new_tokens)).sequences
            runtime.synchronize(self.device)
            seconds = time.perf_counter() - t0
        return self.decode(seqs, ids.shape[1]), seconds, probe.seconds

    def run_seed(self, task: Task, seed: int, methods: list[Table1Method] | None = None
                 ) -> dict[str, tuple[float, list[str], list[bool], int, float, list[tuple[int, float, float]], int]]:
        """Every method on every prompt batch of `task` with `seed`, the methods taking turns on
        each batch: the same prompts are timed for every method within seconds of each other,
        so machine-speed drift hits them alike and each batch is a paired comparison
        (:func:`paired_speedup`). Per method label: accuracy in %, the completions, each
        example's correctness (in example order), the decoder-layer calls the generations made
        (every process's batches: generated, scored and counted where they ran, then gathered),
        the same calls weighted (a partly recomputed layer counts its share of the rows: the
        feature cache's), every batch's timing (prompts, seconds of ``generate``, seconds in its
        decoder calls; each taken in the process that ran the batch), in batch order, and the
        denoising steps its model counted (:attr:`Table1Method.decoder_steps`). `methods`: these
        instead of the runner's."""
        methods = self.methods if methods is None else methods
        bs, starts, d = self.p.posttrain.eval_batch_size, self.batch_starts(len(task.prompts)), self.dist
        mine = {m.label: [] for m in methods}
        timed = {m.label: [] for m in methods}
        calls, weighted, steps = dict.fromkeys(mine, 0), dict.fromkeys(mine, 0.0), dict.fromkeys(mine, 0)
        for j in runtime.shard(len(starts), d):
            lo = starts[j]
            prompts = task.prompts[lo: lo + bs]
            for m in methods:
                counter = DecoderLayerCalls(m.base)  # this method's calls only
                partial, stepped = m.partial_layer_calls, m.decoder_steps
                try:
                    texts, seconds, decoder_seconds = self.generate_batch(m, prompts, task.max_new_tokens, seed, lo)
                finally:
                    counter.close()
                calls[m.label] += counter.calls
                weighted[m.label] += counter.calls + m.partial_layer_calls - partial
                steps[m.label] += m.decoder_steps - stepped
                mine[m.label].append((texts, [bool(task.score(lo + k, t)) for k, t in enumerate(texts)]))
                timed[m.label].append((len(prompts), seconds, decoder_seconds))
        out = {}
        for m in methods:  # the same collectives, in the same order, on every process
            batches = runtime.gather(mine[m.label], len(starts), d)
            counts = runtime.gather([(calls[m.label], weighted[m.label], steps[m.label])], d.world, d)
            texts = [t for ts, _ in batches for t in ts]
            correct = [c for _, cs in batches for c in cs]
            out[m.label] = (100.0 * sum(correct) / len(correct), texts, correct, sum(c for c, _, _ in counts),
                            sum(w for _, w, _ in counts), runtime.gather(timed[m.label], len(starts), d),
                            sum(n for _, _, n in counts))
        return out

    @torch.no_grad()
    def flops(self, task: Task) -> dict[str, dict]:
        """Per method on the first prompt batch: FLOPs of a whole ``generate`` and of its decoder
        calls (not timed; it is also every method's warm-up before the timed, scored runs). The
        counting (every op through a dispatch mode: a few times a plain ``generate``) is split
        over the processes, method i on process i mod world, the others warmed up by a plain
        ``generate``; the counts are the same on any process (the same batch and seed)."""
        ids, mask = self.encode(task.prompts[: self.p.posttrain.eval_batch_size])
        kw = self.kwargs(task.max_new_tokens)
        mine = set(runtime.shard(len(self.methods), self.dist))
        counted = []
        for i, m in enumerate(self.methods):
            torch.manual_seed(0)
            if i not in mine:
                with self.dist.autocast():
                    m.generate(ids, mask, **kw)
                continue
            with DecoderProbe(m.decoder_owner, count_flops=True) as probe, self.dist.autocast():
                total = count_flops(lambda: m.generate(ids, mask, **kw))
            counted.append({"flops": total, "decoder_flops": probe.flops})
        counts = runtime.gather(counted, len(self.methods), self.dist)
        return {m.label: c for m, c in zip(self.methods, counts)}

    def tokens_per_prompt(self, task: Task) -> int:
        """Generated canvas positions per prompt (every canvas counted whole)."""
        canvas = self.p.posttrain.canvas_length
        return (-(-task.max_new_tokens // canvas)) * canvas


def row_seeds(p: Params, family: str) -> list[int]:
    """A row's sampling seeds: posttrain.seeds, the training-free caches' posttrain.cache_seeds
    (which hold every seed of posttrain.seeds; [] = posttrain.seeds)."""
    pt = p.posttrain
    return list(pt.cache_seeds or pt.seeds) if family in DG_CACHES else list(pt.seeds)


def replicate_ks(p: Params) -> list[int]:
    """The refresh intervals at which Table 1 decodes the fusion replicates (posttrain.replicate_refresh_every;
    []: the largest K of posttrain.refresh_every)."""
    pt = p.posttrain
    return list(pt.replicate_refresh_every) or [max(pt.refresh_every)]


def build_methods(p: Params, root: Path = Path("."), dist: runtime.Dist | None = None,
                  control: bool = True) -> tuple[list[Table1Method], object]:
    """Table 1's rows, in order: the base, the fresh-anchor control (`control`), TADM at every K
    of posttrain.refresh_every, then each training-free cache of posttrain.cache_methods at every
    K >= 2 of it (at K = 1 each is the base), all on the one loaded base (:func:`load_models`);
    each with its sampling seeds (:func:`row_seeds`). These are the main runs; the fusion
    replicates' runs are :func:`replicate_methods`."""
    pt = p.posttrain
    base, tadm, fresh, tok = load_models(p, root, dist, control)
    split = tuple(tadm.split.split)
    seeds = row_seeds(p, "tadm")
    methods = [Table1Method("Base", base, None, None, "base", split, seeds=seeds)]
    if fresh is not None:
        methods.append(Table1Method(CONTROL, base, fresh, 1, "control", seeds=seeds, run_seed=pt.seed))
    methods += [Table1Method(f"TADM K={k}", base, tadm, k, "tadm", seeds=seeds, run_seed=pt.seed) for k in pt.refresh_every]
    for name in pt.cache_methods:
        cache = DG_CACHES[name]
        model = cache.build(base, p)  # one model per method: K is an argument of its generate
        methods += [Table1Method(f"{cache.label} K={k}", base, model, k, name, seeds=row_seeds(p, name))
                    for k in pt.refresh_every if k >= 2]
    return methods, tok


def replicate_seeds(p: Params, index: int) -> list[int]:
    """The sampling seeds of fusion run `index` (0: the main run, posttrain.seeds; replicate i:
    posttrain.seeds shifted by i x (max + 1)), so that no two runs of an arm share a sampling seed:
    each run's sampling noise is its own, and the between-run variance may subtract it."""
    seeds = list(p.posttrain.seeds)
    return [s + index * (max(seeds) + 1) for s in seeds]


def replicate_methods(p: Params, base, root: Path = Path("."), control: bool = True) -> list[Table1Method]:
    """The fusion replicates' runs of Table 1's trained rows, each fusion loaded on the same frozen
    `base`: TADM's replicates at every K of :func:`replicate_ks` (row "TADM K=k"), the control's as
    the control (K = 1), each at its own sampling seeds (:func:`replicate_seeds`); labelled
    "<row> (s<training seed>)". A missing replicate fusion is a DataError naming the command that
    trains it."""

    out = []
    for i, run in enumerate(fusion_runs(p, False, root)[1:], 1):
        model = _replicate_model(base, p, run)
        out += [Table1Method(f"TADM K={k} (s{run.seed})", base, model, k, "tadm", seeds=replicate_seeds(p, i),
                             row=f"TADM K={k}", run_seed=run.seed) for k in replicate_ks(p)]
    if control:
        for i, run in enumerate(fusion_runs(p, True, root)[1:], 1):
            out.append(Table1Method(f"{CONTROL} (s{run.seed})", base, _replicate_model(base, p, run), 1, "control",
                                    seeds=replicate_seeds(p, i), row=CONTROL, run_seed=run.seed))
    return out


def _replicate_model(base, p: Params, run):
    if not (run.model / "fusion.safetensors").is_file():
        raise DataError(f"{run.model}: no fusion replicate here (posttrain.replicates is {p.posttrain.replicates}; "
                        f"run dvc repro train, or alone: {run.command})")
    return fusion_model(base, p, run.model, fresh=run.fresh)
