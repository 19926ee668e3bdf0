"""The decoding loop shared by ASRD and the remasking baselines it is compared with.

    result = decode(backend, canvas, region, DecodeSettings(method="asrd", steps=32, block_size=8, ...))

`canvas` (B, L) holds the fixed tokens (an in-canvas prompt or context; anything at the
`region` positions is ignored), `region` (L,) bool the positions to generate. The region is
cut into semi-autoregressive blocks of `block_size` positions, generated left to right; the
`steps` are divided evenly over the blocks (T_b per block). At every step the positions of the
current block are either *decided* (hold a token) or *undecided* (a mask, or uniform noise on
a uniform-state model; see `tadm.asrd.backends`). Methods:

- ``plain``: MDLM's ancestral schedule. At step j of a block (t = (T_b - j) / T_b,
  s = t - 1 / T_b, log-linear alpha) each undecided position decodes with probability
  (alpha_s - alpha_t) / (1 - alpha_t), its token the model's choice. The decoding set is drawn
  before the model runs; a step where nothing decodes makes no model call (MDLM's exact skip).
- ``remdm``: ReMDM-loop (`tadm.sampling.remdm`): the same, with the three-phase alpha and, in
  the loop window, each decided token of the block re-masked with probability
  sigma = min(eta, sigma_max).
- ``low-confidence``: LLaDA's low-confidence remasking. Every undecided position of the block
  is predicted; the n_j most confident predictions are kept and the rest re-masked, with
  n_j = ceil(undecided / steps left) (LLaDA's front-loaded schedule; it adapts if tokens
  are remasked). `threshold` (Fast-dLLM-style parallel decoding) also keeps every prediction
  whose confidence is at least the threshold; a block then ends as soon as it is decided.
  `certainty_sigma` (d²Cache's certainty prior) ranks the predictions by confidence x the
  certainty density of the decided region positions (`tadm.asrd.certainty`, over the whole
  region, read before the step) instead of confidence alone; the threshold still reads
  confidence.
- ``asrd``: low-confidence remasking plus the three ASRD mechanisms: the anchor tokens cache
  (`tadm.asrd.atc`), anchor-guided generation (`tadm.asrd.guidance`, weight `guidance`) and
  anchor-perturbed verification (`tadm.asrd.verify`, scale `perturbation`) *inside the
  generation pass*: the pending candidates of the block (decided, not an anchor, committed
  with confidence below `verify_below`) enter the step's one model pass with an orthogonal
  perturbation on their input embedding, next to the undecided positions that pass predicts;
  a candidate whose prediction there is no longer its token is remasked (it is decided again at
  a later step, from a clean reading). So ASRD makes one model pass per step, as its base does
  (tested by counting forwards). The reading is a prediction of the candidate's position, so
  the cache observes it: a survivor counts one more consistent pass and, once it has held for
  k passes, is an anchor and no longer checked. No check at a block's last step (everything
  left is committed there); with the threshold, a decided block ends early only once no
  candidate is left for the next pass to check. With guidance = 0 and perturbation = 0 ASRD
  makes exactly the base method's passes and draws, step for step (tested): the cache is kept
  but read by nothing.

Before a block's first step the backend hears `begin_block(lo, hi)` (canvas positions lo..hi-1),
which a cache refreshed per block uses (`tadm.caches.llada`); the others ignore it. A backend
whose `min_block_passes` is above the passes a block took gets the rest after the block, as
passes on the canvas with the block decided whose logits nothing reads (`_Run.idle_pass`): they
count as model calls, not as steps, and change no token. Fast-dLLM's per-block caches set 2: the
release's loop always follows a block's first (full) pass with a cached pass, even when the
first pass decided the whole block (the cached pass then decides nothing).

The token chosen at a position is the argmax (temperature 0) or a draw from softmax(logits /
temperature); its confidence is its probability under softmax(logits). Random draws of the
base method (decoding sets, remasks, tokens, uniform noise) come from `generator`; ASRD's
perturbation directions from a second generator seeded with seed + 1, so the base method's
stream is the same with ASRD's mechanisms on or off.
"""

from __future__ import annotations

import dataclasses
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from tadm.runtime import CPU
from tadm.asrd.atc import AnchorTokensCache
from tadm.asrd.backends import Backend, DecodeCounters
from tadm.asrd.certainty import certainty_density
from tadm.asrd.guidance import anchor_centroid, guidance_signal
from tadm.asrd.verify import orthogonal_perturbation, survivors
from tadm.errors import ConfigError
from tadm.sampling.remdm import LoopSchedule, remdm_unmask, sigma_max

# how a step chooses which tokens to unmask and which to remask (DecodeSettings.method)
DecodeRule = Literal["plain", "remdm", "low-confidence", "asrd"]
DECODE_RULES: tuple[str, ...] = typing.get_args(DecodeRule)


@dataclass(frozen=True)
class DecodeSettings:
    method: DecodeRule = "low-confidence"
    steps: int = 32  # over the whole region, divided evenly over its blocks
    block_size: int | None = None  # None: one block
    temperature: float = 0.0  # 0: argmax
    threshold: float | None = None  # low-confidence / asrd: also keep predictions this confident
    certainty_sigma: float | None = None  # low-confidence / asrd: rank by confidence x certainty density (d²Cache)
    # remdm (loop)
    eta: float = 0.02
    t_on: float = 0.55
    t_off: float = 0.05
    alpha_on: float = 0.9
    # asrd
    guidance: float = 0.0  # w
    perturbation: float = 0.0  # rho; 0 = no verification
    capacity: int = 16  # anchors per sequence
    window: int = 2  # k: passes a prediction must hold to become an anchor
    verify_below: float = 1.0  # only candidates committed with a lower confidence are verified
    eps: float = 1e-3  # log-linear schedule (plain)
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            ("method", self.method in DECODE_RULES, f"one of {', '.join(DECODE_RULES)}"),
            ("steps", isinstance(self.steps, int) and not isinstance(self.steps, bool) and self.steps >= 1, "an integer >= 1"),
            ("block_size", self.block_size is None or self.block_size >= 1, "None or >= 1"),
            ("temperature", self.temperature >= 0.0, ">= 0"),
            ("threshold", self.threshold is None or 0.0 < self.threshold <= 1.0, "None or in (0, 1]"),
            ("certainty_sigma", self.certainty_sigma is None or self.certainty_sigma > 0.0, "None or > 0"),
            ("eta", 0.0 <= self.eta <= 1.0, "in [0, 1]"),
            ("t_off", 0.0 <= self.t_off < self.t_on <= 1.0, "0 <= t_off < t_on <= 1"),
            ("alpha_on", 0.0 < self.alpha_on < 1.0, "in (0, 1)"),
            ("guidance", self.guidance >= 0.0, ">= 0"),
            ("perturbation", self.perturbation >= 0.0, ">= 0"),
            ("capacity", self.capacity >= 1, ">= 1"),
            ("window", self.window >= 1, ">= 1"),
            ("verify_below", 0.0 < self.verify_below <= 1.0, "in (0, 1]"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ConfigError(f"asrd.{name}", f"must be {allowed}, got {getattr(self, name)!r}")

    def replace(self, **changes) -> "DecodeSettings":
        return dataclasses.replace(self, **changes)


@dataclass
class DecodeResult:
    tokens: Tensor  # (B, L): the canvas with the region generated
    counters: DecodeCounters
    steps: int  # steps taken (blocks may end early)
    remasked: int  # tokens revoked by verification (asrd) or remasking (remdm)
    verified: int  # candidate checks made inside generation passes (asrd)
    seconds: float
    settings: DecodeSettings


@dataclass
class StepRecord:
    """What a callback sees after each step (tests, diagnostics)."""

    step: int
    block: int
    tokens: Tensor  # (B, L) after the step (undecided positions hold their last value)
    decided: Tensor  # (B, L) bool
    committed: Tensor  # (B, L) bool: decided at this step
    revoked: Tensor  # (B, L) bool: remasked at this step
    anchors: Tensor | None  # (B, L) bool: the ATC after the step (asrd)
    calls: int  # model passes so far


def blocks_of(region: Tensor, block_size: int | None) -> list[Tensor]:
    """The region's positions (L,) bool cut into consecutive blocks of `block_size`."""
    idx = region.nonzero().squeeze(-1)
    if idx.numel() == 0:
        raise ValueError("region: no position to generate")
    size = idx.numel() if block_size is None else block_size
    if idx.numel() % size:
        raise ConfigError("asrd.block_size", f"the generated span ({idx.numel()} positions) must be a multiple of it, got {size}")
    return [idx[i: i + size] for i in range(0, idx.numel(), size)]


def _entropy(probs: Tensor) -> Tensor:
    """Entropy (nats) of each distribution in probs (..., V)."""
    return -(probs * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))).sum(-1)


def _choose(logits: Tensor, temperature: float, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(token, its confidence, argmax, entropy), each (B, L), from logits (B, L, V)."""
    probs = torch.softmax(logits, dim=-1)
    conf_max, pred = probs.max(-1)
    entropy = _entropy(probs)
    if temperature == 0.0:
        return pred, conf_max, pred, entropy
    tempered = torch.softmax(logits / temperature, dim=-1)
    token = torch.multinomial(tempered.flatten(0, 1), 1, generator=generator).view(pred.shape)
    return token, probs.gather(-1, token.unsqueeze(-1)).squeeze(-1), pred, entropy


def _top_confident(conf: Tensor, candidates: Tensor, n: Tensor) -> Tensor:
    """Per row, the n (B,) most confident candidates (B, L) bool; ties go to the leftmost."""
    score = conf.masked_fill(~candidates, float("-inf"))
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(order.shape[1], device=order.device).expand_as(order))
    return candidates & (rank < n.unsqueeze(-1))


class _Run:
    """One batched trajectory (the state `decode` threads through its steps)."""

    def __init__(self, backend: Backend, canvas: Tensor, region: Tensor, cfg: DecodeSettings,
                 generator: torch.Generator):
        self.backend, self.cfg, self.gen = backend, cfg, generator
        device = canvas.device
        self.pgen = torch.Generator(device).manual_seed(cfg.seed + 1)
        self.region = region.to(device).unsqueeze(0).expand_as(canvas)
        self.z = canvas.clone()
        self.decided = ~self.region.clone()
        self.conf_at = torch.zeros(canvas.shape, dtype=torch.float32, device=device)
        self.atc = AnchorTokensCache(cfg.capacity, cfg.window) if cfg.method == "asrd" else None
        if self.atc is not None:
            self.atc.start(tuple(canvas.shape), device)
        self.loop = LoopSchedule(cfg.t_on, cfg.t_off, cfg.alpha_on)
        self.schedule = backend.noise_schedule(cfg.eps)  # the network's own (Method.noise_schedule)
        self.remasked = 0
        self.verified = 0  # candidate checks (asrd)

    # -- helpers --------------------------------------------------------------------------

    def alpha(self, t: float) -> float:
        if self.cfg.method == "remdm":
            return self.loop.alpha(t)
        return float(self.schedule.alpha(torch.tensor(t, dtype=torch.float64, device=CPU)))

    def guidance(self, undecided: Tensor) -> Tensor | None:
        atc, cfg = self.atc, self.cfg
        if atc is None or cfg.guidance == 0.0 or atc.empty:
            return None
        centroid = anchor_centroid(self.backend.embed(self.z), atc.member, atc.entropy)
        return guidance_signal(centroid, undecided & self.region, atc.entropy, cfg.guidance, self.backend.vocab_size)

    # -- one step -------------------------------------------------------------------------

    def factored_step(self, active: Tensor, j: int, steps: int) -> tuple[Tensor, Tensor]:
        """plain / remdm: decide who decodes and who is remasked first, then call the model
        only if something decodes. Returns (committed, revoked)."""
        t, s = (steps - j) / steps, (steps - j - 1) / steps
        a_t, a_s = self.alpha(t), self.alpha(s)
        sigma = min(self.cfg.eta, sigma_max(a_t, a_s)) if self.cfg.method == "remdm" and self.loop.phase(t) == "loop" else 0.0
        unmask = remdm_unmask(a_t, a_s, sigma)
        u = torch.rand(self.z.shape, generator=self.gen, device=self.z.device, dtype=torch.float64)
        undecided = ~self.decided
        commit = undecided & active & (u < unmask)
        revoke = self.decided & active & (u < sigma)
        if commit.any():
            ids = self.backend.fill(self.z, undecided, self.gen)
            token, conf, _, _ = _choose(self.backend.logits(ids), self.cfg.temperature, self.gen)
            self.z = torch.where(commit, token, self.z)
            self.conf_at = torch.where(commit, conf, self.conf_at)
        self.decided = (self.decided | commit) & ~revoke
        self.remasked += int(revoke.sum())
        return commit, revoke

    def pending(self, active: Tensor, steps_left: int) -> Tensor:
        """The candidates the coming pass verifies (B, L) bool: decided positions of the block
        that are not anchors and were committed with confidence below `verify_below`. None of
        them when verification is off (no cache, rho = 0) or at a block's last step, where
        whatever a check remasked could not be decided again."""
        cfg, atc = self.cfg, self.atc
        if atc is None or cfg.perturbation == 0.0 or steps_left == 1:
            return torch.zeros_like(self.decided)
        return active & self.decided & self.region & ~atc.member & (self.conf_at < cfg.verify_below)

    def confidence_step(self, active: Tensor, steps_left: int) -> tuple[Tensor, Tensor]:
        """low-confidence / asrd: one pass predicts every undecided position of the block and
        (asrd) reads the pending candidates under their orthogonal perturbation; the ones that
        flip are remasked, then the most confident predictions are kept. Returns (committed,
        revoked)."""
        cfg, backend = self.cfg, self.backend
        undecided = ~self.decided
        pending = self.pending(active, steps_left)
        ids = backend.fill(self.z, undecided, self.gen)
        delta = self.guidance(undecided)
        if pending.any():
            # the check rides on this step's generation pass: a uniform-state model reads the
            # candidate as its token + delta, an absorbing-state model as the mask + delta
            e = backend.embed(self.z)
            push = torch.zeros_like(e)
            push[pending] = orthogonal_perturbation(e[pending], cfg.perturbation, self.pgen)
            delta = push if delta is None else delta + push.to(delta.dtype)
            if not backend.reads_decided:
                ids = ids.masked_fill(pending, backend.mask_id)
        logits = backend.logits(ids, delta)
        token, conf, pred, entropy = _choose(logits, cfg.temperature, self.gen)
        if self.atc is not None:
            # decided positions are predictions only on a uniform-state model; a checked
            # candidate's reading is one (a survivor counts one more consistent pass)
            readable = undecided | pending | backend.reads_decided
            self.atc.observe(torch.where(readable, pred, self.z), entropy, self.region & readable)
        revoke = torch.zeros_like(pending)
        if pending.any():
            revoke[pending] = ~survivors(logits[pending], self.z[pending])
            self.decided &= ~revoke
            self.atc.forget(revoke)
            self.remasked += int(revoke.sum())
            self.verified += int(pending.sum())
        candidates = undecided & active  # predicted from a clean reading in this pass
        if steps_left == 1:
            commit = candidates
        else:  # LLaDA's schedule counts the remasked too: they are decided at later steps
            n = torch.ceil((~self.decided & active).sum(-1) / steps_left).long()
            commit = _top_confident(self.ranking(conf), candidates, n)
            if cfg.threshold is not None:
                commit |= candidates & (conf >= cfg.threshold)
        self.z = torch.where(commit, token, self.z)
        self.conf_at = torch.where(commit, conf, self.conf_at)
        self.decided = self.decided | commit
        if self.atc is not None:
            self.atc.select(self.z, self.decided, self.region)
        return commit, revoke

    def ranking(self, conf: Tensor) -> Tensor:
        """What the step ranks its candidates by (B, L): confidence, or with `certainty_sigma`
        confidence x the certainty density of the region's decided positions as they were
        before this step (d²Cache's certainty prior; every row generates as many positions)."""
        sigma = self.cfg.certainty_sigma
        if sigma is None:
            return conf
        b, region = conf.shape[0], self.region  # (B, L), the same positions in every row
        g = int(region[0].sum())
        density = certainty_density(self.decided[region].view(b, g), sigma)
        scores = torch.zeros_like(conf)
        scores[region] = (conf[region].view(b, g) * density.to(conf.dtype)).flatten()
        return scores

    def idle_pass(self) -> None:
        """One model pass on the current canvas whose logits nothing reads (module docstring).
        The input is the one the next step would get; an absorbing-state backend's `fill`
        draws nothing, so the random stream is unchanged."""
        self.backend.logits(self.backend.fill(self.z, ~self.decided, self.gen))

    def block_done(self, active: Tensor, steps_left: int) -> bool:
        """Whether the block may end before its last step: every position decided and (asrd)
        no candidate left for the next pass to check (`steps_left`: steps after this one)."""
        if not bool(self.decided[active].all()):
            return False
        return steps_left == 0 or not bool(self.pending(active, steps_left).any())


def decode(backend: Backend, canvas: Tensor, region: Tensor, cfg: DecodeSettings, *,
           generator: torch.Generator | None = None,
           callback: Callable[[StepRecord], None] | None = None) -> DecodeResult:
    """Generate `region` (L,) bool of `canvas` (B, L) with `backend` (module docstring). The
    backend's counters are reset first and copied into the result."""
    if canvas.dim() != 2 or region.shape != canvas.shape[1:]:
        raise ValueError(f"canvas must be (B, L) and region (L,), got {tuple(canvas.shape)} and {tuple(region.shape)}")
    device = backend.device
    canvas = canvas.to(device)
    blocks = blocks_of(region, cfg.block_size)
    if cfg.steps % len(blocks):
        raise ConfigError("asrd.steps", f"must divide evenly over the {len(blocks)} blocks, got {cfg.steps}")
    per_block = cfg.steps // len(blocks)
    generator = generator or torch.Generator(device).manual_seed(cfg.seed)
    backend.counters = DecodeCounters()
    backend.start()
    run = _Run(backend, canvas, region, cfg, generator)
    step, start = 0, time.perf_counter()
    with torch.no_grad():
        for b, positions in enumerate(blocks):
            active = torch.zeros_like(run.region)
            active[:, positions] = True
            backend.begin_block(int(positions[0]), int(positions[-1]) + 1)
            calls_before = backend.counters.calls
            for j in range(per_block):
                if cfg.method in ("plain", "remdm"):
                    committed, revoked = run.factored_step(active, j, per_block)
                else:
                    committed, revoked = run.confidence_step(active, per_block - j)
                if callback is not None:
                    callback(StepRecord(step, b, run.z.clone(), run.decided.clone(), committed, revoked,
                                        None if run.atc is None else run.atc.member.clone(), backend.counters.calls))
                step += 1
                if cfg.method != "remdm" and run.block_done(active, per_block - j - 1):
                    break  # the block is decided (and checked): the remaining steps would change nothing
            left = int((~run.decided & active).sum())
            if left:
                raise RuntimeError(f"method {cfg.method!r} left {left} undecided positions at the end of block {b}")
            for _ in range(backend.min_block_passes - (backend.counters.calls - calls_before)):
                run.idle_pass()
    seconds = time.perf_counter() - start
    return DecodeResult(run.z, dataclasses.replace(backend.counters), step, run.remasked, run.verified, seconds, cfg)
