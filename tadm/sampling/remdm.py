"""ReMDM remasking samplers (Wang et al., 2025).

Reverse posterior with remasking probability sigma_t (s < t, x_theta = x_theta(z_t)):

    z_t^l != m:  (1 - sigma) e_{z_t^l} + sigma m                         (a decoded token may be remasked)
    z_t^l  = m:  (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t) * x_theta
                 + (1 - alpha_s - sigma alpha_t) / (1 - alpha_t) * m

valid (non-negative) for 0 <= sigma <= sigma_max = min(1, (1 - alpha_s) / alpha_t); sigma = 0 is
exactly MDLM's ancestral step. Strategies for sigma:

    cap       sigma = min(eta, sigma_max)                 (released scripts: eta = 0.008)
    rescale   sigma = eta * sigma_max                     (eta = 0.015)
    conf      sigma^l = softmax_l(-c^l) * sigma_max over the decoded positions of the current
              block, c^l = x_theta's probability of the token when position l was decoded
              (no eta; masked positions get sigma 0)
    loop      alpha follows a three-phase schedule instead of the log-linear one
                t > t_on:          alpha = alpha_on (1 - t) / (1 - t_on)    MDLM steps (sigma 0)
                t_off < t <= t_on: alpha = alpha_on, sigma = eta            remask / re-decode loop
                t <= t_off:        alpha = 1 - (1 - alpha_on) t / t_off     MDLM steps (sigma 0)
              (eta = 0.02, t_on = 0.55, t_off = 0.05, alpha_on = 0.9; ADLM / TADM evaluation)

Choices: sigma is clamped to sigma_max in every strategy, so every row is a distribution (a
no-op at the published settings: e.g. the loop window's sigma_max = (1 - alpha_on)/alpha_on =
0.11 > eta). The loop phase is chosen by t, and alpha_t, alpha_s both come from the continuous
three-phase alpha above (ReMDM's code evaluates s with t's phase formula; the two differ only at
the step that straddles t_on or t_off). Remasking is confined to the current semi-AR block.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tadm.sampling.base import SamplerSettings, Sampler, Transition, point_mass


def sigma_max(alpha_t: float, alpha_s: float) -> float:
    """min(1, (1 - alpha_s) / alpha_t): the largest sigma that keeps the posterior valid."""
    return 1.0 if alpha_t <= 0.0 else min(1.0, (1.0 - alpha_s) / alpha_t)


def remdm_unmask(alpha_t: float, alpha_s: float, sigma: Tensor | float) -> Tensor | float:
    """(alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t): a masked position's decode probability
    (a float, or (B, L) for a per-position sigma)."""
    if not 0.0 <= alpha_t <= alpha_s <= 1.0 or alpha_t >= 1.0:
        raise ValueError(f"need 0 <= alpha_t <= alpha_s <= 1 and alpha_t < 1, got alpha_t={alpha_t}, alpha_s={alpha_s}")
    return (alpha_s - (1.0 - sigma) * alpha_t) / (1.0 - alpha_t)


def remdm_posterior(x_theta: Tensor, z_t: Tensor, alpha_t: float, alpha_s: float, sigma: Tensor | float,
                    mask_id: int) -> Tensor:
    """p(z_s | z_t) (B, L, V+1) of ReMDM (module docstring). `sigma`: a float, or per position
    (B, L); needs 0 <= sigma <= sigma_max(alpha_t, alpha_s) and alpha_t < 1."""
    if isinstance(sigma, Tensor):
        sigma = sigma.to(x_theta.dtype)
    unmask = remdm_unmask(alpha_t, alpha_s, sigma)
    stay_masked = (1.0 - alpha_s - sigma * alpha_t) / (1.0 - alpha_t)
    per_position = isinstance(sigma, Tensor)
    from_mask = x_theta * (unmask.unsqueeze(-1) if per_position else unmask)
    from_mask[..., mask_id] += stay_masked
    from_token = point_mass(z_t, x_theta.shape[-1], x_theta.dtype)
    from_token *= (1.0 - sigma).unsqueeze(-1) if per_position else 1.0 - sigma
    from_token[..., mask_id] += sigma
    return torch.where((z_t == mask_id).unsqueeze(-1), from_mask, from_token)


@dataclass(frozen=True)
class LoopSchedule:
    """ReMDM-loop's three-phase alpha(t) and the phase of a step at time t (module docstring)."""

    t_on: float = 0.55
    t_off: float = 0.05
    alpha_on: float = 0.9

    def alpha(self, t: float) -> float:
        if t > self.t_on:
            return self.alpha_on * (1.0 - t) / (1.0 - self.t_on)
        if t > self.t_off:
            return self.alpha_on
        return 1.0 if self.t_off == 0.0 else 1.0 - (1.0 - self.alpha_on) * t / self.t_off

    def phase(self, t: float) -> str:
        """'ramp' (t > t_on), 'loop' (t_off < t <= t_on) or 'finish' (t <= t_off)."""
        return "ramp" if t > self.t_on else "loop" if t > self.t_off else "finish"


def confidence_sigma(conf: Tensor, eligible: Tensor, smax: float) -> Tensor:
    """ReMDM-conf: sigma^l = softmax over eligible l of conf^l, times sigma_max (B, L);
    conf^l = -(probability of the token at decode time), so less confident tokens are remasked
    more; 0 where not eligible (and for rows with nothing eligible)."""
    weights = torch.softmax(conf.masked_fill(~eligible, float("-inf")), dim=-1)
    return torch.nan_to_num(weights, nan=0.0) * smax


class ReMDMSampler(Sampler):
    names = ("remdm-cap", "remdm-rescale", "remdm-conf", "remdm-loop")

    def __init__(self, settings: SamplerSettings, mask_id: int):
        super().__init__(settings, mask_id)
        self.strategy = settings.sampler.removeprefix("remdm-")
        self.loop = LoopSchedule(settings.t_on, settings.t_off, settings.alpha_on)
        self.conf: Tensor | None = None
        self.masks_only = self.strategy != "conf"  # ReMDM-conf's rates read the decoded tokens' confidence

    def start(self, z: Tensor) -> None:
        self.conf = torch.full(z.shape, float("-inf"), dtype=self.settings.precision, device=z.device)

    def state(self) -> dict:
        return {"conf": self.conf.clone()}

    def restore(self, state: dict) -> None:
        self.conf = state["conf"].clone()

    def transition(self, z_t: Tensor, t: float, s: float, active: Tensor) -> Transition:
        eta = self.settings.eta
        if self.strategy == "loop":
            alpha_t, alpha_s, phase = self.loop.alpha(t), self.loop.alpha(s), self.loop.phase(t)
        else:
            alpha_t, alpha_s, phase = self.alpha(t), self.alpha(s), self.strategy
        smax = sigma_max(alpha_t, alpha_s)
        if self.strategy == "cap":
            sigma = min(eta, smax)
        elif self.strategy == "rescale":
            sigma = eta * smax
        elif self.strategy == "conf":
            sigma = confidence_sigma(self.conf, (z_t != self.mask_id) & active, smax)
        else:
            sigma = min(eta, smax) if phase == "loop" else 0.0
        unmask = remdm_unmask(alpha_t, alpha_s, sigma)
        return Transition(*self.rates(z_t, active, unmask, sigma), alpha_t, alpha_s, sigma, phase)

    def observe(self, z_t: Tensor, z_s: Tensor, decoded: Tensor, token_prob: Tensor,
                rows: Tensor | None = None) -> None:
        """ReMDM-conf bookkeeping: newly decoded -> -p(token), remasked -> -inf."""
        if self.strategy != "conf":
            return
        remasked = (z_t != self.mask_id) & (z_s == self.mask_id)
        p = torch.zeros_like(self.conf)
        if rows is not None:  # the decoded positions' flat indices: no host read
            p.view(-1).scatter_(0, rows, token_prob.to(self.conf.dtype))
        elif token_prob.numel():
            p[decoded] = token_prob.to(self.conf.dtype)
        self.conf = torch.where(decoded, -p, self.conf).masked_fill(remasked, float("-inf"))
