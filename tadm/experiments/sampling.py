"""Sampling runs of the paper's tables: one saved sample set per (row, budget T).

A `SampleRun` names a trained model directory and how to sample it (sampler, TADM's refresh
policy). `run_samples` draws `sample.num_samples` sequences of the canvas length for one budget
T with the profile's sampler settings, and writes

    <out>/T<T>.npy     the tokens (N, L) int64
    <out>/T<T>.json    the record: row, model, settings, counters, seconds, tokens/s, refreshes

Every network call of the budget is made (ddpm_cache off unless asked): Table 2 compares
methods at a fixed number of reverse steps, and its compute column counts them. AR has no T;
it draws L - 1 tokens left to right after BOS (the same run serves every budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tadm.config import Params
from tadm.errors import DataError
from tadm.io import atomic_path, atomic_write_json
from tadm.models import load_pretrained
from tadm.sampling import AdaptiveDrift, FixedInterval, RefreshPolicy, SamplerSettings, make_adapter, sample, sample_ar


@dataclass(frozen=True)
class SampleRun:
    """One row of a table: a model and how it is sampled."""

    name: str
    model_dir: str
    sampler: str | None = None  # None: the profile's sample.sampler
    K: int | None = None  # TADM: fixed refresh interval; None: sample.refresh_every of the budget
    adaptive: float | None = None  # TADM: AdaptiveDrift threshold (changed fraction) instead of K
    ddpm_cache: bool = False

    def refresh_for(self, params: Params, steps: int) -> RefreshPolicy:
        if self.adaptive is not None:
            return AdaptiveDrift(self.adaptive)
        if self.K is not None:
            return FixedInterval(self.K)
        budgets = list(params.sample.steps)
        if steps not in budgets:
            raise DataError(f"T={steps} is not a budget of sample.steps {budgets}: give K explicitly")
        return FixedInterval(params.sample.refresh_every[budgets.index(steps)])


def run_samples(run: SampleRun, params: Params, steps: int, out_dir: str | Path, *, bos_id: int,
                num_samples: int | None = None) -> dict[str, Any]:
    """Sample one budget T of `run`, save tokens and record under `out_dir`, return the record."""
    model = load_pretrained(run.model_dir)
    cfg, seq_len = params.sample, model.seq_len
    n = num_samples or cfg.num_samples
    if cfg.canvas_length != seq_len:
        raise DataError(f"sample.canvas_length={cfg.canvas_length} but {run.model_dir} was trained with L={seq_len}")
    policy = None
    if model.model_type == "ar":
        result = sample_ar(model, n, seq_len, bos_id=bos_id, nucleus_p=cfg.nucleus_p, seed=params.seed,
                           batch_size=cfg.batch_size)
    else:
        refresh = run.refresh_for(params, steps) if model.model_type == "tadm" else None
        policy = repr(refresh) if refresh is not None else None
        settings = SamplerSettings.from_config(cfg, steps=steps, seed=params.seed, ddpm_cache=run.ddpm_cache,
                                               **({"sampler": run.sampler} if run.sampler else {}))
        with make_adapter(model, refresh) as adapter:
            result = sample(adapter, settings, num_samples=n, seq_len=seq_len)
    c = result.counters
    refreshes = [len(r) for r in result.refresh_steps] if result.refresh_steps else None
    record = {
        "row": run.name, "model_dir": str(run.model_dir), "model_type": model.model_type, "T": steps,
        "sampler": result.settings.sampler, "policy": policy, "settings": result.settings.as_dict(),
        "num_samples": n, "seq_len": seq_len, "seconds": result.seconds, "tokens_per_s": result.tokens_per_second,
        "counters": c.as_dict(), "refreshes_per_trajectory": refreshes,
    }
    out_dir = Path(out_dir)
    with atomic_path(out_dir / f"T{steps}.npy") as tmp:
        with open(tmp, "wb") as f:
            np.save(f, result.tokens.numpy().astype(np.int64), allow_pickle=False)
    atomic_write_json(out_dir / f"T{steps}.json", record)
    return record


def load_samples(out_dir: str | Path, steps: int) -> tuple[np.ndarray, dict[str, Any]]:
    """The tokens (N, L) and record of one saved budget."""
    import json

    out_dir = Path(out_dir)
    path = out_dir / f"T{steps}.npy"
    if not path.exists():
        raise DataError(f"no samples at {path}: run the sampling stage first")
    return np.load(path, allow_pickle=False), json.loads((out_dir / f"T{steps}.json").read_text())


__all__ = ["SampleRun", "run_samples", "load_samples"]
