"""MDLM's ancestral sampler (Sahoo et al., 2024).

With s < t and x_theta = x_theta(z_t) (SUBS: no mass on m), per position:

    z_t^l = m:   p(z_s^l = x) = (alpha_s - alpha_t) / (1 - alpha_t) * x_theta^l[x]    (x != m)
                 p(z_s^l = m) = (1 - alpha_s) / (1 - alpha_t)
    z_t^l != m:  z_s^l = z_t^l  (decoded tokens stay)

In the loop this is the factored `Transition` (unmask = (alpha_s - alpha_t) / (1 - alpha_t),
remask = 0); `mdlm_posterior` is the dense closed form it is tested against. The coefficients are computed in Python float64 from alpha_t and alpha_s, whatever the tensor
precision, so 1 - alpha_t near t = 0 loses nothing.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tadm.sampling.base import Sampler, Transition, point_mass


def mdlm_unmask(alpha_t: float, alpha_s: float) -> float:
    """(alpha_s - alpha_t) / (1 - alpha_t): the probability that a masked position decodes."""
    if not 0.0 <= alpha_t <= alpha_s <= 1.0 or alpha_t >= 1.0:
        raise ValueError(f"need 0 <= alpha_t <= alpha_s <= 1 and alpha_t < 1, got alpha_t={alpha_t}, alpha_s={alpha_s}")
    return (alpha_s - alpha_t) / (1.0 - alpha_t)


def mdlm_posterior(x_theta: Tensor, z_t: Tensor, alpha_t: float, alpha_s: float, mask_id: int) -> Tensor:
    """p(z_s | z_t) (B, L, V+1) of the MDLM ancestral step (module docstring), the dense closed
    form (the loop uses the factored `Transition`); needs alpha_t < 1."""
    unmask = mdlm_unmask(alpha_t, alpha_s)
    stay_masked = (1.0 - alpha_s) / (1.0 - alpha_t)
    from_mask = x_theta * unmask
    from_mask[..., mask_id] += stay_masked
    keep = point_mass(z_t, x_theta.shape[-1], x_theta.dtype)
    return torch.where((z_t == mask_id).unsqueeze(-1), from_mask, keep)


class MDLMSampler(Sampler):
    """Ancestral MDLM steps on the log-linear schedule."""

    names = ("mdlm",)
    masks_only = True  # host-number rates

    def transition(self, z_t: Tensor, t: float, s: float, active: Tensor) -> Transition:
        alpha_t, alpha_s = self.alpha(t), self.alpha(s)
        return Transition(*self.rates(z_t, active, mdlm_unmask(alpha_t, alpha_s), 0.0), alpha_t, alpha_s)
