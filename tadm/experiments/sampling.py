"""Sampling runs of the paper's tables: one saved sample set per (row, budget T).

A `SampleRun` names a trained model directory and how to sample it (sampler, TADM's refresh
policy, and for TADM's fusion ablation `bypass_fusion`: D(h) every step, the record then says
"bypass_fusion": true). `run_samples` draws `sample.num_samples` sequences of the canvas length
for one budget T with the profile's sampler settings, and writes

    <out>/T<T>.npy     the tokens (N, L) int64
    <out>/T<T>.json    the record: row, model, settings, counters, seconds, tokens/s, refreshes

Every network call of the budget is made (ddpm_cache off unless asked): Table 2 compares
methods at a fixed number of reverse steps, and its compute column counts them. AR has no T;
it draws L - 1 tokens left to right after BOS (one run serves every budget: `shared_record`).

Batches and processes. The N sequences are drawn in batches of `sample.batch_size`; batch i
is its own run of the sampler with its own generator, seeded with :func:`batch_seed` (seed, i):
batch 0 with the run's seed itself, batch i > 0 with a hash of (seed, i). A batch's tokens
therefore depend only on (seed, T, i) -- not on which process draws it or on the batches
before it -- so the batches can be split over the processes of a `tadm.runtime.Dist` (process
r draws batches r, r + N, ...) and put back in batch order, and 1 and N processes give the
same bits. The model runs on the run's device, its forwards under `runtime.autocast` (the
samplers' `autocast` setting: bf16 when runtime.precision is bf16, on a GPU or a CPU with native
bf16 (`runtime.effective_precision`), else fp32; the draws stay in sample.precision).

Precision and per-call overhead (`prepare_model`): where that autocast is bf16 the loaded
model's Linear weights are cast to bf16 once (`runtime.cast_for_autocast`), so no network call
re-casts a weight; the tokens are those of per-call autocast of fp32 weights, bit for bit (fp32
runs are untouched). With runtime.cuda_graphs on a CUDA device the pieces called with fixed
shapes at every step (DiT blocks, TADM's fusion, the conditioning vectors, ADLM's full-canvas
anchor head and input map) replay CUDA graphs (`tadm.cuda_graphs.cuda_graph_forwards`); off CUDA the
setting is ignored with a one-line note. Neither changes a record's fields.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tadm import cuda_graphs, runtime
from tadm.config import Params
from tadm.errors import ConfigError, DataError
from tadm.io import atomic_path, atomic_write_json, sha256_tree
from tadm.metrics.bootstrap import resamples, spread
from tadm.models import load_pretrained
from tadm.models.dit import ConditionEmbedder, DiTBlock
from tadm.models.fusion import Fusion
from tadm.registry import method_for
from tadm.sampling import (AdaptiveDrift, ComputeCounter, FixedInterval, RefreshPolicy, SamplerSettings, make_adapter,
                           sample, sample_ar)
from tadm.sampling.ar import ARSettings
from tadm.train.trainer import compile_blocks


@dataclass(frozen=True)
class SampleRun:
    """One row of a table: a model and how it is sampled."""

    name: str
    model_dir: str
    sampler: str | None = None  # None: the profile's sample.sampler
    K: int | None = None  # TADM: fixed refresh interval; None: the budget's K (sample.budgets)
    adaptive: float | None = None  # TADM: AdaptiveDrift threshold (changed fraction) instead of K
    ddpm_cache: bool = False
    bypass_fusion: bool = False  # TADM: the fusion ablation, D(h) every step (TADMAdapter)

    def policy(self, params: Params, steps: int) -> RefreshPolicy:
        """The refresh policy this run samples with at `steps` reverse steps: the adaptive one, an
        explicit K, or the budget's K (``sample.budgets``)."""
        if self.adaptive is not None:
            return AdaptiveDrift(self.adaptive)
        if self.K is not None:
            return FixedInterval(self.K)
        try:
            return FixedInterval(params.sample.refresh_every(steps))
        except ConfigError as e:
            raise DataError(f"{e.key}: {e.detail}: give K explicitly") from None


def batch_seed(seed: int, index: int) -> int:
    """The seed of sampling batch `index` of a run seeded with `seed`: `seed` itself for batch 0,
    a 63-bit hash of (seed, index) for the others."""
    if index == 0:
        return int(seed)
    digest = hashlib.sha256(f"tadm.sample-batch:{int(seed)}:{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def network_autocast(d: runtime.Dist) -> str:
    """The samplers' `autocast` setting on `d`: `runtime.effective_precision` of runtime.precision
    ("bf16" on a GPU or a CPU with native bf16, else "fp32")."""
    return d.effective_precision()


def graphed_pieces(model) -> list:
    """The modules of `model` a sampling step calls with the same shapes every time (what
    runtime.cuda_graphs replays): every DiT block, TADM's fusion, the conditioning embedders,
    and ADLM's anchor head and input map (both on the whole canvas); not the LM heads that
    project only the decoding rows (their row count changes from step to step); a method adds
    its own (`Method.graphed_pieces`)."""

    pieces = [m for m in model.modules() if isinstance(m, (DiTBlock, Fusion, ConditionEmbedder))]
    return pieces + method_for(model.model_type).graphed_pieces(model)


_NOTED: set[str] = set()


# sampling batches from which runtime.compile compiles the sampling network's blocks on a GPU:
# below, a step is bound by kernel launches, which CUDA graphs remove and compiled kernels do not
COMPILE_MIN_BATCH = 8


def compiles_sampling(params: Params, device) -> bool:
    """Whether `prepare_model` compiles the blocks: runtime.compile on, a GPU (not the CPU), and
    sample.batch_size >= COMPILE_MIN_BATCH (elementwise work then fills half a step)."""
    return params.runtime.compile and device.type != runtime.CPU.type \
        and params.sample.batch_size >= COMPILE_MIN_BATCH


def prepare_model(model, params: Params, d: runtime.Dist):
    """The loaded `model` ready to sample on `d` (module docstring): its Linear weights cast to
    bf16 once where the samplers' autocast is bf16 (`runtime.cast_for_autocast`); its DiT blocks
    and TADM's fusion compiled where `compiles_sampling` says (the training pieces,
    `tadm.train.trainer.compile_blocks`: fixed shapes, one graph per batch size); and, with
    runtime.cuda_graphs on a CUDA device, its fixed-shape pieces replayed from CUDA graphs
    (`graphed_pieces`; off CUDA one note on stderr per process). Returns (model, the CUDA-graph
    handle or None)."""
    runtime.cast_for_autocast(model, d.device, d.precision)
    if compiles_sampling(params, d.device):
        compile_blocks(model)
    setting = params.runtime.cuda_graphs
    note = cuda_graphs.cuda_graphs_note(setting, d.device)
    if note is not None:
        if note not in _NOTED:
            _NOTED.add(note)
            print(note, file=sys.stderr)
        return model, None
    if not setting:
        return model, None
    return model, cuda_graphs.cuda_graph_forwards(graphed_pieces(model), d.device)


def batch_sizes(num_samples: int, batch_size: int) -> list[int]:
    """Sizes of the sampling batches of `num_samples` sequences (the last may be smaller)."""
    return [min(batch_size, num_samples - lo) for lo in range(0, num_samples, batch_size)]


def _sum_counters(counters: list[ComputeCounter]) -> ComputeCounter:
    total = ComputeCounter()
    for c in counters:
        for f in dataclasses.fields(ComputeCounter):
            if f.name != "active":
                setattr(total, f.name, getattr(total, f.name) + getattr(c, f.name))
    return total


def _rate_se(tokens: list[int], seconds: list[float], B: int = 200) -> float | None:
    """Bootstrap spread (over batches) of total tokens / total seconds; None with < 2 batches."""
    if len(tokens) < 2 or min(seconds) <= 0:
        return None

    idx = resamples(len(tokens), B)
    return spread(np.asarray(tokens, np.float64)[idx].sum(1) / np.asarray(seconds, np.float64)[idx].sum(1))


def draw_samples(run: SampleRun, params: Params, steps: int, *, bos_id: int, num_samples: int | None = None,
                 dist: runtime.Dist | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Sample one budget T of `run` (module docstring): the tokens (N, L) int64 and the record,
    on every process of `dist` (None: `runtime.setup(params.runtime)`); nothing is written."""
    d = dist or runtime.setup(params.runtime)
    model, _ = prepare_model(load_pretrained(run.model_dir, map_location=d.device), params, d)
    cfg, seq_len = params.sample, model.seq_len
    n = num_samples or cfg.num_samples
    if cfg.canvas_length != seq_len:
        raise DataError(f"sample.canvas_length={cfg.canvas_length} but {run.model_dir} was trained with L={seq_len}")
    sizes = batch_sizes(n, cfg.batch_size)
    seeds = [batch_seed(params.seed, i) for i in range(len(sizes))]
    policy, autocast = None, network_autocast(d)
    with contextlib.ExitStack() as stack:
        unit = method_for(model.model_type)
        if unit.adapter is None:  # AR: its own loop
            settings: Any = ARSettings(bos_id, cfg.nucleus_p, params.seed, batch_size=cfg.batch_size, autocast=autocast)

            def one_batch(i: int):
                return sample_ar(model, sizes[i], seq_len, bos_id=bos_id, nucleus_p=cfg.nucleus_p, seed=seeds[i],
                                 batch_size=sizes[i], autocast=autocast)
        else:
            refresh = run.policy(params, steps) if unit.refreshes else None
            policy = repr(refresh) if refresh is not None else None
            settings = sampler_settings(run, params, steps, autocast)
            adapter = stack.enter_context(make_adapter(model, refresh, bypass_fusion=run.bypass_fusion))

            def one_batch(i: int):
                return sample(adapter, dataclasses.replace(settings, seed=seeds[i]), num_samples=sizes[i],
                              seq_len=seq_len)

        mine = []
        for i in runtime.shard(len(sizes), d):
            r = one_batch(i)
            mine.append({"tokens": r.tokens.numpy().astype(np.int64), "counters": r.counters.copy(),
                         "refresh_steps": r.refresh_steps, "seconds": r.seconds})
    batches = runtime.gather(mine, len(sizes), d)
    tokens = np.concatenate([b["tokens"] for b in batches])
    c = _sum_counters([b["counters"] for b in batches])
    seconds = sum(b["seconds"] for b in batches)
    refreshes = ([len(r) for b in batches for r in b["refresh_steps"]]
                 if all(b["refresh_steps"] is not None for b in batches) else None)
    record = {
        "row": run.name, "model_dir": str(run.model_dir), "model_sha256": sha256_tree(run.model_dir),
        "model_type": model.model_type, "T": steps,
        "sampler": settings.sampler, "policy": policy, "settings": settings.as_dict(), "batch_seeds": seeds,
        "num_samples": n, "seq_len": seq_len, "seconds": seconds,
        "tokens_per_s": tokens.size / seconds if seconds > 0 else None,
        # per batch, and the bootstrap spread of tokens/s over batches (the machine's noise)
        "batch_seconds": [b["seconds"] for b in batches],
        "tokens_per_s_se": _rate_se([len(b["tokens"]) * seq_len for b in batches], [b["seconds"] for b in batches]),
        "counters": c.as_dict(), "refreshes_per_trajectory": refreshes,
        "device": str(d.device), "precision": d.precision, "processes": d.world,
    }
    if run.bypass_fusion:
        record["bypass_fusion"] = True
    return tokens, record


def sampler_settings(run: SampleRun, params: Params, steps: int, autocast: str) -> SamplerSettings:
    """The diffusion sampler's settings of `run` at budget T = `steps` (batch 0's seed)."""
    return SamplerSettings.from_config(params.sample, steps=steps, seed=params.seed, ddpm_cache=run.ddpm_cache,
                                       autocast=autocast, **({"sampler": run.sampler} if run.sampler else {}))


def reusable_samples(run: SampleRun, params: Params, steps: int, saved_dir: str | Path,
                     dist: runtime.Dist | None = None) -> tuple[np.ndarray, dict[str, Any]] | None:
    """The tokens and record saved under `saved_dir` for budget T = `steps` when they are the
    draw `draw_samples(run, params, steps)` would make -- the same model files, sampler, refresh
    policy, sampler settings, sample count and batch seeds, on the same device, precision and
    number of processes (so its timing is this machine's too) -- else None. Diffusion models
    only (AR's draw does not depend on T). The record returned says where it was drawn."""
    d = dist or runtime.setup(params.runtime)
    npy, meta = Path(saved_dir) / f"T{steps}.npy", Path(saved_dir) / f"T{steps}.json"
    if not npy.exists() or not meta.exists():
        return None
    record = json.loads(meta.read_text())
    if record.get("model_type") in (None, "ar"):
        return None
    cfg = params.sample
    # the cheap fields first: most saved draws differ in T or the policy, and are never loaded
    want = {"row": run.name, "model_dir": str(run.model_dir), "T": steps,
            "policy": repr(run.policy(params, steps)) if method_for(record["model_type"]).refreshes else None,
            "settings": sampler_settings(run, params, steps, network_autocast(d)).as_dict(),
            "num_samples": cfg.num_samples,
            "batch_seeds": [batch_seed(params.seed, i) for i in range(len(batch_sizes(cfg.num_samples, cfg.batch_size)))],
            "device": str(d.device), "precision": d.precision, "processes": d.world}
    if any(record.get(k) != v for k, v in json.loads(json.dumps(want)).items()):
        return None
    if bool(record.get("bypass_fusion", False)) != run.bypass_fusion:
        return None
    if record.get("model_sha256") != sha256_tree(run.model_dir):
        return None
    tokens = np.load(npy, allow_pickle=False)
    if len(tokens) != cfg.num_samples:
        return None
    return tokens, {**record, "reused_from": str(npy)}


def save_samples(tokens: np.ndarray, record: dict[str, Any], out_dir: str | Path, steps: int) -> None:
    """<out_dir>/T<steps>.npy and .json, each written atomically."""
    out_dir = Path(out_dir)
    with atomic_path(out_dir / f"T{steps}.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, np.asarray(tokens, dtype=np.int64), allow_pickle=False)
    atomic_write_json(out_dir / f"T{steps}.json", record)


def run_samples(run: SampleRun, params: Params, steps: int, out_dir: str | Path, *, bos_id: int,
                num_samples: int | None = None, dist: runtime.Dist | None = None) -> dict[str, Any]:
    """Sample one budget T of `run`, save tokens and record under `out_dir` (the main process
    of `dist` writes), return the record."""
    d = dist or runtime.setup(params.runtime)
    tokens, record = draw_samples(run, params, steps, bos_id=bos_id, num_samples=num_samples, dist=d)
    if d.main:
        save_samples(tokens, record, out_dir, steps)
    return record


def shared_record(record: dict[str, Any], steps: int) -> dict[str, Any]:
    """The record of a run that does not depend on T (AR) saved under budget `steps` too: T =
    `steps`, and the budget it was drawn at."""
    return {**record, "T": steps, "drawn_at_T": record.get("drawn_at_T", record["T"])}


def load_samples(out_dir: str | Path, steps: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The tokens (N, L) and record of one saved budget."""
    out_dir = Path(out_dir)
    path = out_dir / f"T{steps}.npy"
    if not path.exists():
        raise DataError(f"no samples at {path}: run the sampling stage first")
    return np.load(path, allow_pickle=False), json.loads((out_dir / f"T{steps}.json").read_text())


__all__ = ["SampleRun", "batch_seed", "batch_sizes", "network_autocast", "prepare_model", "compiles_sampling", "graphed_pieces", "draw_samples", "run_samples", "save_samples",
           "shared_record", "load_samples", "sampler_settings", "reusable_samples"]
