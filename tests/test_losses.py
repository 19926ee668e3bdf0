"""Tests for tadm.losses: perfect predictors, the NELBO integral, SEDD, anchors, AR."""

import math

import pytest
import torch
import torch.nn.functional as F

from tadm.forward_process import StalePair, mask_tokens, sample_times, stale_pair
from tadm.losses import (
    adlm_anchor_loss,
    anchor_cross_entropy,
    ar_nll,
    important_token_mask,
    mdlm_nelbo,
    sedd_score_entropy,
    subs_log_probs,
    t_anelbo,
)
from tadm.schedule import LogLinearSchedule

EPS = 1e-3
V = 7
MASK = V
SCHED = LogLinearSchedule(EPS)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _batch(B: int = 4, L: int = 16, seed: int = 0):
    g = _gen(seed)
    x = torch.randint(V, (B, L), generator=g)
    t = sample_times(B, EPS, True, g)
    z_t = mask_tokens(x, SCHED.alpha(t), MASK, g)
    logits = torch.randn(B, L, V + 1, generator=g)
    return x, t, z_t, logits


def _perfect_logits(x: torch.Tensor) -> torch.Tensor:
    """Logits whose softmax is the one-hot of x (mask column included, any value)."""
    return torch.where(F.one_hot(x, V + 1).bool(), 0.0, float("-inf"))


# --------------------------------------------------------------------------- SUBS


def test_subs_log_probs_structure_and_no_nan():
    x, t, z_t, logits = _batch()
    logits.requires_grad_(True)
    lp = subs_log_probs(logits, z_t, MASK)
    masked = z_t == MASK
    assert masked.any() and (~masked).any()
    assert (lp[..., MASK] == float("-inf")).all()  # zero masking
    torch.testing.assert_close(lp.exp().sum(-1), torch.ones(z_t.shape))
    carried = lp[~masked]  # carry-over: point mass on the input token
    assert (carried.gather(-1, z_t[~masked].unsqueeze(-1)) == 0).all()
    assert (carried.exp().sum(-1) == 1).all()
    loss = mdlm_nelbo(lp, x, z_t, t, SCHED, MASK).sum()
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all()
    assert (logits.grad[~masked] == 0).all() and (logits.grad[..., MASK] == 0).all()


def test_subs_casts_to_requested_precision():
    x, t, z_t, logits = _batch()
    assert subs_log_probs(logits.bfloat16(), z_t, MASK).dtype == torch.float32
    assert subs_log_probs(logits, z_t, MASK, dtype=torch.float64).dtype == torch.float64


# --------------------------------------------------------------------------- MDLM NELBO


def test_mdlm_nelbo_perfect_predictor_is_zero():
    x, t, z_t, _ = _batch()
    lp = subs_log_probs(_perfect_logits(x), z_t, MASK)
    loss = mdlm_nelbo(lp, x, z_t, t, SCHED, MASK)
    assert torch.equal(loss, torch.zeros(4))


def test_mdlm_nelbo_hand_value():
    x, t, z_t, logits = _batch()
    lp = subs_log_probs(logits, z_t, MASK)
    loss = mdlm_nelbo(lp, x, z_t, t, SCHED, MASK)
    ref = torch.log_softmax(logits[..., :V], -1).gather(-1, x[..., None])[..., 0]
    ref = ((z_t == MASK) * ref).sum(-1) / t  # lambda_t = -1/t, so -lambda_t * (-log p) sums
    torch.testing.assert_close(loss, -ref)
    assert (loss >= 0).all()


def test_mdlm_nelbo_integrates_the_discrete_bound():
    """Fixed predictor p (independent of t): E_t E_z[mdlm_nelbo] = -(1 - eps) sum_l log p(x^l).

    For any T the discrete bound sum_i (alpha_t - alpha_s)/(1 - alpha_t) * P(masked at t)
    * log p = sum_i (alpha_t - alpha_s) log p telescopes to (alpha_1 - alpha_0) log p
    = -(1 - eps) log p; the continuous weight alpha'/(1 - alpha) times P(masked) = 1 - alpha
    integrates to the same value. Check the Monte-Carlo average of the implementation.
    """
    for eps in (1e-3, 0.2):
        sched = LogLinearSchedule(eps)
        g = _gen(11)
        L, n = 8, 40000
        x = torch.randint(V, (1, L), generator=g)
        logits = torch.randn(1, L, V + 1, generator=g)
        log_p_x = torch.log_softmax(logits[..., :V], -1).gather(-1, x[..., None]).sum()
        closed = -(1 - eps) * log_p_x
        t = sample_times(n, 0.0, antithetic=True, generator=g)  # U[0, 1) covers the integral
        t = t.clamp(min=1e-6)
        xs = x.expand(n, L)
        z_t = mask_tokens(xs, sched.alpha(t), MASK, g)
        lp = subs_log_probs(logits.expand(n, L, V + 1), z_t, MASK)
        estimate = mdlm_nelbo(lp, xs, z_t, t, sched, MASK).mean()
        assert abs(estimate - closed) < 0.03 * closed, (eps, estimate, closed)
        # and the discrete-time bound (exact expectation over z) by quadrature on T steps
        T = 1000
        ti = torch.arange(1, T + 1, dtype=torch.float64) / T
        si = ti - 1 / T
        discrete = ((sched.alpha(ti) - sched.alpha(si)) / (1 - sched.alpha(ti))
                    * (1 - sched.alpha(ti))).sum() * log_p_x
        assert math.isclose(discrete.item(), closed.item(), rel_tol=1e-6)


# --------------------------------------------------------------------------- SEDD


def _sedd_literal(logits, x, z_t, t):
    """dsigma * [sum_y s_y - r log s_x + r (log r - 1)] on masked positions, float64."""
    lp = logits[..., :V].double() - math.log(V)  # unnormalised log scores, offset by -log V
    alpha = SCHED.alpha(t.double())
    r = (alpha / (1 - alpha))[:, None]
    log_s = lp + r.log()[..., None]
    per_pos = (log_s.exp().sum(-1) - r * log_s.gather(-1, x[..., None])[..., 0]
               + r * (r.log() - 1))
    per_pos = torch.where(z_t == MASK, per_pos, 0.0)
    return SCHED.dsigma(t.double()) * per_pos.sum(-1)


def test_sedd_matches_literal_formula_and_mdlm():
    x, t, z_t, logits = _batch(B=8, L=32, seed=3)
    loss = sedd_score_entropy(logits, x, z_t, t, SCHED, MASK, dtype=torch.float64)
    torch.testing.assert_close(loss, _sedd_literal(logits, x, z_t, t), rtol=1e-9, atol=1e-9)
    assert (loss > 0).all()
    # SEDD upper-bounds the MDLM NELBO of softmax(logits), strictly for unnormalised logits...
    mdlm = mdlm_nelbo(subs_log_probs(logits, z_t, MASK, torch.float64), x, z_t, t, SCHED, MASK)
    assert (loss > mdlm).all()
    # ... and equals it when the logits are already normalised (dsigma * r = -alpha'/(1-alpha))
    normalised = torch.log_softmax(logits[..., :V].double(), -1) + math.log(V)  # undo the offset
    loss_n = sedd_score_entropy(normalised, x, z_t, t, SCHED, MASK, dtype=torch.float64)
    torch.testing.assert_close(loss_n, mdlm)


def test_sedd_zero_iff_perfect():
    x, t, z_t, logits = _batch()
    perfect = _perfect_logits(x) + math.log(V)  # e^{l - log V} is the one-hot of x
    torch.testing.assert_close(sedd_score_entropy(perfect, x, z_t, t, SCHED, MASK), torch.zeros(4))
    # a nearly-perfect but not one-hot prediction is strictly positive where anything is masked
    near = perfect.clamp(min=-5.0)
    loss = sedd_score_entropy(near, x, z_t, t, SCHED, MASK)
    assert ((loss > 0) == (z_t == MASK).any(-1)).all()


@pytest.mark.parametrize("t_value", [EPS, 1e-2, 0.5, 1.0 - 1e-7, 1.0])
def test_sedd_stable_at_extreme_times(t_value):
    x, _, _, logits = _batch(B=2, L=16)
    z_t = torch.full_like(x, MASK)
    t = torch.full((2,), t_value)
    logits.requires_grad_(True)
    loss = sedd_score_entropy(logits, x, z_t, t, SCHED, MASK)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and (loss >= 0).all()
    # a zero-initialised network starts at the uniform score: the MDLM loss of uniform logits
    zero = sedd_score_entropy(torch.zeros_like(logits), x, z_t, t, SCHED, MASK)
    uniform = mdlm_nelbo(subs_log_probs(torch.zeros_like(logits), z_t, MASK), x, z_t, t, SCHED, MASK)
    torch.testing.assert_close(zero, uniform)
    assert torch.isfinite(logits.grad).all()
    ref = mdlm_nelbo(subs_log_probs(logits.detach(), z_t, MASK), x, z_t, t, SCHED, MASK)
    assert (loss.detach() >= ref * (1 - 1e-5)).all()


# --------------------------------------------------------------------------- anchors


def _pair(B=4, L=16, seed=0, refresh=(4,)) -> tuple[torch.Tensor, StalePair]:
    g = _gen(seed)
    x = torch.randint(V, (B, L), generator=g)
    t = sample_times(B, EPS, True, g)
    return x, stale_pair(x, t, SCHED, MASK, refresh, [8], g)


def test_anchor_cross_entropy_targets_and_weight():
    x, pair = _pair(seed=2)
    logits = torch.randn(4, 16, V + 1, generator=_gen(5))
    loss = anchor_cross_entropy(logits, x, pair.z_tprime, pair.t_prime, SCHED, MASK)
    ce = F.cross_entropy(logits[..., :V].reshape(-1, V), x.reshape(-1), reduction="none")
    ce = ce.view(4, 16) * (pair.z_tprime == MASK)
    torch.testing.assert_close(loss, ce.sum(-1) / pair.t_prime)  # -lambda_t' = 1/t'
    bumped = logits.clone()
    bumped[..., MASK] += 100.0  # the mask logit is excluded
    torch.testing.assert_close(
        anchor_cross_entropy(bumped, x, pair.z_tprime, pair.t_prime, SCHED, MASK), loss)
    # V-column anchor heads (no mask logit) are accepted too
    torch.testing.assert_close(
        anchor_cross_entropy(logits[..., :V], x, pair.z_tprime, pair.t_prime, SCHED, MASK), loss)


def test_t_anelbo_gamma_zero_sends_no_gradient_to_anchor_head():
    x, pair = _pair(seed=1)
    hidden = torch.randn(4, 16, 8, generator=_gen(2))
    anchor_head = torch.nn.Linear(8, V + 1)
    denoiser_head = torch.nn.Linear(8, V + 1)
    lp = subs_log_probs(denoiser_head(hidden), pair.z_t, MASK)
    total, parts = t_anelbo(lp, anchor_head(hidden), x, pair, SCHED, MASK, gamma=0.0)
    total.sum().backward()
    assert anchor_head.weight.grad is None and anchor_head.bias.grad is None
    assert denoiser_head.weight.grad is not None
    assert torch.equal(parts["anchor"], torch.zeros(4))
    total_none, _ = t_anelbo(lp.detach(), None, x, pair, SCHED, MASK, gamma=0.0)
    torch.testing.assert_close(total_none, total.detach())


def test_t_anelbo_gamma_positive_combines_terms():
    x, pair = _pair(seed=1)
    hidden = torch.randn(4, 16, 8, generator=_gen(2))
    anchor_head = torch.nn.Linear(8, V + 1)
    anchor_logits = anchor_head(hidden)
    lp = subs_log_probs(torch.randn(4, 16, V + 1, generator=_gen(3)), pair.z_t, MASK)
    total, parts = t_anelbo(lp, anchor_logits, x, pair, SCHED, MASK, gamma=3e-3)
    torch.testing.assert_close(parts["nelbo"], mdlm_nelbo(lp, x, pair.z_t, pair.t, SCHED, MASK))
    torch.testing.assert_close(total, parts["nelbo"] + 3e-3 * parts["anchor"])
    total.sum().backward()
    assert anchor_head.weight.grad is not None and anchor_head.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError):
        t_anelbo(lp, None, x, pair, SCHED, MASK, gamma=1.0)


def test_important_token_mask_hand_made():
    # token 1 occurs 6 times (not important), 2 occurs 5 times (important), 3 once
    row = [1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 3]
    x = torch.tensor([row, [0] * 12])
    imp = important_token_mask(x, max_count=5)
    expected = torch.tensor([[v != 1 for v in row], [False] * 12])
    assert torch.equal(imp, expected)
    assert important_token_mask(x, max_count=6)[0].all()
    assert torch.equal(important_token_mask(x, 5, vocab_size=V), imp)


def test_adlm_anchor_loss_covers_every_important_position_with_a_plain_cross_entropy():
    """As released (LituRout/ADLM adlm_diffusion.py): every position whose token is important,
    masked or not, the anchor's row normalised with its mask column, weighted by lambda_t."""
    g = _gen(8)
    x = torch.tensor([[1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 3]] * 2)
    z_t = torch.where(torch.rand(x.shape, generator=g) < 0.5, x, MASK)
    t = torch.tensor([0.3, 0.8])
    logits = torch.randn(2, 12, V + 1, generator=g)
    loss = adlm_anchor_loss(logits, x, z_t, t, SCHED, MASK)
    ce = F.cross_entropy(logits.reshape(-1, V + 1), x.reshape(-1), reduction="none")
    sel = x != 1  # 1 occurs six times in each row: not an anchor; 2 (five times) and 3 are
    torch.testing.assert_close(loss, (ce.view(2, 12) * sel).sum(-1) / t)
    # the unmasked positions count: the loss does not depend on z_t
    torch.testing.assert_close(adlm_anchor_loss(logits, x, torch.full_like(x, MASK), t, SCHED, MASK), loss)
    # the old choice (masked rows only, SUBS normalisation) differs
    subs = F.cross_entropy(logits[..., :V].reshape(-1, V), x.reshape(-1), reduction="none").view(2, 12)
    assert not torch.allclose(loss, (subs * ((z_t == MASK) & sel)).sum(-1) / t)


# --------------------------------------------------------------------------- AR


def test_ar_nll_is_shifted_cross_entropy():
    g = _gen(9)
    x = torch.randint(V, (3, 10), generator=g)
    logits = torch.randn(3, 10, V, generator=g)
    ref = torch.stack([
        F.cross_entropy(logits[b, :-1], x[b, 1:], reduction="sum") for b in range(3)])
    torch.testing.assert_close(ar_nll(logits, x), ref)
    # a perfect next-token predictor scores 0
    perfect = torch.full((3, 10, V), float("-inf"))
    perfect[:, :-1] = torch.where(F.one_hot(x[:, 1:], V).bool(), 0.0, float("-inf"))
    perfect[:, -1] = 0.0
    assert torch.equal(ar_nll(perfect, x), torch.zeros(3))
