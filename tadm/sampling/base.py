"""The sampling loop every sampler shares, and the pieces it is made of.

    result = sample(adapter, SamplerSettings(sampler="remdm-loop", steps=T, nucleus_p=0.9),
                    num_samples=N, seq_len=L)

One reverse trajectory per batch (the conventions of MDLM's and ReMDM's released samplers):

1. z_1 = all masks (B, L). The canvas is split into blocks of `block_size` generated left to
   right (semi-autoregressive; block_size = L or None: a single block). The T steps are divided
   evenly over the blocks, T_b = T / n_blocks; inside block b the time grid is
       t_i = i / T_b,  s = t_i - 1 / T_b,   i = T_b, ..., 1,
   with alpha from the log-linear schedule, eps = 1e-3 as in training. Positions outside the
   current block are frozen (earlier blocks keep their tokens, later ones stay masked).
2. Every sampler of the project has a *factored* reverse transition (`Transition`): per
   position, independently given x_theta,
       z_t^l = m:   decode with probability unmask^l, the token drawn from x_theta^l;
                    otherwise stay masked
       z_t^l != m:  re-mask with probability remask^l; otherwise keep the token
   (MDLM: unmask = (alpha_s - alpha_t) / (1 - alpha_t), remask = 0; ReMDM, FB and DFM differ
   only in the two rates; the dense rows p(z_s | z_t) are `Transition.probs`). Neither rate
   depends on x_theta, so each step first draws u ~ U[0, 1) per position (in `precision`) and
   settles which positions decode (u < unmask) and which re-mask (u < remask); only then is
   x_theta needed, and only at the decoding positions.
3. x_theta at those rows = SUBS(logits) (the mask logit -inf, MDLM's SUBS parameterisation) in `precision`,
   nucleus (top-p) filtered, and one categorical draw per row in `precision` (float64 by
   default, as ReMDM: fp32 noise shifts Gen PPL), by the inverse CDF on the sorted cumulative
   mass the nucleus rule computes anyway (`draw_nucleus`; on a CPU the same draw, bit for bit,
   from each row's most likely tokens where they decide it, instead of a sort of the whole
   vocabulary: `tadm.sampling.nucleus`). The network body runs on the whole
   canvas; its output head runs on the decoding rows only (`lazy_head`; `lazy_head=False`
   projects every position and selects the rows afterwards, the full computation the lazy one
   is tested against). Over a trajectory each position is decoded about once (MDLM: exactly
   once), so the head, the nucleus sort and the draws cost O(L V) per trajectory, not O(T L V).
4. ddpm_cache (MDLM's exact skip): when nothing decodes at a step, the network is not run at
   all; when something decodes but the canvas is the one of the last network call, that call's
   hidden states are reused and only the head runs. Exact because no model is time-conditioned
   and nothing else reads x_theta; the adapter must also agree (`can_reuse`: TADM refuses when
   its anchor refresh is due, see `tadm.sampling.adapters`). Samples are identical with and
   without it; only the counters (`reused_calls`) and the time differ. Off (the paper's
   fixed-step budget, and Table 2's compute column): the network runs at every step.
5. With this grid the last step of a block has s = 0, alpha_s = 1, so every sampler's unmask
   rate is exactly 1 there and the block ends fully decoded (checked; a sampler that leaves a
   masked position is an error, not silently filled).
6. Device and host syncs: everything runs on the adapter's device (the model's); the network
   body and head run under `tadm.runtime.autocast(device, cfg.autocast)` (bf16 on CUDA, nothing
   on the CPU), the logits are cast to `precision` before SUBS / softmax / nucleus / the draw.
   The uniforms u that settle which positions decode or re-mask come from a generator of their
   own (`mask_generator`, seeded by one draw from the run's generator, which then draws only the
   tokens). Where the rates are host numbers (`Sampler.masks_only`: MDLM, SEDD's analytic step,
   ReMDM but for its conf strategy, the FB / DFM correctors) and ddpm_cache is off (Table 2's
   fixed budgets), which positions decode at each step does not depend on the tokens drawn, so
   the masks of up to PLAN_STEPS steps of a block are drawn ahead (`_draw_masks`) and their
   counts read together: one host read per PLAN_STEPS steps, the same trajectory as one step at
   a time. Otherwise a step reads the device once (`_Network.plan`): one small tensor holding
   the number N of decoding positions and the flags the step branches on (ddpm_cache: canvas
   unchanged since the last call; a data-dependent anchor refresh, `RefreshPolicy.due_flag`,
   which a drawn-ahead step reads on its own; the range check of per-position rates,
   `factored(deferred=...)`). Everything else has fixed shapes or shapes known from N: the
   decoding rows are gathered by index (`decoded_rows`) and the drawn tokens scattered back,
   never boolean-mask indexed. Per trajectory three more reads: the schedule's alpha on the
   time grid (once), the mask generator's seed and the end-of-block check (once, after the
   last block). (On
   a CPU tensor the nucleus draw also reads its own values to pick its rows' way: free there,
   with no device to wait for; on any other device it reads nothing, `tadm.sampling.nucleus`.)
7. Per-call tables: the rotary tables are built once per length and device and kept
   (`DiTStack.rope`), and within `sample` each model's conditioning vectors are computed once
   (`tadm.models.dit.constant_conditioning`); both equal the freshly built ones bit for bit.
8. Pause and resume (one trajectory: num_samples within one batch). ``sample(..., stop=i)`` runs
   reverse steps 0..i-1 and returns the canvas there (it may hold masks) with `SampleResult.paused`,
   a `Paused`: the canvas, the states of the generator and of the mask generator, the sampler's per-trajectory state
   (`Sampler.state`: ReMDM-conf's confidences) and the adapter's (`Adapter.state`: TADM's anchor
   cache). ``sample(..., start=paused)`` goes on from step i exactly as the uninterrupted run
   would (the same tokens, the same anchor refreshes); `start` and `stop` together run steps
   start.step..stop-1 only (steps count over the whole trajectory, all blocks; DFM's grid is longer
   than T). A `Paused` is never written: it can be resumed many times, each time the same work
   (the throughput stage times whole refresh cycles from one mid-trajectory state this way,
   `tadm.experiments.throughput`). A piece's `seconds` and counters cover its own steps; it books
   the trajectory's tokens (`ComputeCounter.tokens`, `trajectories`) only if it starts at step 0.
   With ddpm_cache a resumed piece runs the network at its first step (the skip's last hidden
   states are not kept): the same tokens, a reused call fewer.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from tadm.runtime import CPU
from tadm import runtime
from tadm.losses import subs_log_probs
from tadm.models.dit import constant_conditioning
from tadm.sampling.adapters import Adapter
from tadm.sampling.counters import ComputeCounter
from tadm.sampling.nucleus import draw_nucleus
from tadm.registry import SAMPLERS, method_for
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
class Paused:
    """A trajectory stopped before reverse step `step` (`sample(..., stop=step)`; module docstring, 8):
    what the loop needs to go on from there as if it had not stopped (`sample(..., start=paused)`)."""

    step: int  # the next reverse step, 0-based over the whole trajectory
    total: int  # the trajectory's number of reverse steps (T; DFM's grid: more)
    z: Tensor  # (B, L) the canvas before step `step`, on the adapter's device
    generator: Tensor  # the generator's state (torch.Generator.get_state)
    masks: Tensor  # the state of the trajectory's generator of the step's uniforms (`mask_generator`)
    sampler: dict[str, Any]  # Sampler.state()
    adapter: Any  # Adapter.state() (TADM: its anchor cache; None for stateless models)
    settings: SamplerSettings  # the run's (a resumed run must have the same steps, sampler, blocks)


@dataclass
class SampleResult:
    tokens: Tensor  # (N, L) long, on the CPU, no mask id (a paused run: the canvas, masks included)
    counters: ComputeCounter
    refresh_steps: list[list[int]] | None  # per trajectory (batch); None for models without a cache
    seconds: float  # wall time of the sampling loop
    settings: SamplerSettings  # includes seed and precision
    paused: Paused | None = None  # `sample(..., stop=i)` with i before the end: the state at step i

    @property
    def tokens_per_second(self) -> float:
        return self.tokens.numel() / self.seconds if self.seconds > 0 else math.inf


@dataclass
class Transition:
    """A sampler's reverse transition for one step, in factored form (module docstring, 2):
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


# --------------------------------------------------------------------------- the loop


class _Network:
    """The network side of a trajectory: decides what a step needs (one host read), runs the
    body when needed, keeps the last hidden states (ddpm_cache) and projects the decoding rows."""

    def __init__(self, adapter: Adapter, cfg: SamplerSettings):
        self.adapter, self.cfg = adapter, cfg
        self.canvas: Tensor | None = None  # canvas of the last network call
        self.hidden: Tensor | None = None
        self.device = adapter.device

    def autocast(self):
        return runtime.autocast(self.device, self.cfg.autocast)

    def plan(self, z: Tensor, step: int, decoded: list[Tensor], checks: Deferred) -> tuple[list[int], bool | Tensor]:
        """(N = number of decoding positions of each step of `decoded`, the first step's refresh
        flag) from one host read: the N, the adapter's refresh flag at `step` when it depends on
        data, whether the canvas changed since the last network call (ddpm_cache; then `decoded`
        is one step), and the deferred rate checks."""
        cfg, adapter = self.cfg, self.adapter
        due = adapter.due_flag(z, step)
        self.compare = cfg.ddpm_cache and self.canvas is not None
        pending = [d.sum() for d in decoded]
        if isinstance(due, Tensor):
            pending.append(due)
        if self.compare:
            pending.append((self.canvas != z).any())
        pending += [bad for bad, _ in checks]
        values = torch.stack([p.reshape(()).to(torch.long) for p in pending]).tolist()  # the host read
        counts, rest = values[:len(decoded)], values[len(decoded):]
        if isinstance(due, Tensor):
            due, rest = bool(rest[0]), rest[1:]
        self.changed = True
        if self.compare:
            self.changed, rest = bool(rest[0]), rest[1:]
        for (_, message), bad in zip(checks, rest):
            if bad:
                raise ValueError(message())
        return counts, due

    def decide(self, z: Tensor, step: int, n: int, due: bool | Tensor | None) -> bool:
        """Settle the adapter's refresh at `step` (`due`: from the plan's read; None: ask the
        adapter, and read a data-dependent flag on its own) and whether the step reuses the last
        network call (ddpm_cache)."""
        cfg, adapter = self.cfg, self.adapter
        if due is None:
            due = adapter.due_flag(z, step)
            if isinstance(due, Tensor):
                due = bool(due)  # a refresh that depends on the canvas: its own host read
        adapter.decide(z, step, due)
        return cfg.ddpm_cache and adapter.can_reuse(z, step) and (n == 0 or not self.changed)

    def step(self, z: Tensor, step: int, t: float, decoded: Tensor, n: int, reused: bool
             ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(SUBS x_theta at the decoded rows (N, V+1) before top-p, the full SUBS x_theta
        (B, L, V+1) before top-p when lazy_head is off (else None), the rows' flat indices (N,)
        or None when N = 0)."""
        cfg, adapter = self.cfg, self.adapter
        if reused:
            adapter.counter.reused_calls += 1
        else:
            with self.autocast():
                self.canvas, self.hidden = z, adapter.features(z, step, t)
        rows = decoded_rows(decoded, n) if n else None
        full = None
        if not cfg.lazy_head and self.hidden is not None and (n or not reused):
            with self.autocast():
                logits = adapter.project(self.hidden)
            full = predict_x0(logits, self.canvas, adapter.mask_id, 1.0, cfg.precision)
            x = full.flatten(0, 1).index_select(0, rows) if n else full.new_empty(0, full.shape[-1])
        elif n:
            with self.autocast():
                logits = adapter.project(self.hidden, rows)
            x = x_theta_rows(logits, adapter.mask_id, cfg.precision)
        else:
            x = torch.empty(0, adapter.mask_id + 1, dtype=cfg.precision, device=z.device)
        return x, full, rows


PLAN_STEPS = 64  # steps whose masks are drawn ahead together (bounds the plan's memory: 2 (B, L) bools a step)


def mask_generator(generator: torch.Generator) -> torch.Generator:
    """The generator of a trajectory's per-step uniforms u (which positions decode or re-mask),
    seeded by one draw from `generator` (which then draws only the tokens): the masks of many
    steps can be drawn ahead and give the same trajectory as one step at a time."""
    seed = torch.randint(0, 2**62, (), generator=generator, device=generator.device)
    return torch.Generator(generator.device).manual_seed(int(seed))  # one host read per trajectory


def _draw_masks(sampler: Sampler, z: Tensor, steps: range, grid: list[tuple[float, float]], per_block: int,
                active: Tensor, masks: torch.Generator, precision: torch.dtype, keep_transitions: bool
                ) -> list[tuple[Transition | None, Tensor, Tensor]]:
    """[(the transition, or None unless `keep_transitions`; decoded (B, L); re-masked (B, L))]
    for `steps` of one block from canvas z, the uniforms drawn from `masks`, one step after the
    other. After the first step only the mask pattern of the canvas is carried forward (a
    decoded position holds a placeholder token): valid for more than one step only when the
    sampler's rates read nothing else (`Sampler.masks_only`)."""
    mask_id = sampler.mask_id
    out = []
    for step in steps:
        t, s = grid[step % per_block]
        tr = sampler.transition(z, t, s, active)
        u = torch.rand(z.shape, generator=masks, device=z.device, dtype=precision)
        masked = z == mask_id
        decoded, remasked = masked & (u < tr.unmask), ~masked & (u < tr.remask)
        out.append((tr if keep_transitions else None, decoded, remasked))
        if step + 1 < steps.stop:
            z = torch.where(decoded, 0, z).masked_fill(remasked, mask_id)
    return out


def _trajectory(adapter: Adapter, sampler: Sampler, cfg: SamplerSettings, batch: int, seq_len: int,
                generator: torch.Generator, callback: Callable[[StepInfo], None] | None,
                start: Paused | None = None, stop: int | None = None) -> tuple[Tensor, Paused | None]:
    """One batched reverse process; returns the tokens (B, L) and None, or with `stop` before the
    end the canvas at step `stop` and its `Paused` state (module docstring, 8). `start`: go on
    from a paused state instead of the all-mask canvas at step 0."""
    mask_id, device = adapter.mask_id, adapter.device
    blocks = block_ranges(seq_len, cfg.block_size)
    if cfg.steps % len(blocks):
        raise ValueError(f"steps ({cfg.steps}) must divide evenly over {len(blocks)} blocks of {cfg.block_size}")
    grid = sampler.grid(cfg.steps // len(blocks))
    per_block, total = len(grid), len(grid) * len(blocks)
    first = 0 if start is None else start.step
    last = total if stop is None else stop
    if not 0 <= first <= last <= total:
        raise ValueError(f"a trajectory of {total} steps cannot run steps {first}..{last - 1}")
    sampler.prepare([t for t, _ in grid] + [s for _, s in grid])
    z = torch.full((batch, seq_len), mask_id, dtype=torch.long, device=device)
    adapter.start(cfg.steps)
    sampler.start(z)
    if start is None:
        adapter.counter.start_trajectory(batch, seq_len)
        masks = mask_generator(generator)
    else:
        if start.z.shape != z.shape:
            raise ValueError(f"the paused canvas is {tuple(start.z.shape)}, this run's {tuple(z.shape)}")
        z = start.z
        sampler.restore(start.sampler)
        adapter.restore(start.adapter)
        masks = torch.Generator(device)
        masks.set_state(start.masks)
    network = _Network(adapter, cfg)
    positions = torch.arange(seq_len, device=device)
    left = []  # masked positions left in each block ended here: read once, at the end
    # the masks of up to PLAN_STEPS steps are drawn ahead where the rates allow it (module doc, 6)
    horizon = PLAN_STEPS if sampler.masks_only and not cfg.ddpm_cache else 1
    sampler.defer_checks(True)  # per-position rate checks: read with the plan's one host read
    try:
        step = first
        while step < last:
            b = step // per_block
            lo, hi = blocks[b]
            active = (positions >= lo) & (positions < hi)
            end = min(last, (b + 1) * per_block, step + horizon)
            plan = _draw_masks(sampler, z, range(step, end), grid, per_block, active, masks, cfg.precision,
                               keep_transitions=callback is not None)
            counts, due = network.plan(z, step, [d for _, d, _ in plan], sampler.pending_checks())
            for j, ((tr, decoded, remasked), n) in enumerate(zip(plan, counts)):
                i = step % per_block
                t, s = grid[i]
                reused = network.decide(z, step, n, due if j == 0 else None)
                x_theta, full, rows = network.step(z, step, t, decoded, n, reused)
                z_s = z.masked_fill(remasked, mask_id)
                token_prob = x_theta.new_empty(0)
                if n:
                    tokens, token_prob = draw_nucleus(x_theta, cfg.nucleus_p, generator)
                    z_s.view(-1).scatter_(0, rows, tokens)
                sampler.observe(z, z_s, decoded, token_prob, rows)
                if callback is not None:
                    p = cfg.nucleus_p
                    callback(StepInfo(step, b, t, s, z, z_s, decoded, nucleus_filter(x_theta, p), tr, active, reused,
                                      None if full is None else nucleus_filter(full, p)))
                z = z_s
                if i == per_block - 1:
                    left.append((b, ((z == mask_id) & active).sum()))
                step += 1
    finally:
        sampler.defer_checks(False)
    if left:
        for (b, _), count in zip(left, torch.stack([c for _, c in left]).tolist()):
            if count:
                raise RuntimeError(f"sampler {cfg.sampler!r} left {count} masked positions at the end of block {b}")
    if last == total:
        return z, None
    return z, Paused(last, total, z.clone(), generator.get_state(), masks.get_state(), sampler.state(),
                     adapter.state(), cfg)


def sample(adapter: Adapter, cfg: SamplerSettings, *, num_samples: int, seq_len: int,
           generator: torch.Generator | None = None,
           callback: Callable[[StepInfo], None] | None = None,
           start: Paused | None = None, stop: int | None = None) -> SampleResult:
    """Draw `num_samples` sequences of length `seq_len` with `adapter` (any callable with the
    adapter interface). Randomness comes from `generator` (default: one seeded with cfg.seed
    on the model's device). The adapter's counter is reset first and copied into the result.
    `stop` / `start`: pause one trajectory before reverse step `stop`, resume one from a `Paused`
    (module docstring, 8; num_samples must fit one batch)."""
    device = adapter.device
    if generator is None:
        generator = torch.Generator(device).manual_seed(cfg.seed)
    sampler = build_sampler(cfg, adapter.mask_id, method_schedule(adapter, cfg.eps))
    adapter.counter.reset()
    batch = cfg.batch_size or num_samples
    if (start is not None or stop is not None) and num_samples > batch:
        raise ValueError(f"pausing or resuming runs one trajectory: num_samples ({num_samples}) must fit one batch "
                         f"({batch})")
    if start is not None:
        theirs, ours = start.settings, cfg
        if (theirs.steps, theirs.sampler, theirs.block_size) != (ours.steps, ours.sampler, ours.block_size):
            raise ValueError(f"a trajectory paused with steps={theirs.steps}, sampler={theirs.sampler!r}, "
                             f"block_size={theirs.block_size} cannot resume with steps={ours.steps}, "
                             f"sampler={ours.sampler!r}, block_size={ours.block_size}")
        generator.set_state(start.generator)
    chunks, refreshes, paused = [], [], None
    model = getattr(adapter, "model", None)
    runtime.synchronize(device)
    t0 = time.perf_counter()
    with torch.inference_mode(), (constant_conditioning(model) if isinstance(model, torch.nn.Module)
                                  else contextlib.nullcontext()):
        for done in range(0, num_samples, batch):
            z, paused = _trajectory(adapter, sampler, cfg, min(batch, num_samples - done), seq_len, generator,
                                    callback, start, stop)
            chunks.append(z)
            refreshes.append(adapter.refresh_steps)
    runtime.synchronize(device)
    seconds = time.perf_counter() - t0
    refresh_steps = None if any(r is None for r in refreshes) else refreshes
    return SampleResult(runtime.host(torch.cat(chunks)), adapter.counter.copy(), refresh_steps, seconds, cfg, paused)


__all__ = [
    "SamplerSettings", "SampleResult", "Paused", "Transition", "StepInfo", "Sampler", "SAMPLERS",
    "build_sampler", "sample", "time_grid", "block_ranges", "alpha_at", "nucleus_filter", "predict_x0",
    "sample_categorical", "point_mass", "factored", "x_theta_rows", "draw_nucleus", "alpha_grid", "decoded_rows",
    "AUTOCAST",
]
