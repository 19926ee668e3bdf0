"""Predictor-corrector samplers for MDLM: forward-backward (FB) and DFM correctors.

ReMDM's code ships both as extra baselines (REFERENCE §2, "Also in ReMDM's code"); its source is
not available here, so what follows is this repo's own derivation, fused into the one-network-
call-per-step loop of `tadm.sampling.base` (T steps = T network calls, as every other sampler,
so compute columns stay comparable). Notation: s < t, u = (alpha_s - alpha_t) / (1 - alpha_t)
(MDLM's unmask probability), k = (1 - alpha_s) / (1 - alpha_t) = 1 - u, eta = the corrector
rate (`SamplerSettings.eta`), x_theta = x_theta(z_t).

Predictor: MDLM's ancestral step t -> s (`mdlm_posterior`).

FB corrector ("mdlm-fb", after Campbell et al. 2022). After the predictor, a fraction eta of
the forward process s -> t is applied to every decoded position of the current block: the
absorbing forward kernel q(z_t | z_s) masks a token with probability 1 - alpha_t / alpha_s, so
each decoded token is re-masked with

    c = eta * (1 - alpha_t / alpha_s).

The backward (denoising) half of the corrector is the next step's predictor, which re-decodes
the re-masked positions with a *fresh* x_theta (the current x_theta is SUBS: a point mass on
every decoded token, so denoising again with it would return the same token). Fused per
position (predictor, then corrector; independent across positions given x_theta):

    z_t^l = m:   p(x) = (1 - c) u x_theta[x],          p(m) = k + c u
    z_t^l != m:  p(z_t^l) = 1 - c,                     p(m) = c

DFM corrector ("mdlm-dfm", after Gat et al. 2024, discrete flow matching): the corrector
velocity is (1 + eta) times the forward (unmasking) velocity plus eta times the backward
(masking) velocity (Gat et al.'s a_t u_fwd - b_t u_bwd with a_t - b_t = 1, b_t = eta). One
step t -> s in probability form: the forward part unmasks with (1 + eta) u, the backward part
moves a decoded token back to m with eta (alpha_s - alpha_t) / alpha_s (the noising path's
masking probability over the same interval, measured from the decoded side). Per position:

    z_t^l = m:   p(x) = u' x_theta[x],  p(m) = 1 - u',   u' = min(1, (1 + eta) u)
    z_t^l != m:  p(z_t^l) = 1 - b,      p(m) = b,        b = min(1, eta (alpha_s - alpha_t) / alpha_s)

Choices: eta is constant over time (default 0.02, the ReMDM-loop strength), and the corrector
is switched off on a block's last step (s = 0), which is a pure predictor step (noise removal),
so nothing is left masked; elsewhere the correctors act only inside the current semi-AR block.
With eta = 0, or on the last step, the transition *is* `mdlm_posterior` (same tensor, so the
same draws under the same generator). Coefficients are Python float64 as in MDLM.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tadm.sampling.base import Sampler, Transition, point_mass
from tadm.sampling.mdlm import mdlm_posterior


def _check(alpha_t: float, alpha_s: float, eta: float) -> None:
    if not 0.0 <= alpha_t <= alpha_s <= 1.0 or alpha_t >= 1.0 or alpha_s <= 0.0:
        raise ValueError(f"need 0 <= alpha_t <= alpha_s <= 1, alpha_t < 1, alpha_s > 0; got {alpha_t}, {alpha_s}")
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"corrector rate eta must be in [0, 1], got {eta!r}")


def _fused(x_theta: Tensor, z_t: Tensor, unmask: float, stay_masked: float, remask: float, mask_id: int) -> Tensor:
    """Rows (B, L, V+1): masked -> unmask * x_theta + stay_masked * m; decoded -> (1 - remask) keep + remask * m."""
    from_mask = x_theta * unmask
    from_mask[..., mask_id] += stay_masked
    from_token = point_mass(z_t, x_theta.shape[-1], x_theta.dtype) * (1.0 - remask)
    from_token[..., mask_id] += remask
    return torch.where((z_t == mask_id).unsqueeze(-1), from_mask, from_token)


def fb_remask_prob(alpha_t: float, alpha_s: float, eta: float) -> float:
    """c = eta * (1 - alpha_t / alpha_s): a fraction eta of the forward kernel s -> t."""
    return eta * (1.0 - alpha_t / alpha_s)


def fb_posterior(x_theta: Tensor, z_t: Tensor, alpha_t: float, alpha_s: float, eta: float, mask_id: int) -> Tensor:
    """MDLM predictor t -> s followed by the FB corrector's forward re-masking (module docstring)."""
    _check(alpha_t, alpha_s, eta)
    if eta == 0.0:
        return mdlm_posterior(x_theta, z_t, alpha_t, alpha_s, mask_id)
    u = (alpha_s - alpha_t) / (1.0 - alpha_t)
    c = fb_remask_prob(alpha_t, alpha_s, eta)
    return _fused(x_theta, z_t, (1.0 - c) * u, (1.0 - u) + c * u, c, mask_id)


def dfm_posterior(x_theta: Tensor, z_t: Tensor, alpha_t: float, alpha_s: float, eta: float, mask_id: int) -> Tensor:
    """One Euler step of the DFM corrector velocity (module docstring)."""
    _check(alpha_t, alpha_s, eta)
    if eta == 0.0:
        return mdlm_posterior(x_theta, z_t, alpha_t, alpha_s, mask_id)
    u = min(1.0, (1.0 + eta) * (alpha_s - alpha_t) / (1.0 - alpha_t))
    b = min(1.0, eta * (alpha_s - alpha_t) / alpha_s)
    return _fused(x_theta, z_t, u, 1.0 - u, b, mask_id)


def corrector_rates(kind: str, alpha_t: float, alpha_s: float, eta: float) -> tuple[float, float]:
    """(unmask, remask) of the fused predictor-corrector step, kind "fb" or "dfm" (docstring)."""
    _check(alpha_t, alpha_s, eta)
    u = (alpha_s - alpha_t) / (1.0 - alpha_t)
    if eta == 0.0:
        return u, 0.0
    if kind == "fb":
        c = fb_remask_prob(alpha_t, alpha_s, eta)
        return (1.0 - c) * u, c
    return min(1.0, (1.0 + eta) * u), min(1.0, eta * (alpha_s - alpha_t) / alpha_s)


class CorrectorSampler(Sampler):
    """MDLM predictor + FB or DFM corrector on the log-linear schedule; rate = settings.eta."""

    names = ("mdlm-fb", "mdlm-dfm")

    def transition(self, z_t: Tensor, t: float, s: float, active: Tensor) -> Transition:
        alpha_t, alpha_s = self.alpha(t), self.alpha(s)
        eta = 0.0 if s <= 0.0 else self.settings.eta  # the last step of a block is a pure predictor
        kind = self.settings.sampler.removeprefix("mdlm-")
        unmask, remask = corrector_rates(kind, alpha_t, alpha_s, eta)
        phase = kind if eta > 0.0 else "predictor"
        return Transition(*self.rates(z_t, active, unmask, remask), alpha_t, alpha_s, remask, phase)


__all__ = ["CorrectorSampler", "corrector_rates", "fb_posterior", "dfm_posterior", "fb_remask_prob"]
