"""Tests for tadm.schedule: closed forms against autograd and against each other."""

import torch

from tadm.schedule import LogLinearSchedule, NoiseSchedule

EPS = 1e-3


def _times() -> torch.Tensor:
    return torch.linspace(EPS, 1.0 - 1e-6, 257, dtype=torch.float64)


def _autograd(fn, t: torch.Tensor) -> torch.Tensor:
    """d fn(t) / dt elementwise, by autograd."""
    t = t.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(t).sum(), t)
    return grad


def test_is_a_noise_schedule():
    assert isinstance(LogLinearSchedule(), NoiseSchedule)
    assert LogLinearSchedule().eps == EPS


def test_alpha_is_exp_minus_sigma_and_endpoints():
    s, t = LogLinearSchedule(EPS), _times()
    torch.testing.assert_close(s.alpha(t), torch.exp(-s.sigma(t)))
    torch.testing.assert_close(s.alpha(t), 1 - (1 - EPS) * t)
    ends = torch.tensor([0.0, 1.0], dtype=torch.float64)
    torch.testing.assert_close(s.alpha(ends), torch.tensor([1.0, EPS], dtype=torch.float64))


def test_alpha_prime_matches_autograd():
    s, t = LogLinearSchedule(EPS), _times()
    assert s.alpha_prime(t).shape == t.shape
    torch.testing.assert_close(s.alpha_prime(t), _autograd(s.alpha, t))


def test_dsigma_matches_autograd_of_sigma():
    s, t = LogLinearSchedule(EPS), _times()
    torch.testing.assert_close(s.dsigma(t), _autograd(s.sigma, t))
    torch.testing.assert_close(s.dsigma(t), -s.alpha_prime(t) / s.alpha(t))


def test_nelbo_weight_matches_autograd():
    s, t = LogLinearSchedule(EPS), _times()
    expected = _autograd(s.alpha, t) / (1 - s.alpha(t))
    torch.testing.assert_close(s.nelbo_weight(t), expected)
    assert (s.nelbo_weight(t) < 0).all()
    torch.testing.assert_close(s.nelbo_weight(t), -1.0 / t)  # log-linear: lambda_t = -1/t


def test_time_of_alpha_inverts_alpha():
    s, t = LogLinearSchedule(EPS), _times()
    torch.testing.assert_close(s.time_of_alpha(s.alpha(t)), t)


def test_float32_accuracy_near_t_eps():
    s = LogLinearSchedule(EPS)
    t64 = torch.tensor([EPS, 2 * EPS, 0.5], dtype=torch.float64)
    t32 = t64.float()
    torch.testing.assert_close(s.nelbo_weight(t32).double(), s.nelbo_weight(t64), rtol=1e-6, atol=0)
    torch.testing.assert_close(s.sigma(t32).double(), s.sigma(t64), rtol=1e-6, atol=0)
