"""Noise schedules for discrete diffusion: alpha_t, its derivative and the NELBO weight.

Paper notation (Sec. 2.1): q(z_t^l | x) = Cat(z_t^l; alpha_t x^l + (1 - alpha_t) pi), with
alpha_t decreasing from ~1 at t = 0 to ~0 at t = 1. MDLM writes alpha_t = exp(-sigma(t)).

The continuous-time masked-diffusion NELBO (MDLM; T-ANELBO as T -> inf) weights the
log-likelihood of each masked token by

    lambda_t = alpha'_t / (1 - alpha_t)        (negative, so -lambda_t log p >= 0).

Only the log-linear schedule is used by the paper (App. C.2); `NoiseSchedule` fixes the
interface the forward process, the losses and the samplers rely on.
"""

from __future__ import annotations

import abc

import torch
from torch import Tensor


class NoiseSchedule(abc.ABC):
    """alpha(t) on t in [0, 1] and the quantities derived from it (all elementwise in t)."""

    @abc.abstractmethod
    def alpha(self, t: Tensor) -> Tensor:
        """Signal level alpha_t = P(token kept at time t)."""

    @abc.abstractmethod
    def alpha_prime(self, t: Tensor) -> Tensor:
        """d alpha_t / dt (<= 0), shaped like t."""

    @abc.abstractmethod
    def time_of_alpha(self, alpha: Tensor) -> Tensor:
        """Inverse of alpha(t): the time t at which alpha_t = alpha."""

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        """1 - alpha_t (override where a form without cancellation exists)."""
        return 1.0 - self.alpha(t)

    def sigma(self, t: Tensor) -> Tensor:
        """Total noise sigma(t) = -log alpha_t."""
        return -torch.log(self.alpha(t))

    def dsigma(self, t: Tensor) -> Tensor:
        """Noise rate d sigma / dt = -alpha'_t / alpha_t (>= 0)."""
        return -self.alpha_prime(t) / self.alpha(t)

    def nelbo_weight(self, t: Tensor) -> Tensor:
        """MDLM continuous-time weight lambda_t = alpha'_t / (1 - alpha_t) (negative)."""
        return self.alpha_prime(t) / self.one_minus_alpha(t)


class LogLinearSchedule(NoiseSchedule):
    """MDLM's log-linear schedule: sigma(t) = -log(1 - (1 - eps) t), alpha_t = 1 - (1 - eps) t.

    alpha_t is linear in t, from 1 at t = 0 to eps at t = 1 (never exactly 0, so z_1 keeps a
    tiny fraction of clean tokens and every quantity below stays finite on [0, 1]).
    """

    def __init__(self, eps: float = 1e-3):
        if not 0.0 <= eps < 1.0:
            raise ValueError(f"eps must be in [0, 1), got {eps}")
        self.eps = eps

    def __repr__(self) -> str:
        return f"LogLinearSchedule(eps={self.eps})"

    def alpha(self, t: Tensor) -> Tensor:
        """alpha_t = exp(-sigma(t)) = 1 - (1 - eps) t."""
        return 1.0 - (1.0 - self.eps) * t

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        """1 - alpha_t = (1 - eps) t, exact (no cancellation near t = 0)."""
        return (1.0 - self.eps) * t

    def alpha_prime(self, t: Tensor) -> Tensor:
        """alpha'_t = -(1 - eps), broadcast to the shape and dtype of t."""
        return torch.full_like(t, -(1.0 - self.eps))

    def sigma(self, t: Tensor) -> Tensor:
        """sigma(t) = -log(1 - (1 - eps) t), via log1p for accuracy at small t."""
        return -torch.log1p(-(1.0 - self.eps) * t)

    def dsigma(self, t: Tensor) -> Tensor:
        """d sigma / dt = (1 - eps) / (1 - (1 - eps) t)."""
        return (1.0 - self.eps) / self.alpha(t)

    def nelbo_weight(self, t: Tensor) -> Tensor:
        """lambda_t = alpha'_t / (1 - alpha_t) = -(1 - eps) / ((1 - eps) t) = -1 / t."""
        return self.alpha_prime(t) / self.one_minus_alpha(t)

    def time_of_alpha(self, alpha: Tensor) -> Tensor:
        """t = (1 - alpha) / (1 - eps), the inverse of alpha_t = 1 - (1 - eps) t."""
        return (1.0 - alpha) / (1.0 - self.eps)
