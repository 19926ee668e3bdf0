"""The sampling loop every sampler shares (the samplers themselves: `tadm.sampling.base`).

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

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tadm import runtime
from tadm.models.dit import constant_conditioning
from tadm.sampling.adapters import Adapter
from tadm.sampling.base import (Deferred, Sampler, SamplerSettings, StepInfo, Transition, block_ranges, build_sampler,
                                decoded_rows, method_schedule, nucleus_filter, predict_x0, x_theta_rows)
from tadm.sampling.counters import ComputeCounter
from tadm.sampling.nucleus import draw_nucleus


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


__all__ = ["Paused", "SampleResult", "PLAN_STEPS", "mask_generator", "sample"]
