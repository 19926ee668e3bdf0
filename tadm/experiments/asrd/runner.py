"""What the ASRD comparisons share (`tadm.experiments.asrd.compare` on the pipeline's models,
`tadm.experiments.asrd.llada` on LLaDA): the rows of a (task, model) group (`variants`), the per-row tally
(`Tally`) and the batch runner that splits a task's batches over the processes (`Batches`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

from tadm import runtime
from tadm.asrd.backends import Backend
from tadm.asrd.decode import DecodeSettings
from tadm.caches.catalog import CacheSpec
from tadm.config import Params

BASELINE = "Low-confidence (LLaDA)"
ASRD_BASE = "Low-confidence + threshold"  # ASRD without its mechanisms


@dataclass
class Variant:
    label: str
    settings: DecodeSettings
    refresh_every: int = 1  # > 1: the time-anchored model (anchor reused between refreshes)
    base: str | None = None  # the row that is this one without ASRD's mechanisms (or without its cache)
    cache: CacheSpec | None = None  # a training-free cache on LLaDA (`tadm.caches.llada`)
    # the rows of one method at several settings (K, R, per block, thresholds) share a family, whose
    # AUP is scored over them (`tadm.experiments.asrd.compare.aup_frame`); None: the row alone
    family: str | None = None


def backend_of(runner, v: Variant) -> Backend:
    """Row `v`'s backend from `runner`: its model with the row's anchor reuse, or its cache."""
    return runner.backend(v.refresh_every) if v.cache is None else runner.backend(v.refresh_every, cache=v.cache)


def _settings(p: Params, steps: int) -> tuple[DecodeSettings, DecodeSettings, DecodeSettings]:
    """(common settings, ASRD's base = low-confidence + threshold, ASRD) of asrd.*"""
    a = p.asrd
    common = DecodeSettings(steps=steps, block_size=a.block_size, temperature=a.temperature, eta=a.eta, t_on=a.t_on,
                            t_off=a.t_off, alpha_on=a.alpha_on, capacity=a.capacity, window=a.window,
                            verify_below=a.verify_below)
    base = common.replace(method="low-confidence", threshold=a.threshold)
    return common, base, base.replace(method="asrd", guidance=a.guidance, perturbation=a.perturbation)


def variants(p: Params, steps: int, time_anchored: bool) -> list[Variant]:
    """The rows of one (task, model) group. On the time-anchored model the matched row
    (low-confidence + threshold + TADM, ASRD's settings without its mechanisms, same K) comes
    with ASRD + TADM, so ASRD's effect on TADM is read against TADM alone."""
    a = p.asrd
    common, base, asrd = _settings(p, steps)
    out = [Variant("Plain (MDLM ancestral)", common.replace(method="plain")),
           Variant("ReMDM-loop", common.replace(method="remdm")),
           Variant(BASELINE, common.replace(method="low-confidence")),
           Variant(ASRD_BASE, base),
           Variant("ASRD", asrd, base=ASRD_BASE),
           Variant("ASRD, guidance only", asrd.replace(perturbation=0.0), base=ASRD_BASE),
           Variant("ASRD, verification only", asrd.replace(guidance=0.0), base=ASRD_BASE)]
    if time_anchored:
        matched = f"{ASRD_BASE} + TADM K={a.refresh_every}"
        out += [Variant(matched, base, a.refresh_every, family=ASRD_BASE),
                Variant(f"ASRD + TADM K={a.refresh_every}", asrd, a.refresh_every, base=matched, family="ASRD")]
    return out


@dataclass
class Tally:
    accuracies: list[float] = field(default_factory=list)
    tokens: int = 0
    batches: int = 0
    calls: int = 0
    layer_calls: int = 0
    layer_calls_weighted: float = 0.0
    refreshes: int = 0
    remasked: int = 0
    verified: int = 0
    sequences: int = 0
    examples: list[str] = field(default_factory=list)
    batch_seconds: list[float] = field(default_factory=list)  # in decoding order (paired across methods)

    @property
    def seconds(self) -> float:
        """Decoding seconds of every batch, summed."""
        return sum(self.batch_seconds)

    def row(self) -> dict:
        acc = self.accuracies
        per_batch = lambda v: v / self.batches  # noqa: E731
        return {"accuracy": statistics.mean(acc), "accuracy_sd": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                "accuracy_seeds": acc, "tokens_per_s": self.tokens / self.seconds,
                "tokens_per_batch": per_batch(self.tokens),
                "calls_per_batch": per_batch(self.calls), "layer_calls_per_batch": per_batch(self.layer_calls),
                "layer_calls_weighted_per_batch": per_batch(self.layer_calls_weighted),
                "refreshes_per_batch": per_batch(self.refreshes),
                "remasked_per_sequence": self.remasked / self.sequences,
                "verified_per_sequence": self.verified / self.sequences, "examples": self.examples[:5],
                "batch_seconds": self.batch_seconds}


class Batches:
    """Decodes a task's batches (`decode_batch(lo)` -> (result, texts, generated tokens)) split
    over the processes of `dist`, scores each where it ran, and puts counters, scores and texts
    back in batch order. A runner's ``decoder(backend, task, settings)`` makes `decode_batch`."""

    dist: runtime.Dist
    batch: int

    def run(self, backend: Backend, task, settings: DecodeSettings, tally: Tally) -> float:
        """Accuracy (%) of `settings` on `task`; counters, time and examples go to `tally`."""
        return self.run_interleaved(task, [(self.decoder(backend, task, settings), tally)])[0]

    def run_interleaved(self, task, jobs: list[tuple[Callable, Tally]]) -> list[float]:
        """Accuracy (%) of each (decode_batch, tally) job on `task`, the jobs taking turns on
        every batch (batch 1 by every job, then batch 2, ...), so that machine-speed drift over
        the run hits every method alike instead of whichever ran in a slow stretch."""
        starts = list(range(0, len(task), self.batch))
        mine = [[] for _ in jobs]
        for j in runtime.shard(len(starts), self.dist):
            for out, (decode_batch, _) in zip(mine, jobs):
                with self.dist.autocast():
                    r, texts, generated = decode_batch(starts[j])
                c = r.counters
                out.append({"texts": texts, "correct": [bool(task.score(starts[j] + k, t)) for k, t in enumerate(texts)],
                            "generated": generated, "seconds": r.seconds, "calls": c.calls,
                            "layer_calls": c.layer_calls, "layer_calls_weighted": c.layer_calls_weighted,
                            "refreshes": c.refreshes,
                            "remasked": r.remasked, "verified": r.verified, "sequences": len(r.tokens)})
        accuracies = []
        for out, (_, tally) in zip(mine, jobs):  # the same collectives, in the same order, on every process
            batches = runtime.gather(out, len(starts), self.dist)
            for b in batches:
                _count(tally, b)
            texts = [t for b in batches for t in b["texts"]]
            correct = [c for b in batches for c in b["correct"]]
            if not tally.examples:
                tally.examples = texts[:5]
            accuracies.append(100.0 * sum(correct) / len(correct))
        return accuracies


def _count(tally: Tally, b: dict) -> None:
    tally.batch_seconds.append(b["seconds"])
    tally.tokens += b["generated"]
    tally.batches += 1
    tally.calls += b["calls"]
    tally.layer_calls += b["layer_calls"]
    tally.layer_calls_weighted += b["layer_calls_weighted"]
    tally.refreshes += b["refreshes"]
    tally.remasked += b["remasked"]
    tally.verified += b["verified"]
    tally.sequences += b["sequences"]
