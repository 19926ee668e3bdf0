"""What every sampler of the project is: the `Sampler` contract (a factored reverse transition,
`Transition`, per position given x_theta), its settings (`SamplerSettings`), the time grid and
block layout of a trajectory, and the per-row pieces of a reverse step (SUBS, nucleus, the draw).
The loop that runs a sampler over a trajectory is `tadm.sampling.loop` (its docstring: the
conventions, step by step).

    class MySampler(Sampler):
        names = ("my-sampler",)           # registered in tadm.registry.SAMPLERS
        def transition(self, z_t, t, s, active): ...
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from tadm.losses import subs_log_probs
from tadm.registry import SAMPLERS, method_for
from tadm.runtime import CPU
from tadm.schedule import LogLinearSchedule, NoiseSchedule

PRECISIONS = {"float64": torch.float64, "float32": torch.float32}
AUTOCAST = ("fp32", "bf16")  # the network's autocast (`tadm.runtime.autocast`: GPU, or a CPU with native bf16)


# --------------------------------------------------------------------------- settings / results


@dataclass(frozen=True)
class SamplerSettings:
    """Everything that defines a sampling run (the ReMDM knobs default to ReMDM's OpenWebText settings)."""

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
    ddpm_cache: bool = True  # MDLM's exact skip of network calls whose output is not needed
    lazy_head: bool = True  # output head only on the rows decoded this step (False: every position)
    eps: float = 1e-3  # log-linear schedule epsilon (as in training)
    batch_size: int | None = None  # sequences per trajectory; None: all at once
    autocast: str = "fp32"  # network forward: "bf16" autocast on CUDA (runtime.precision); draws stay in `precision`

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler {self.sampler!r}; known: {', '.join(SAMPLERS.names())}")
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
        if self.autocast not in AUTOCAST:
            raise ValueError(f"autocast must be one of {', '.join(AUTOCAST)}, got {self.autocast!r}")

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
class Transition:
    """A sampler's reverse transition for one step, in factored form (`tadm.sampling.loop`, 2):
    a masked position decodes with probability `unmask` (token from x_theta), a decoded one is
    re-masked with probability `remask`. Both (B, L) in the run's precision, 0 outside the
    current block and `unmask` 0 at decoded / `remask` 0 at masked positions."""

    unmask: Tensor
    remask: Tensor
    alpha_t: float
    alpha_s: float
    sigma: Tensor | float = 0.0  # ReMDM remasking probability (0 for MDLM)
    phase: str = "mdlm"

    def probs(self, x_theta: Tensor, z_t: Tensor, mask_id: int) -> Tensor:
        """The dense rows p(z_s | z_t) (B, L, V+1) for a full x_theta (B, L, V+1); for tests and
        diagnostics (the loop never builds them)."""
        unmask, remask = self.unmask.unsqueeze(-1), self.remask.unsqueeze(-1)
        from_mask = x_theta.to(unmask.dtype) * unmask
        from_mask[..., mask_id] += 1.0 - unmask[..., 0]
        from_token = point_mass(z_t, x_theta.shape[-1], unmask.dtype) * (1.0 - remask)
        from_token[..., mask_id] += remask[..., 0]
        return torch.where((z_t == mask_id).unsqueeze(-1), from_mask, from_token)


RATE_TOLERANCE = 1e-12
Deferred = list[tuple[Tensor, Callable[[], str]]]  # (0-dim bool "out of range", its error message)


def _range_message(lo: float, hi: float) -> str:
    return f"transition rates must lie in [0, 1], got min {lo}, max {hi}"


def factored(z_t: Tensor, active: Tensor, mask_id: int, unmask: Tensor | float, remask: Tensor | float,
             dtype: torch.dtype, deferred: Deferred | None = None) -> tuple[Tensor, Tensor]:
    """(unmask, remask) as (B, L) tensors in `dtype`: each rate (a float or (B, L)) where it
    applies (masked / decoded positions of the current block `active` (L,)), 0 elsewhere.
    Rates must lie in [0, 1] up to rounding (1e-12), and are clamped to it. A float rate is
    checked on the host at once; a tensor rate needs its values: with `deferred` (a list) the
    check is appended to it as (flag, message) for the caller to read with its own host read
    (the sampling loop folds it into the step's one read), otherwise it is read here."""
    masked = z_t == mask_id
    rates = []
    for rate, where in ((unmask, masked), (remask, ~masked)):
        where = where & active
        if isinstance(rate, Tensor):
            rate = rate.to(dtype)  # a sampler's per-position rate lives on the canvas's device
            bad = (rate < -RATE_TOLERANCE).any() | (rate > 1 + RATE_TOLERANCE).any()

            def message(rate: Tensor = rate) -> str:
                return _range_message(float(rate.min()), float(rate.max()))

            if deferred is not None:
                deferred.append((bad, message))
            elif bool(bad):
                raise ValueError(message())
            zero = torch.zeros((), dtype=dtype, device=z_t.device)
            rates.append(torch.where(where, rate.clamp(0.0, 1.0), zero))
        else:
            rate = float(rate)
            if rate < -RATE_TOLERANCE or rate > 1 + RATE_TOLERANCE:
                raise ValueError(_range_message(rate, rate))
            # clamping in float64 and then rounding to `dtype` equals rounding, then clamping
            # (both monotone, 0 and 1 exact): the same values as a clamped `dtype` scalar
            filled = torch.zeros(z_t.shape, dtype=dtype, device=z_t.device)
            rates.append(filled.masked_fill_(where, min(max(rate, 0.0), 1.0)))
    return rates[0], rates[1]


@dataclass
class StepInfo:
    """What a callback sees after each step (for tests and diagnostics)."""

    step: int  # 0-based over the trajectory
    block: int
    t: float
    s: float
    z_t: Tensor
    z_s: Tensor
    decoded: Tensor  # (B, L) bool: the positions decoded at this step
    x_theta: Tensor  # (N, V+1): x_theta at the decoded rows (row-major), nucleus-filtered
    transition: Transition
    active: Tensor  # (L,) bool, the current block
    reused: bool  # the network did not run (ddpm_cache: skipped, or its last hidden states reused)
    full_x_theta: Tensor | None = None  # (B, L, V+1) when lazy_head=False


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
    return float(schedule.alpha(torch.tensor(t, dtype=torch.float64, device=CPU)))


def alpha_grid(schedule: NoiseSchedule, times: list[float]) -> list[float]:
    """[alpha_at(schedule, t) for t in times] from one float64 evaluation (one host read)."""
    if not times:
        return []
    return schedule.alpha(torch.tensor(times, dtype=torch.float64, device=CPU)).tolist()


def decoded_rows(decoded: Tensor, n: int) -> Tensor:
    """The flat (row-major) indices (n,) of the True positions of `decoded` (B, L), in order,
    given their number n: the order of ``decoded.nonzero()`` / ``x[decoded]``, built from
    fixed-shape ops (no host read). The positions' ranks, decoded ones first, form a
    permutation, so the scatter writes every slot once (deterministic)."""
    flat = decoded.reshape(-1)
    total = flat.sum()
    rank = torch.where(flat, flat.cumsum(0) - 1, total + (~flat).cumsum(0) - 1)
    order = torch.empty_like(rank).scatter_(0, rank, torch.arange(flat.numel(), device=flat.device))
    return order[:n]


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


def x_theta_rows(logits: Tensor, mask_id: int, precision: torch.dtype) -> Tensor:
    """SUBS x_theta at masked rows (N, V+1) from their logits, in `precision`, before top-p:
    the mask logit -inf, softmax over the rest."""
    logits = logits.to(precision)
    logits[..., mask_id] = float("-inf")
    return torch.softmax(logits, dim=-1)


# --------------------------------------------------------------------------- samplers


class Sampler(abc.ABC):
    """A reverse transition rule. Subclasses list the `names` they implement; each name is
    registered in `tadm.registry.SAMPLERS` (what ``sample.sampler`` may name) as the subclass is
    defined. A new sampler is one subclass in a module the package's ``__init__`` imports:

        class GreedySampler(MDLMSampler):
            names = ("mdlm-greedy",)

            def transition(self, z_t, t, s, active):  # the hook it changes
                ...
    """

    names: ClassVar[tuple[str, ...]] = ()
    # True: `transition` reads only which positions of z_t are masked (its rates are host
    # numbers), so the loop may draw the masks of many steps ahead with one host read (module
    # docstring, 6); False: one step at a time
    masks_only: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.names:
            SAMPLERS.register(name, cls)

    def __init__(self, settings: SamplerSettings, mask_id: int):
        self.settings, self.mask_id = settings, mask_id
        self.schedule: NoiseSchedule = LogLinearSchedule(settings.eps)
        self._alphas: dict[float, float] = {}
        self._deferred: Deferred | None = None  # a list while the loop reads the checks (`defer_checks`)

    def start(self, z: Tensor) -> None:
        """Begin a trajectory on the all-mask canvas z (reset per-trajectory state)."""

    def state(self) -> dict[str, Any]:
        """The per-trajectory state a paused trajectory keeps (`Paused.sampler`); {} when none."""
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        """Take back `state()` after `start` (a resumed trajectory); it must not be written."""

    def prepare(self, times: list[float]) -> None:
        """Evaluate the schedule's alpha at `times` (the run's time grid) in one go, so that
        `alpha` needs no host read per step."""
        missing = sorted({t for t in times if t not in self._alphas})
        self._alphas.update(zip(missing, alpha_grid(self.schedule, missing)))

    def alpha(self, t: float) -> float:
        """alpha_t of the log-linear schedule as a Python float (= `alpha_at`)."""
        if t not in self._alphas:
            self._alphas[t] = alpha_at(self.schedule, t)
        return self._alphas[t]

    def defer_checks(self, on: bool) -> None:
        """While on, `rates` hands the range checks of per-position rates to `pending_checks`
        instead of reading them at once (the loop reads them with the step's one host read)."""
        self._deferred = [] if on else None

    def pending_checks(self) -> Deferred:
        """The deferred range checks made since the last call (`factored`)."""
        out = self._deferred or []
        if self._deferred is not None:
            self._deferred = []
        return out

    def grid(self, steps: int) -> list[tuple[float, float]]:
        """The [(t, s)] steps of one block given its share of the budget (`time_grid`: T even
        steps; DFM has its own, longer grid, `tadm.sampling.correctors.dfm_grid`). The last
        step must have s = 0."""
        return time_grid(steps)

    @abc.abstractmethod
    def transition(self, z_t: Tensor, t: float, s: float, active: Tensor) -> Transition:
        """The step's rates (`Transition`, via `factored`); identity outside `active`."""

    def observe(self, z_t: Tensor, z_s: Tensor, decoded: Tensor, token_prob: Tensor,
                rows: Tensor | None = None) -> None:
        """Called with the sampled z_s, the decoded positions (B, L) and the probability (N,)
        each decoded token had under top-p(x_theta) (for samplers with state, e.g. ReMDM-conf);
        `rows` (N,): the decoded positions' flat indices into (B, L) (`decoded_rows`)."""

    def rates(self, z_t: Tensor, active: Tensor, unmask: Tensor | float, remask: Tensor | float) -> tuple[Tensor, Tensor]:
        """`factored` in this run's precision; inside the loop the checks of tensor rates are
        read with the step's one host read (`defer_checks`, `pending_checks`)."""
        return factored(z_t, active, self.mask_id, unmask, remask, self.settings.precision, self._deferred)


def build_sampler(settings: SamplerSettings, mask_id: int, schedule: NoiseSchedule | None = None) -> Sampler:
    """The registered sampler named by `settings.sampler` (`tadm.registry.SAMPLERS`, filled as
    each sampler module is imported by the package's ``__init__``; this module imports none),
    reading `schedule` (the model's method's, `Method.noise_schedule`; None: log-linear at
    settings.eps)."""
    try:
        cls = SAMPLERS[settings.sampler]
    except KeyError:
        raise ValueError(f"sample.sampler: no sampler {settings.sampler!r} is registered (known: "
                         f"{', '.join(sorted(SAMPLERS.names()))})") from None
    sampler = cls(settings, mask_id)
    if schedule is not None:
        sampler.schedule = schedule
    return sampler


def method_schedule(adapter, eps: float) -> NoiseSchedule | None:
    """The noise schedule of the method whose network `adapter` runs (`tadm.registry.method_for`);
    None for an adapter without a model of a registered method (the sampler's log-linear)."""
    model_type = getattr(getattr(adapter, "model", None), "model_type", None)
    if model_type is None:
        return None
    try:
        return method_for(model_type).noise_schedule(eps)
    except ValueError:  # a network no method trains (a test's own model type)
        return None



__all__ = [
    "SamplerSettings", "Transition", "StepInfo", "Sampler", "SAMPLERS", "build_sampler", "method_schedule", "time_grid",
    "block_ranges", "alpha_at", "alpha_grid", "nucleus_filter", "predict_x0", "sample_categorical", "point_mass",
    "factored", "x_theta_rows", "decoded_rows", "PRECISIONS", "AUTOCAST",
]
