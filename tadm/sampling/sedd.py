"""SEDD's "analytic" sampler for the absorbing process (Lou et al., 2024).

The network's output gives log scores l = `sedd_log_scores(logits)` (mask column dropped), and
the concrete score at a masked position is s_y = e^{l_y} r_t with r_t = alpha_t / (1 - alpha_t)
(`tadm.losses`). For absorbing diffusion the exact reverse kernel from t to s, written with the
true concrete score (s_y / r_t = q_0(y | z_t), Tweedie), is

    z_t^l = m:   p(z_s^l = y) = (alpha_s - alpha_t) / (1 - alpha_t) * s_y / r_t      (y != m)
                 p(z_s^l = m) = (1 - alpha_s) / (1 - alpha_t)
    z_t^l != m:  z_s^l = z_t^l

With a learned score, sum_y s_y / r_t = sum_y e^{l_y} need not be 1; this module normalises the
score part, s_y / r_t -> e^{l_y} / sum_y' e^{l_y'}, and keeps the mask probability exact, so the
step is MDLM's posterior with x_theta = normalise(exp(l)) (Choice: SEDD's released code instead
normalises the whole row, which rescales the unmask rate by sum_y e^{l_y}; the two agree for a
perfect score.) Since l = logits[:V] - log V, normalise(exp(l)) = softmax(logits[:V]), which is
exactly the loop's SUBS x_theta at masked positions; so inside `sample` the "sedd-analytic"
sampler is `mdlm_posterior` on the loop's x_theta (with the loop's nucleus filter, if any), and
`sedd_analytic_posterior` below is the explicit form from scores used to check that.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tadm.losses import sedd_log_scores
from tadm.sampling.base import Sampler, Transition
from tadm.sampling.mdlm import mdlm_posterior, mdlm_unmask


def sedd_analytic_posterior(logits: Tensor, z_t: Tensor, alpha_t: float, alpha_s: float, mask_id: int,
                            precision: torch.dtype = torch.float64) -> Tensor:
    """p(z_s | z_t) (B, L, V+1) from SEDD logits via the concrete score (module docstring),
    computed in `precision`; coefficients in Python float64."""
    if not 0.0 < alpha_t <= alpha_s <= 1.0 or alpha_t >= 1.0:
        raise ValueError(f"need 0 < alpha_t <= alpha_s <= 1 and alpha_t < 1, got alpha_t={alpha_t}, alpha_s={alpha_s}")
    ratio = sedd_log_scores(logits, mask_id, precision).exp()  # s_y / r_t: estimate of q_0(y | z_t)
    x_hat = ratio / ratio.sum(-1, keepdim=True)  # normalise the score part (module docstring)
    x_theta = torch.cat([x_hat, x_hat.new_zeros(*x_hat.shape[:-1], 1)], dim=-1)  # mask column: 0
    return mdlm_posterior(x_theta, z_t, alpha_t, alpha_s, mask_id)


class SEDDAnalyticSampler(Sampler):
    """SEDD's analytic step on the log-linear schedule = MDLM's posterior on x_theta (docstring)."""

    names = ("sedd-analytic",)
    masks_only = True  # host-number rates

    def transition(self, z_t: Tensor, t: float, s: float, active: Tensor) -> Transition:
        alpha_t, alpha_s = self.alpha(t), self.alpha(s)
        rates = self.rates(z_t, active, mdlm_unmask(alpha_t, alpha_s), 0.0)
        return Transition(*rates, alpha_t, alpha_s, 0.0, "sedd-analytic")


__all__ = ["SEDDAnalyticSampler", "sedd_analytic_posterior"]
