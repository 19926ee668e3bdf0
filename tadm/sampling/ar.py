"""The autoregressive baseline's sampling loop (left to right, nucleus sampling).

    result = sample_ar(model, num_samples=N, seq_len=L, bos_id=BOS, nucleus_p=0.9)

Position 0 is `bos_id` (the data wraps every piece as BOS ... EOS, as MDLM's data pipeline does); for
i = 1, ..., L-1

    p_i = top-p( softmax(AR(x_{<i})[:, -1]) )   in `precision` (float64 by default),
    x_i ~ p_i                                   (the loop's exponential-race draw, same generator)

KV cache (`kv_cache=True`, the default): position i's logits need x_{<i} only, so each step
runs one new position, x_{i-1}, through the network against the keys / values the earlier
steps cached (`tadm.models.ar.AR.forward_cached`): L - 1 one-position forwards per sequence,
O(L) position-forwards per layer. `kv_cache=False` re-runs the full causal network on the
prefix x_{<i} at every step, O(L^2) (the reference the cached path is tested against: same
tokens for the same generator, logits equal to float rounding). The network runs under
`tadm.runtime.autocast(device, autocast)`; the logits are cast to `precision` before the
softmax, the nucleus filter and the draw. No host read inside the loop.

Compute is counted by the same hooks as the diffusion samplers: every causal block booked as a
"denoiser" layer, so `counters.layer_calls_per_trajectory = n_layers * (L - 1)` (one forward
per generated position; BOS is given) in both modes; FLOPs follow the attended length, and
`counters.layer_tokens` the positions run (cached: n_layers * B * (L - 1); uncached:
n_layers * B * L (L - 1) / 2). `nucleus_p` is in (0, 1]; a tiny p keeps only the most likely
token (greedy decoding).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tadm import runtime
from tadm.sampling.base import AUTOCAST, nucleus_filter, sample_categorical
from tadm.sampling.loop import SampleResult
from tadm.sampling.counters import ComputeCounter, count_block, instrument


@dataclass(frozen=True)
class ARSettings:
    """What defines an AR sampling run (stands in for `SamplerSettings` in the result)."""

    bos_id: int
    nucleus_p: float = 1.0
    seed: int = 0
    precision: torch.dtype = torch.float64
    batch_size: int | None = None
    sampler: str = "ar"
    kv_cache: bool = True  # incremental decoding; False: re-run the prefix every step (reference)
    autocast: str = "fp32"  # network forward: "bf16" autocast on CUDA; the draws stay in `precision`

    def __post_init__(self) -> None:
        if not 0.0 < self.nucleus_p <= 1.0:
            raise ValueError(f"nucleus_p must be in (0, 1], got {self.nucleus_p!r}")
        if self.precision not in (torch.float64, torch.float32):
            raise ValueError(f"precision must be torch.float64 or torch.float32, got {self.precision!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be positive or None, got {self.batch_size!r}")
        if self.autocast not in AUTOCAST:
            raise ValueError(f"autocast must be one of {', '.join(AUTOCAST)}, got {self.autocast!r}")

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["precision"] = str(self.precision).removeprefix("torch.")
        return out


def next_token_probs(model: torch.nn.Module, prefix: Tensor, nucleus_p: float, precision: torch.dtype) -> Tensor:
    """top-p(softmax(logits of the last prefix position)) (B, V) in `precision`."""
    return _probs(model(prefix)[:, -1], nucleus_p, precision)


def _probs(logits: Tensor, nucleus_p: float, precision: torch.dtype) -> Tensor:
    return nucleus_filter(torch.softmax(logits.to(precision), dim=-1), nucleus_p)


def _rollout(model: torch.nn.Module, cfg: ARSettings, batch: int, seq_len: int, generator: torch.Generator,
             counter: ComputeCounter, callback: Callable[[int, Tensor], None] | None) -> Tensor:
    device = next(model.parameters()).device
    x = torch.full((batch, seq_len), cfg.bos_id, dtype=torch.long, device=device)
    counter.start_trajectory(batch, seq_len)
    cache = model.new_cache(seq_len) if cfg.kv_cache else None
    for i in range(1, seq_len):
        counter.model_calls += 1
        with counter.counting(), runtime.autocast(device, cfg.autocast):
            if cache is None:
                logits = model(x[:, :i])[:, -1]
            else:  # the new position i - 1 against the cached 0..i-2 (its blocks run outside their hooks)
                logits = model.forward_cached(x[:, i - 1:i], cache)[:, -1]
                for block in model.blocks:
                    count_block(counter, block, batch, 1, i)
        x[:, i] = sample_categorical(_probs(logits, cfg.nucleus_p, cfg.precision), generator)
        if callback is not None:
            callback(i, x)
    return x


def sample_ar(model: torch.nn.Module, num_samples: int, seq_len: int, *, bos_id: int,
              generator: torch.Generator | None = None, nucleus_p: float = 1.0, seed: int = 0,
              precision: torch.dtype = torch.float64, batch_size: int | None = None,
              callback: Callable[[int, Tensor], None] | None = None, kv_cache: bool = True,
              autocast: str = "fp32") -> SampleResult:
    """`num_samples` sequences (N, L) from an AR model (module docstring), on the model's
    device. Randomness from `generator` (default: one seeded with `seed` on the model's device).
    `callback(i, x)` runs after position i of the current batch x (B, L) is drawn (positions > i
    still hold BOS). `kv_cache=False`: the uncached reference loop."""
    if getattr(model, "model_type", "ar") != "ar":
        raise ValueError(f"sample_ar needs an 'ar' model, got {model.model_type!r}")
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    cfg = ARSettings(bos_id, nucleus_p, seed, precision, batch_size, kv_cache=kv_cache, autocast=autocast)
    device = next(model.parameters()).device
    if generator is None:
        generator = torch.Generator(device).manual_seed(seed)
    model.eval()
    counter = ComputeCounter()
    hooks = instrument(model, counter)
    batch = batch_size or num_samples
    chunks = []
    try:
        runtime.synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            for done in range(0, num_samples, batch):
                chunks.append(_rollout(model, cfg, min(batch, num_samples - done), seq_len, generator, counter,
                                       callback))
        runtime.synchronize(device)
        seconds = time.perf_counter() - start
    finally:
        for h in hooks:
            h.remove()
    return SampleResult(runtime.host(torch.cat(chunks)), counter.copy(), None, seconds, cfg)  # type: ignore[arg-type]


__all__ = ["ARSettings", "sample_ar", "next_token_probs"]
