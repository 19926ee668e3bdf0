"""Tests for tadm.forward_process: time sampling, masking, stale pairs, uniform state."""

import itertools

import pytest
import torch

from tadm.forward_process import (
    PAPER_BUDGET_CHOICES,
    PAPER_REFRESH_CHOICES,
    StalePair,
    mask_tokens,
    remask_towards,
    sample_times,
    stale_pair,
    stale_times,
    uniform_forward,
    uniform_posterior,
)
from tadm.schedule import LogLinearSchedule

EPS = 1e-3
V = 11
MASK = V


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(V, (batch, length), generator=_gen(seed))


def _binomial_tol(p: torch.Tensor | float, n: int, sds: float = 5.0) -> float:
    """`sds` standard deviations of an empirical frequency over n Bernoulli(p) draws."""
    p = float(torch.as_tensor(p).max())
    return sds * (p * (1 - p) / n) ** 0.5 + 1e-12


# --------------------------------------------------------------------------- times


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_antithetic_times_are_stratified(batch):
    t = sample_times(batch, EPS, antithetic=True, generator=_gen(3))
    assert t.shape == (batch,) and t.dtype == torch.float32
    assert (t >= EPS).all() and (t < 1).all()
    u = (t.double() - EPS) / (1 - EPS)
    strata = torch.floor(u * batch).long().clamp(max=batch - 1)
    assert sorted(strata.tolist()) == list(range(batch))  # exactly one time per stratum
    # consecutive samples are a shifted grid: u_{i+1} - u_i = 1/B (mod 1)
    gaps = torch.remainder(u[1:] - u[:-1], 1.0)
    torch.testing.assert_close(gaps, torch.full_like(gaps, 1 / batch), atol=1e-6, rtol=0)


def test_times_deterministic_under_seed_and_in_range():
    for antithetic in (True, False):
        a = sample_times(32, EPS, antithetic, generator=_gen(5))
        b = sample_times(32, EPS, antithetic, generator=_gen(5))
        c = sample_times(32, EPS, antithetic, generator=_gen(6))
        assert torch.equal(a, b) and not torch.equal(a, c)
        assert (a >= EPS).all() and (a < 1).all()


def test_iid_times_roughly_uniform():
    t = sample_times(20000, EPS, antithetic=False, generator=_gen(7))
    assert abs(t.mean().item() - (1 + EPS) / 2) < 0.01
    assert t.min() >= EPS and t.max() < 1


def test_times_never_reach_one():
    t = sample_times(4, 0.0, antithetic=True, generator=_gen(0), dtype=torch.float32)
    assert (t < 1).all()


# --------------------------------------------------------------------------- masking


def test_mask_tokens_keeps_alpha_fraction():
    x = _tokens(64, 512)
    alpha = torch.linspace(0.05, 0.95, 64)
    z = mask_tokens(x, alpha, MASK, _gen(2))
    kept = z != MASK
    assert torch.equal(z[kept], x[kept])  # kept tokens are the clean ones
    rate = kept.float().mean(-1)
    assert (rate - alpha).abs().max() < _binomial_tol(0.5, 512)
    overall = kept.float().mean()
    assert abs(overall - alpha.mean()) < _binomial_tol(0.5, x.numel())
    assert torch.equal(z, mask_tokens(x, alpha, MASK, _gen(2)))


def test_mask_tokens_extremes():
    x = _tokens(4, 32)
    assert torch.equal(mask_tokens(x, torch.ones(4), MASK, _gen()), x)
    assert (mask_tokens(x, torch.zeros(4), MASK, _gen()) == MASK).all()


def test_remask_towards_is_monotone_and_has_the_right_marginal():
    s = LogLinearSchedule(EPS)
    x = _tokens(64, 512)
    t = torch.linspace(0.1, 0.7, 64)
    t_prime = t + 0.2
    z_t = mask_tokens(x, s.alpha(t), MASK, _gen(2))
    z_tp = remask_towards(z_t, s.alpha(t), s.alpha(t_prime), MASK, _gen(3))
    assert (z_tp[z_t == MASK] == MASK).all()  # never unmasks
    kept = z_tp != MASK
    assert torch.equal(z_tp[kept], x[kept])
    rate = kept.float().mean(-1)  # marginal keep rate of z_t' must be alpha_t'
    assert (rate - s.alpha(t_prime)).abs().max() < _binomial_tol(0.5, 512)
    assert (z_tp == MASK).float().mean() > (z_t == MASK).float().mean()


def test_remask_towards_identity_when_same_time():
    x = _tokens(8, 64)
    z_t = mask_tokens(x, torch.full((8,), 0.5), MASK, _gen(2))
    a = torch.full((8,), 0.5)
    assert torch.equal(remask_towards(z_t, a, a, MASK, _gen(4)), z_t)


# --------------------------------------------------------------------------- stale pairs


def test_stale_times_definition():
    t = sample_times(4096, EPS, True, _gen(1))
    t_prime, k, K, T = stale_times(t, PAPER_REFRESH_CHOICES, PAPER_BUDGET_CHOICES, _gen(2))
    assert set(K.tolist()) == set(PAPER_REFRESH_CHOICES)
    assert set(T.tolist()) == set(PAPER_BUDGET_CHOICES)
    assert (k >= 0).all() and (k < K).all()
    torch.testing.assert_close(t_prime, torch.clamp(t + k.float() / T.float(), max=1.0))
    assert (t_prime >= t).all() and (t_prime <= 1).all()
    for refresh in PAPER_REFRESH_CHOICES:  # k covers 0..K-1 for each K
        assert set(k[K == refresh].tolist()) == set(range(refresh))


def test_stale_times_clips_at_one():
    t = torch.full((256,), 0.999)
    t_prime, k, _, _ = stale_times(t, [8], [8], _gen(0))
    assert (t_prime[k > 0] == 1.0).all()


def test_stale_times_k_roughly_uniform():
    t = torch.rand(30000, generator=_gen(0))
    _, k, _, _ = stale_times(t, [3], [128], _gen(1))
    freq = torch.bincount(k, minlength=3).float() / k.numel()
    assert (freq - 1 / 3).abs().max() < _binomial_tol(1 / 3, k.numel())


def test_stale_pair_refresh_one_is_fresh():
    s = LogLinearSchedule(EPS)
    x = _tokens(16, 64)
    t = sample_times(16, EPS, True, _gen(1))
    pair = stale_pair(x, t, s, MASK, [1], PAPER_BUDGET_CHOICES, _gen(2))
    assert isinstance(pair, StalePair)
    assert (pair.k == 0).all()
    assert torch.equal(pair.t_prime, t) and torch.equal(pair.z_tprime, pair.z_t)


def test_stale_pair_consistent_and_deterministic():
    s = LogLinearSchedule(EPS)
    x = _tokens(32, 64)
    t = sample_times(32, EPS, True, _gen(1))
    args = (x, t, s, MASK, PAPER_REFRESH_CHOICES, [4])
    p, q = stale_pair(*args, _gen(2)), stale_pair(*args, _gen(2))
    for name in ("z_t", "z_tprime", "t", "t_prime", "k", "K", "T"):
        assert torch.equal(getattr(p, name), getattr(q, name))
    assert (p.z_tprime[p.z_t == MASK] == MASK).all()
    assert (p.k > 0).any()
    torch.testing.assert_close(p.t_prime, torch.clamp(t + p.k / p.T, max=1.0))


# --------------------------------------------------------------------------- uniform state


def test_uniform_forward_marginal():
    x = _tokens(32, 1024)
    alpha = torch.full((32,), 0.3)
    z = uniform_forward(x, alpha, V, _gen(9))
    assert z.min() >= 0 and z.max() < V
    p_same = 0.3 + 0.7 / V  # the uniform draw can land on the clean token
    assert abs((z == x).float().mean() - p_same) < _binomial_tol(p_same, x.numel())


def _q_forward(a: float, n: int) -> torch.Tensor:
    """Transition matrix M[i, j] = q(z = j | previous = i) = a [i = j] + (1 - a) / n."""
    return a * torch.eye(n, dtype=torch.float64) + (1 - a) / n


def test_uniform_posterior_is_bayes_by_enumeration():
    n, a_s, a_t = 4, 0.7, 0.3
    q_s_x, q_t_s = _q_forward(a_s, n), _q_forward(a_t / a_s, n)
    q_t_x = _q_forward(a_t, n)
    xs, zs = zip(*itertools.product(range(n), range(n)))
    x = torch.tensor(xs).view(1, -1)
    z_t = torch.tensor(zs).view(1, -1)
    x_probs = torch.nn.functional.one_hot(x, n).double()
    post = uniform_posterior(z_t, x_probs, torch.tensor([a_s]), torch.tensor([a_t]), n,
                             dtype=torch.float64)
    for l, (xi, zi) in enumerate(zip(xs, zs)):
        # q(z_s | z_t, x) = q(z_s | x) q(z_t | z_s) / q(z_t | x), by enumerating z_s
        bayes = torch.tensor([q_s_x[xi, j] * q_t_s[j, zi] / q_t_x[xi, zi] for j in range(n)],
                             dtype=torch.float64)
        torch.testing.assert_close(post[0, l], bayes)
    torch.testing.assert_close(post.sum(-1), torch.ones(1, n * n, dtype=torch.float64))


def test_uniform_posterior_soft_x_matches_appendix_formula():
    n, B, L = 6, 3, 5
    g = _gen(4)
    x_probs = torch.softmax(torch.randn(B, L, n, generator=g, dtype=torch.float64), -1)
    z_t = torch.randint(n, (B, L), generator=g)
    a_s = torch.tensor([0.9, 0.5, 0.2], dtype=torch.float64)
    a_t = torch.tensor([0.6, 0.5, 0.01], dtype=torch.float64)
    post = uniform_posterior(z_t, x_probs, a_s, a_t, n, dtype=torch.float64)
    assert (post >= 0).all()
    torch.testing.assert_close(post.sum(-1), torch.ones(B, L, dtype=torch.float64))
    # App. B.1.2 (its K is the vocabulary size n)
    z = torch.nn.functional.one_hot(z_t, n).double()
    As, At = a_s.view(B, 1, 1), a_t.view(B, 1, 1)
    num = (n * At * z * x_probs + (At / As - At) * z + (As - At) * x_probs
           + (As - At) * (1 - As) / (n * As))
    den = n * At * (z * x_probs).sum(-1, keepdim=True) + 1 - At
    torch.testing.assert_close(post, num / den)
