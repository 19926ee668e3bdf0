"""The autoregressive baseline's sampling loop (left to right, nucleus sampling).

    result = sample_ar(model, num_samples=N, seq_len=L, bos_id=BOS, nucleus_p=0.9)

Position 0 is `bos_id` (the data wraps every piece as BOS ... EOS, REFERENCE §2); for
i = 1, ..., L-1

    p_i = top-p( softmax(AR(x_{<i})[:, -1]) )   in `precision` (float64 by default),
    x_i ~ p_i                                   (the loop's exponential-race draw, same generator)

Choices: no KV cache, so every step runs the full causal network on the prefix x_{<i}
(position i's token depends only on x_{<i} and the generator's draws so far). Compute is
counted by the same hooks as the diffusion samplers: every causal block booked as a
"denoiser" layer, so `counters.layer_calls_per_trajectory = n_layers * (L - 1)` (one full
forward per generated position; BOS is given) and FLOPs follow the growing prefix length.
`nucleus_p` is in (0, 1]; a tiny p keeps only the most likely token (greedy decoding).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tadm.sampling.base import SampleResult, nucleus_filter, sample_categorical
from tadm.sampling.counters import ComputeCounter, instrument


@dataclass(frozen=True)
class ARSettings:
    """What defines an AR sampling run (stands in for `SamplerSettings` in the result)."""

    bos_id: int
    nucleus_p: float = 1.0
    seed: int = 0
    precision: torch.dtype = torch.float64
    batch_size: int | None = None
    sampler: str = "ar"

    def __post_init__(self) -> None:
        if not 0.0 < self.nucleus_p <= 1.0:
            raise ValueError(f"nucleus_p must be in (0, 1], got {self.nucleus_p!r}")
        if self.precision not in (torch.float64, torch.float32):
            raise ValueError(f"precision must be torch.float64 or torch.float32, got {self.precision!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be positive or None, got {self.batch_size!r}")

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["precision"] = str(self.precision).removeprefix("torch.")
        return out


def next_token_probs(model: torch.nn.Module, prefix: Tensor, nucleus_p: float, precision: torch.dtype) -> Tensor:
    """top-p(softmax(logits of the last prefix position)) (B, V) in `precision`."""
    logits = model(prefix)[:, -1].to(precision)
    return nucleus_filter(torch.softmax(logits, dim=-1), nucleus_p)


def _rollout(model: torch.nn.Module, cfg: ARSettings, batch: int, seq_len: int, generator: torch.Generator,
             counter: ComputeCounter, callback: Callable[[int, Tensor], None] | None) -> Tensor:
    device = next(model.parameters()).device
    x = torch.full((batch, seq_len), cfg.bos_id, dtype=torch.long, device=device)
    counter.start_trajectory(batch, seq_len)
    for i in range(1, seq_len):
        counter.model_calls += 1
        with counter.counting():
            probs = next_token_probs(model, x[:, :i], cfg.nucleus_p, cfg.precision)
        x[:, i] = sample_categorical(probs, generator)
        if callback is not None:
            callback(i, x)
    return x


def sample_ar(model: torch.nn.Module, num_samples: int, seq_len: int, *, bos_id: int,
              generator: torch.Generator | None = None, nucleus_p: float = 1.0, seed: int = 0,
              precision: torch.dtype = torch.float64, batch_size: int | None = None,
              callback: Callable[[int, Tensor], None] | None = None) -> SampleResult:
    """`num_samples` sequences (N, L) from an AR model (module docstring). Randomness from
    `generator` (default: one seeded with `seed` on the model's device). `callback(i, x)` runs
    after position i of the current batch x (B, L) is drawn (positions > i still hold BOS)."""
    if getattr(model, "model_type", "ar") != "ar":
        raise ValueError(f"sample_ar needs an 'ar' model, got {model.model_type!r}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    cfg = ARSettings(bos_id, nucleus_p, seed, precision, batch_size)
    device = next(model.parameters()).device
    if generator is None:
        generator = torch.Generator(device).manual_seed(seed)
    model.eval()
    counter = ComputeCounter()
    hooks = instrument(model, counter)
    batch = batch_size or num_samples
    chunks = []
    try:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            for done in range(0, num_samples, batch):
                chunks.append(_rollout(model, cfg, min(batch, num_samples - done), seq_len, generator, counter,
                                       callback))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start
    finally:
        for h in hooks:
            h.remove()
    return SampleResult(torch.cat(chunks).cpu(), counter.copy(), None, seconds, cfg)  # type: ignore[arg-type]


__all__ = ["ARSettings", "sample_ar", "next_token_probs"]
