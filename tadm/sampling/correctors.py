"""Predictor-corrector samplers for MDLM, as ReMDM's code releases them: forward-backward (FB)
and DFM.

Source: kuleshov-group/remdm, `diffusion.py` -- `_ddpm_caching_update` with
`sampling.sampler=forward-backward` (scripts/fb.sh) and `_dfm_caching_update` with
`sampling.dfm=true` (scripts/dfm.sh). Read there, written here. Notation: one step t -> s
(s < t), alpha from the log-linear schedule, u = (alpha_s - alpha_t) / (1 - alpha_t) (MDLM's
unmask probability), x_theta = x_theta(z_t). Both are ReMDM-form posteriors with a remasking
probability sigma for decoded tokens; they differ in sigma and in the time grid.

FB ("mdlm-fb"): sigma = (alpha_s - alpha_t) / alpha_t (1 where alpha_t = 0): a decoded token is
re-masked with the probability the forward process s -> t would mask it, measured against
alpha_t, and a masked one decodes with ReMDM's rate for that sigma:

    z_t^l != m:  keep with 1 - sigma, mask with sigma
    z_t^l  = m:  decode with (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t)  (= 2u when sigma < 1)
                 stay masked with (1 - alpha_s - sigma alpha_t) / (1 - alpha_t)

On the released uniform grid sigma = 1/i at the i-th step from the end, i.e. about one
re-masking per position over a trajectory (sum_i alpha_i sigma_i = sum_i 1/T = 1), against 0.02
with the eta-scaled rate this module had before. Where the stay-masked weight goes negative
(the last steps, 2u > 1), the release's categorical draw -- argmax of p / Exp(1) over the row --
never picks the negative entry, so the position decodes with probability 1: here the decode
rate is clipped to 1, the same distribution. sigma is clipped to 1 (it exceeds 1 only on this
schedule's first step, where alpha_t = eps and nothing is decoded yet; the release's alpha_t is
exactly 0 there and it sets sigma = 1).

DFM ("mdlm-dfm", Gat et al. 2024, App. D's corrector schedule): at time t < 1

    a_t = 10 t^(1/4) (1 - t)^(1/4) + 1,   b_t = a_t - 1
    z_t^l  = m:  decode with a_t u
    z_t^l != m:  mask with b_t (alpha_s / alpha_t - 1)

and its own time grid (`dfm_grid`): the first step is MDLM's with dt = 1/T; after it
dt = min(1/T, 1 / (a_t / t + b_t / (1 - t))), which keeps both rates <= 1, so a trajectory
takes *more* than T steps (the extra steps fall near t = 0, where a_t / t is large) and the
loop stops once t <= 1/T. Each extra step is a network call unless nothing changes (ddpm_cache),
and the compute counters record it.

Choices (the only places this differs from the release):
- alpha is this project's log-linear schedule with the training eps (alpha_t = 1 - (1 - eps) t),
  not 1 - t; a_t, b_t and the DFM step rule use t as released.
- The release ends a trajectory with "noise removal": one more network call whose argmax fills
  whatever is still masked. Here the last step of a grid is (t, 0), a pure predictor step with
  no remasking (alpha_s = 1: everything masked decodes, by a draw from x_theta), like every other
  sampler of the loop (`tadm.sampling.loop`, point 5). For FB this drops the release's last-step
  remasking (probability ~1/T per token); DFM's grid gets that (t, 0) step appended.
- Correctors act inside the current semi-AR block only (the release samples one block).
Coefficients are Python float64.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tadm.sampling.base import Sampler, Transition, point_mass, time_grid


def _check(alpha_t: float, alpha_s: float) -> None:
    if not 0.0 <= alpha_t <= alpha_s <= 1.0 or alpha_t >= 1.0:
        raise ValueError(f"need 0 <= alpha_t <= alpha_s <= 1 and alpha_t < 1; got {alpha_t}, {alpha_s}")


def _fused(x_theta: Tensor, z_t: Tensor, unmask: float, remask: float, mask_id: int) -> Tensor:
    """Rows (B, L, V+1): masked -> unmask * x_theta + (1 - unmask) m; decoded -> (1 - remask) keep + remask m."""
    from_mask = x_theta * unmask
    from_mask[..., mask_id] += 1.0 - unmask
    from_token = point_mass(z_t, x_theta.shape[-1], x_theta.dtype) * (1.0 - remask)
    from_token[..., mask_id] += remask
    return torch.where((z_t == mask_id).unsqueeze(-1), from_mask, from_token)


def fb_sigma(alpha_t: float, alpha_s: float) -> float:
    """FB's remasking probability (alpha_s - alpha_t) / alpha_t, clipped to 1 (1 at alpha_t = 0)."""
    _check(alpha_t, alpha_s)
    return 1.0 if alpha_t <= 0.0 else min(1.0, (alpha_s - alpha_t) / alpha_t)


def fb_rates(alpha_t: float, alpha_s: float) -> tuple[float, float]:
    """(unmask, remask) of one FB step (module docstring)."""
    sigma = fb_sigma(alpha_t, alpha_s)
    unmask = (alpha_s - (1.0 - sigma) * alpha_t) / (1.0 - alpha_t)
    return min(1.0, max(0.0, unmask)), sigma


def dfm_coefficients(t: float) -> tuple[float, float]:
    """(a_t, b_t) of the released DFM corrector schedule: a_t = 10 t^.25 (1 - t)^.25 + 1, b_t = a_t - 1."""
    if not 0.0 <= t <= 1.0:
        raise ValueError(f"DFM time t must lie in [0, 1], got {t}")
    a = 10.0 * t ** 0.25 * (1.0 - t) ** 0.25 + 1.0
    return a, a - 1.0


def dfm_rates(t: float, alpha_t: float, alpha_s: float) -> tuple[float, float]:
    """(unmask, remask) of one DFM step from time t (module docstring); t = 1: MDLM's step."""
    _check(alpha_t, alpha_s)
    u = (alpha_s - alpha_t) / (1.0 - alpha_t)
    if t >= 1.0:
        return u, 0.0
    a, b = dfm_coefficients(t)
    remask = 0.0 if alpha_t <= 0.0 else b * (alpha_s / alpha_t - 1.0)
    return min(1.0, a * u), min(1.0, remask)


def dfm_grid(steps: int) -> list[tuple[float, float]]:
    """DFM's [(t, s)]: dt = 1/T at t = 1, then min(1/T, 1 / (a_t / t + b_t / (1 - t))), until
    t <= 1/T; then (t, 0), the final predictor step (module docstring)."""
    if steps < 1:
        raise ValueError(f"steps must be positive, got {steps}")
    base, t, grid = 1.0 / steps, 1.0, []
    while t > base + 1e-12:
        if t >= 1.0:
            dt = base
        else:
            a, b = dfm_coefficients(t)
            dt = min(base, 1.0 / (a / t + b / (1.0 - t)))
        grid.append((t, t - dt))
        t -= dt
    if t > 1e-12:
        grid.append((t, 0.0))
    else:  # landed on 0 (to rounding): the last step is the final one
        grid[-1] = (grid[-1][0], 0.0)
    return grid


def fb_posterior(x_theta: Tensor, z_t: Tensor, alpha_t: float, alpha_s: float, mask_id: int) -> Tensor:
    """p(z_s | z_t) (B, L, V+1) of one FB step (dense; the loop uses the factored rates)."""
    unmask, remask = (1.0, 0.0) if alpha_s >= 1.0 else fb_rates(alpha_t, alpha_s)
    return _fused(x_theta, z_t, unmask, remask, mask_id)


def dfm_posterior(x_theta: Tensor, z_t: Tensor, t: float, alpha_t: float, alpha_s: float, mask_id: int) -> Tensor:
    """p(z_s | z_t) (B, L, V+1) of one DFM step from time t (dense)."""
    unmask, remask = (1.0, 0.0) if alpha_s >= 1.0 else dfm_rates(t, alpha_t, alpha_s)
    return _fused(x_theta, z_t, unmask, remask, mask_id)


class CorrectorSampler(Sampler):
    """MDLM + the released FB or DFM corrector on the log-linear schedule (module docstring)."""

    names = ("mdlm-fb", "mdlm-dfm")
    masks_only = True  # host-number rates

    def __init__(self, settings, mask_id: int):
        super().__init__(settings, mask_id)
        self.kind = settings.sampler.removeprefix("mdlm-")

    def grid(self, steps: int) -> list[tuple[float, float]]:
        return dfm_grid(steps) if self.kind == "dfm" else time_grid(steps)

    def transition(self, z_t: Tensor, t: float, s: float, active: Tensor) -> Transition:
        alpha_t, alpha_s = self.alpha(t), self.alpha(s)
        if s <= 0.0:  # the last step of a block: a pure predictor step, everything decodes
            unmask, remask, phase = 1.0, 0.0, "predictor"
        elif self.kind == "fb":
            (unmask, remask), phase = fb_rates(alpha_t, alpha_s), "fb"
        else:
            (unmask, remask), phase = dfm_rates(t, alpha_t, alpha_s), "dfm"
        return Transition(*self.rates(z_t, active, unmask, remask), alpha_t, alpha_s, remask, phase)


__all__ = ["CorrectorSampler", "dfm_coefficients", "dfm_grid", "dfm_posterior", "dfm_rates", "fb_posterior",
           "fb_rates", "fb_sigma"]
