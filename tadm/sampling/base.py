"""The sampling loop every sampler shares, and the pieces it is made of.

    result = sample(adapter, SamplerSettings(sampler="remdm-loop", steps=T, nucleus_p=0.9),
                    num_samples=N, seq_len=L)

One reverse trajectory per batch (MDLM / ReMDM conventions, REFERENCE.md §2):

1. z_1 = all masks (B, L). The canvas is split into blocks of `block_size` generated left to
   right (semi-autoregressive; block_size = L or None: a single block). The T steps are divided
   evenly over the blocks, T_b = T / n_blocks; inside block b the time grid is
       t_i = i / T_b,  s = t_i - 1 / T_b,   i = T_b, ..., 1,
   with alpha from the log-linear schedule, eps = 1e-3 as in training. Positions outside the
   current block are frozen (earlier blocks keep their tokens, later ones stay masked).
2. Each step: x_theta = SUBS(adapter(z_t, step, t)) (mask logit -inf, decoded positions kept
   as a point mass; REFERENCE §2), computed in `precision`; nucleus (top-p) filtering of
   x_theta; the sampler's transition p(z_s | z_t, x_theta) (B, L, V+1); a categorical draw
   in `precision` (float64 by default, as ReMDM: fp32 Gumbel noise shifts Gen PPL).
3. ddpm_cache (MDLM's exact skip): when no token of the batch changed in the last step, the
   previous x_theta is reused instead of calling the model. Exact because no model is
   time-conditioned; the adapter must also agree (`can_reuse`: TADM refuses when its anchor
   refresh is due, see `tadm.sampling.adapters`). Samples are identical with and without it;
   only the counters (`reused_calls`) and the time differ.
4. End of each block: any position of the block still masked is set to the argmax of the
   last x_theta (MDLM's final "noise removal" is an argmax of the prediction; here it reuses
   the last step's prediction instead of an extra model call, so compute stays exactly T
   calls). With this grid the last step has s = 0, alpha_s = 1, so p(z_s = m) = 0 and nothing
   is normally left; `SampleResult.argmax_fills` counts the positions filled this way.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from tadm.losses import subs_log_probs
from tadm.sampling.adapters import Adapter
from tadm.sampling.counters import ComputeCounter
from tadm.schedule import LogLinearSchedule, NoiseSchedule

SAMPLER_NAMES = ("mdlm", "remdm-cap", "remdm-rescale", "remdm-conf", "remdm-loop", "mdlm-fb", "mdlm-dfm",
                 "sedd-analytic")
PRECISIONS = {"float64": torch.float64, "float32": torch.float32}


# --------------------------------------------------------------------------- settings / results


@dataclass(frozen=True)
class SamplerSettings:
    """Everything that defines a sampling run (REFERENCE §2 defaults for the ReMDM knobs)."""

    sampler: str = "mdlm"
    steps: int = 1000  # T, over the whole canvas (divided evenly over semi-AR blocks)
    nucleus_p: float = 1.0  # top-p of x_theta; 1.0 = no filtering (paper: 0.9)
    seed: int = 0
    precision: torch.dtype = torch.float64  # x_theta, transitions and categorical draws
    block_size: int | None = None  # semi-AR block; None or = seq_len: one block
    eta: float = 0.02  # ReMDM: cap / rescale / loop strength
    t_on: float = 0.55  # ReMDM loop window (t_off, t_on]
    t_off: float = 0.05
    alpha_on: float = 0.9  # alpha held during the loop window
    ddpm_cache: bool = True  # MDLM's exact reuse of x_theta when nothing changed
    eps: float = 1e-3  # log-linear schedule epsilon (as in training)
    batch_size: int | None = None  # sequences per trajectory; None: all at once

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLER_NAMES:
            raise ValueError(f"unknown sampler {self.sampler!r}; known: {', '.join(SAMPLER_NAMES)}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be a positive integer, got {self.steps!r}")
        if not 0.0 < self.nucleus_p <= 1.0:
            raise ValueError(f"nucleus_p must be in (0, 1], got {self.nucleus_p!r}")
        if self.precision not in PRECISIONS.values():
            raise ValueError(f"precision must be torch.float64 or torch.float32, got {self.precision!r}")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be positive or None, got {self.block_size!r}")
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"eta must be in [0, 1], got {self.eta!r}")
        if not 0.0 <= self.t_off < self.t_on <= 1.0:
            raise ValueError(f"need 0 <= t_off < t_on <= 1, got t_off={self.t_off}, t_on={self.t_on}")
        if not 0.0 < self.alpha_on < 1.0:
            raise ValueError(f"alpha_on must be in (0, 1), got {self.alpha_on!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be positive or None, got {self.batch_size!r}")

    @classmethod
    def from_config(cls, cfg: Any, steps: int, seed: int = 0, **overrides: Any) -> "SamplerSettings":
        """From a `tadm.config.SampleConfig` for one budget T = `steps`."""
        block = None if cfg.block_size >= cfg.canvas_length else cfg.block_size
        kwargs = dict(sampler=cfg.sampler, steps=steps, nucleus_p=cfg.nucleus_p, seed=seed,
                      precision=PRECISIONS[cfg.precision], block_size=block, eta=cfg.eta, t_on=cfg.t_on,
                      t_off=cfg.t_off, alpha_on=cfg.alpha_on, batch_size=cfg.batch_size)
        kwargs.update(overrides)
        return cls(**kwargs)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["precision"] = str(self.precision).removeprefix("torch.")
        return out


@dataclass
class SampleResult:
    tokens: Tensor  # (N, L) long, on the CPU, no mask id
    counters: ComputeCounter
    refresh_steps: list[list[int]] | None  # per trajectory (batch); None for models without a cache
    seconds: float  # wall time of the sampling loop
    settings: SamplerSettings  # includes seed and precision
    argmax_fills: int = 0  # masked positions left at a block's end and set to argmax x_theta

    @property
    def tokens_per_second(self) -> float:
        return self.tokens.numel() / self.seconds if self.seconds > 0 else math.inf


@dataclass
class Transition:
    """A sampler's reverse transition for one step."""

    probs: Tensor  # p(z_s | z_t) (B, L, V+1), rows sum to 1
    alpha_t: float
    alpha_s: float
    sigma: Tensor | float = 0.0  # ReMDM remasking probability (0 for MDLM)
    phase: str = "mdlm"


@dataclass
class StepInfo:
    """What a callback sees after each step (for tests and diagnostics)."""

    step: int  # 0-based over the trajectory
    block: int
    t: float
    s: float
    z_t: Tensor
    z_s: Tensor
    x_theta: Tensor
    transition: Transition
    active: Tensor  # (L,) bool, the current block
    reused: bool  # x_theta came from ddpm_cache


# --------------------------------------------------------------------------- pieces


def time_grid(steps: int) -> list[tuple[float, float]]:
    """[(t, s)] = [(i/T, (i-1)/T) for i = T..1]."""
    return [(i / steps, (i - 1) / steps) for i in range(steps, 0, -1)]


def block_ranges(seq_len: int, block_size: int | None) -> list[tuple[int, int]]:
    """[lo, hi) of each semi-AR block, left to right."""
    size = seq_len if block_size is None else block_size
    if seq_len % size:
        raise ValueError(f"seq_len ({seq_len}) must be a multiple of block_size ({size})")
    return [(lo, lo + size) for lo in range(0, seq_len, size)]


def alpha_at(schedule: NoiseSchedule, t: float) -> float:
    """alpha_t as a Python float, evaluated in float64."""
    return float(schedule.alpha(torch.tensor(t, dtype=torch.float64)))


def nucleus_filter(probs: Tensor, p: float) -> Tensor:
    """Top-p filtering (ReMDM's rule): sort descending, keep the tokens whose inclusive
    cumulative mass is <= p, always keep the most likely one, renormalise. p = 1: unchanged."""
    if p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep = sorted_probs.cumsum(-1) <= p
    keep[..., 0] = True
    kept = sorted_probs * keep
    kept = kept / kept.sum(-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(-1, order, kept)


def predict_x0(logits: Tensor, z_t: Tensor, mask_id: int, nucleus_p: float, precision: torch.dtype) -> Tensor:
    """x_theta(z_t) (B, L, V+1) in `precision`: SUBS (no mass on m, decoded positions a point
    mass on their token), then top-p."""
    return nucleus_filter(subs_log_probs(logits, z_t, mask_id, precision).exp(), nucleus_p)


def sample_categorical(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One draw per row of `probs` (..., C) by the exponential race, in probs' dtype:
    argmax_c p_c / E_c with E_c ~ Exp(1) picks c with probability p_c (ReMDM's Gumbel trick)."""
    u = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=probs.dtype)
    e = (-torch.log1p(-u)).clamp_min(torch.finfo(probs.dtype).tiny)
    return (probs / e).argmax(dim=-1)


def point_mass(z: Tensor, n_classes: int, dtype: torch.dtype) -> Tensor:
    """One-hot rows (B, L, C) on the tokens of z, built directly in `dtype`."""
    out = torch.zeros(*z.shape, n_classes, dtype=dtype, device=z.device)
    return out.scatter_(-1, z.unsqueeze(-1), 1.0)


def freeze_outside(probs: Tensor, z_t: Tensor, active: Tensor) -> Tensor:
    """Identity transition (z_s = z_t) outside the current block `active` (L,) bool."""
    if bool(active.all()):
        return probs
    return torch.where(active[None, :, None], probs, point_mass(z_t, probs.shape[-1], probs.dtype))


def fill_remaining(z: Tensor, x_theta: Tensor, active: Tensor, mask_id: int) -> tuple[Tensor, int]:
    """End of a block: positions of the block still masked take argmax x_theta (the last
    prediction); returns the canvas and how many positions were filled."""
    left = (z == mask_id) & active
    return torch.where(left, x_theta[..., :mask_id].argmax(-1), z), int(left.sum())


# --------------------------------------------------------------------------- samplers


SAMPLERS: dict[str, type["Sampler"]] = {}


class Sampler(abc.ABC):
    """A reverse transition rule. Subclasses list the `names` they implement."""

    names: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.names:
            SAMPLERS[name] = cls

    def __init__(self, settings: SamplerSettings, mask_id: int):
        self.settings, self.mask_id = settings, mask_id
        self.schedule: NoiseSchedule = LogLinearSchedule(settings.eps)

    def start(self, z: Tensor) -> None:
        """Begin a trajectory on the all-mask canvas z (reset per-trajectory state)."""

    @abc.abstractmethod
    def transition(self, x_theta: Tensor, z_t: Tensor, t: float, s: float, active: Tensor) -> Transition:
        """p(z_s | z_t) for every position; identity outside `active`."""

    def observe(self, z_t: Tensor, z_s: Tensor, x_theta: Tensor) -> None:
        """Called with the sampled z_s (for samplers with state, e.g. ReMDM-conf)."""


def build_sampler(settings: SamplerSettings, mask_id: int) -> Sampler:
    import tadm.sampling.mdlm  # noqa: F401  (registers the samplers)
    import tadm.sampling.remdm  # noqa: F401
    import tadm.sampling.correctors  # noqa: F401
    import tadm.sampling.sedd  # noqa: F401

    return SAMPLERS[settings.sampler](settings, mask_id)


# --------------------------------------------------------------------------- the loop


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _trajectory(adapter: Adapter, sampler: Sampler, cfg: SamplerSettings, batch: int, seq_len: int,
                generator: torch.Generator, callback: Callable[[StepInfo], None] | None) -> tuple[Tensor, int]:
    """One batched reverse process; returns (tokens (B, L), positions filled by argmax)."""
    mask_id, device = adapter.mask_id, adapter.device
    blocks = block_ranges(seq_len, cfg.block_size)
    if cfg.steps % len(blocks):
        raise ValueError(f"steps ({cfg.steps}) must divide evenly over {len(blocks)} blocks of {cfg.block_size}")
    grid = time_grid(cfg.steps // len(blocks))
    z = torch.full((batch, seq_len), mask_id, dtype=torch.long, device=device)
    adapter.start(cfg.steps)
    adapter.counter.start_trajectory(batch, seq_len)
    sampler.start(z)
    step, fills, last = 0, 0, None  # last = (canvas, x_theta) of the previous step
    positions = torch.arange(seq_len, device=device)
    for b, (lo, hi) in enumerate(blocks):
        active = (positions >= lo) & (positions < hi)
        for t, s in grid:
            reused = cfg.ddpm_cache and last is not None and torch.equal(last[0], z) and adapter.can_reuse(z, step)
            if reused:
                x_theta = last[1]
                adapter.counter.reused_calls += 1
            else:
                x_theta = predict_x0(adapter(z, step, t), z, mask_id, cfg.nucleus_p, cfg.precision)
            tr = sampler.transition(x_theta, z, t, s, active)
            z_s = sample_categorical(tr.probs, generator)
            sampler.observe(z, z_s, x_theta)
            if callback is not None:
                callback(StepInfo(step, b, t, s, z, z_s, x_theta, tr, active, reused))
            last, z, step = (z, x_theta), z_s, step + 1
        z, n = fill_remaining(z, x_theta, active, mask_id)
        fills += n
    return z, fills


def sample(adapter: Adapter, cfg: SamplerSettings, *, num_samples: int, seq_len: int,
           generator: torch.Generator | None = None,
           callback: Callable[[StepInfo], None] | None = None) -> SampleResult:
    """Draw `num_samples` sequences of length `seq_len` with `adapter` (any callable with the
    adapter interface). Randomness comes from `generator` (default: one seeded with cfg.seed
    on the model's device). The adapter's counter is reset first and copied into the result."""
    device = adapter.device
    if generator is None:
        generator = torch.Generator(device).manual_seed(cfg.seed)
    sampler = build_sampler(cfg, adapter.mask_id)
    adapter.counter.reset()
    batch = cfg.batch_size or num_samples
    chunks, refreshes, fills = [], [], 0
    _sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        for done in range(0, num_samples, batch):
            tokens, n = _trajectory(adapter, sampler, cfg, min(batch, num_samples - done), seq_len, generator, callback)
            chunks.append(tokens)
            refreshes.append(adapter.refresh_steps)
            fills += n
    _sync(device)
    seconds = time.perf_counter() - start
    refresh_steps = None if any(r is None for r in refreshes) else refreshes
    return SampleResult(torch.cat(chunks).cpu(), adapter.counter.copy(), refresh_steps, seconds, cfg, fills)


__all__ = [
    "SAMPLER_NAMES", "SamplerSettings", "SampleResult", "Transition", "StepInfo", "Sampler", "SAMPLERS",
    "build_sampler", "sample", "time_grid", "block_ranges", "alpha_at", "nucleus_filter", "predict_x0",
    "sample_categorical", "point_mass", "freeze_outside", "fill_remaining",
]
