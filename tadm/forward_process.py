"""Forward (noising) processes: absorbing-state masking, TADM's stale pair, uniform-state.

Conventions: token ids 0..V-1, absorbing mask id `mask_id = V`; x, z_t are LongTensor (B, L);
t and alpha_t are per-sample tensors (B,) broadcast over positions. Every random draw comes
from the `generator` argument (a `torch.Generator` on the tensors' device), so a seed fixes
the whole draw.

Absorbing (paper Sec. 2.1 with pi = m):   q(z_t^l | x) = Cat(alpha_t x^l + (1 - alpha_t) m).
TADM stale state (paper Eq. 15, t' >= t): q(z_t'^l | z_t^l) = Cat(alpha_t'/alpha_t z_t^l
                                                              + (1 - alpha_t'/alpha_t) m).
Uniform-state (App. B.1.2, pi = 1/V):      q(z_t^l | x) = Cat(alpha_t x^l + (1 - alpha_t) 1/V).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tadm.runtime import CPU

from tadm.schedule import NoiseSchedule

# App. C.2: anchor refresh intervals K and sampling-step budgets T drawn during pretraining.
PAPER_REFRESH_CHOICES: tuple[int, ...] = (1, 2, 4, 8)
PAPER_BUDGET_CHOICES: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096)


def _per_sample(a: Tensor | float, like: Tensor) -> Tensor:
    """View a per-sample quantity (B,) (or a scalar) so it broadcasts against `like` (B, ...)."""
    a = torch.as_tensor(a, device=like.device)
    if a.dim() == 0:
        return a
    return a.reshape(a.shape[0], *([1] * (like.dim() - 1)))


# --------------------------------------------------------------------------- times


def sample_times(
    batch: int,
    eps: float,
    antithetic: bool,
    generator: torch.Generator,
    device: torch.device | str = CPU,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Diffusion times t in [eps, 1), shape (batch,).

    Antithetic (MDLM's low-discrepancy sampler): one draw u0 ~ U[0, 1) shared by the batch,
        u_i = (u0 + i / B) mod 1,   i = 0..B-1,
    so the B times fall one in each stratum [j/B, (j+1)/B) of [0, 1) (a randomly shifted
    grid). Otherwise u_i ~ U[0, 1) i.i.d. Then t_i = eps + (1 - eps) u_i, which maps [0, 1)
    onto [eps, 1); it is clamped below 1 so rounding cannot return t = 1.

    This differs from MDLM's release (kuleshov-group/mdlm ``diffusion.py: _sample_t``), which
    jitters each stratum independently, u_i = (i + v_i) / B with v_i ~ U[0, 1) i.i.d.: both put
    one time in each stratum, here with the same offset in every stratum. On the default MDLM
    at train.micro_batch the per-batch loss's variance under this form is 0.96 +- 0.03 times the
    release's (95 % interval 0.91-1.02; `benchmarks/antithetic_variance.py`, results in
    `benchmarks/results/antithetic_variance.md`), so it is kept: changing it would move every
    trained model of the default pipeline (docs/deviations.md).
    """
    if antithetic:
        u0 = torch.rand(1, generator=generator, device=device, dtype=dtype)
        grid = torch.arange(batch, device=device, dtype=dtype) / batch
        u = torch.remainder(u0 + grid, 1.0)
    else:
        u = torch.rand(batch, generator=generator, device=device, dtype=dtype)
    t = eps + (1.0 - eps) * u
    # the largest value below 1 in `dtype` (binary floating point: 1 - eps / 2), a host constant
    return t.clamp(max=1.0 - torch.finfo(dtype).eps / 2)


# a gather of masked rows larger than its capacity: at most this probability per draw
CAPACITY_FAILURE = 1e-15


def masked_rows_capacity(batch: int, seq_len: int, eps: float, shift: float = 0.0,
                         failure: float = CAPACITY_FAILURE) -> int:
    """A row count that the masked positions of one batch drawn with `sample_times` (antithetic)
    and `mask_tokens` exceed with probability at most `failure`: the fixed size of a training
    readout's gather (tadm.losses.Readout), known before the draw, so no host read of N.

    Position l of sequence i is masked with probability p_i = (1 - eps) t_i <= t_i, independently
    given t. Antithetic times put one u_i in each stratum [j/B, (j+1)/B): sum_i u_i < (B+1)/2, so
    sum_i t_i < (B+1)/2 + B eps, and with a stale shift (TADM's t' <= t + `shift`) each p_i grows by
    at most `shift`: E[N | t] <= mu = L min(B, (B+1)/2 + B (eps + shift)). Given t the B L draws
    are independent, and Hoeffding's inequality bounds P(N >= E[N | t] + a) <= exp(-2 a^2 / (B L)),
    so a = sqrt(B L ln(1/failure) / 2) above mu fails with probability <= `failure` whatever t.
    Capped at B L. Paper profile (B = 16, L = 1024): 9,253 rows against a mean of 8,192; the
    default profile (B = 32, L = 64): 1,247 of 2,048."""
    if batch < 1 or seq_len < 1:
        raise ValueError(f"masked_rows_capacity needs a positive batch and seq_len, got {batch} and {seq_len}")
    if not 0.0 < failure < 1.0:
        raise ValueError(f"masked_rows_capacity: failure must lie in (0, 1), got {failure}")
    total = batch * seq_len
    mean = seq_len * min(batch, (batch + 1) / 2 + batch * (eps + shift))
    return min(total, math.ceil(mean + math.sqrt(total * math.log(1.0 / failure) / 2)))


def stale_times(
    t: Tensor,
    refresh_choices: Sequence[int],
    budget_choices: Sequence[int],
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """TADM's stale anchor time (App. C.2), drawn independently per sample.

    K ~ U{refresh_choices} (anchor refresh interval), T ~ U{budget_choices} (step budget),
    k ~ U{0, ..., K-1} (cache age), and t' = min(1, t + k / T) >= t.
    Returns (t_prime, k, K, T); t_prime is shaped and typed like t, k, K, T are LongTensor.
    """
    if len(refresh_choices) == 0 or len(budget_choices) == 0:
        raise ValueError("refresh_choices and budget_choices must be non-empty")
    batch, device = t.shape[0], t.device
    refresh = torch.as_tensor(list(refresh_choices), dtype=torch.long, device=device)
    budget = torch.as_tensor(list(budget_choices), dtype=torch.long, device=device)
    K = refresh[torch.randint(len(refresh), (batch,), generator=generator, device=device)]
    T = budget[torch.randint(len(budget), (batch,), generator=generator, device=device)]
    # k = floor(u K) is uniform on {0..K-1}; the clamp guards against u K rounding up to K.
    u = torch.rand(batch, generator=generator, device=device, dtype=torch.float64)
    k = torch.minimum(torch.floor(u * K).long(), K - 1)
    t_prime = torch.clamp(t + k.to(t.dtype) / T.to(t.dtype), max=1.0)
    return t_prime, k, K, T


# --------------------------------------------------------------------------- absorbing state


def mask_tokens(
    x: Tensor, alpha_t: Tensor | float, mask_id: int, generator: torch.Generator
) -> Tensor:
    """Sample z_t ~ q(z_t | x) = Cat(alpha_t x + (1 - alpha_t) m), independently per token.

    Each token is kept with probability alpha_t (per sample, broadcast over L), else it
    becomes `mask_id`.
    """
    u = torch.rand(x.shape, generator=generator, device=x.device)
    keep = u < _per_sample(alpha_t, x)
    return torch.where(keep, x, torch.full_like(x, mask_id))


def remask_towards(
    z_t: Tensor,
    alpha_t: Tensor | float,
    alpha_tprime: Tensor | float,
    mask_id: int,
    generator: torch.Generator,
) -> Tensor:
    """Sample z_t' ~ q(z_t' | z_t) (paper Eq. 15) for t' >= t.

    q(z_t'^l | z_t^l) = Cat(alpha_t'/alpha_t z_t^l + (1 - alpha_t'/alpha_t) m): each
    still-unmasked token is masked with probability 1 - alpha_t'/alpha_t, masked tokens stay
    masked. Composed with q(z_t | x) this gives exactly q(z_t' | x) (kept w.p. alpha_t').
    """
    ratio = (_per_sample(alpha_tprime, z_t) / _per_sample(alpha_t, z_t)).clamp(0.0, 1.0)
    u = torch.rand(z_t.shape, generator=generator, device=z_t.device)
    keep = u < ratio  # a masked token stays masked whether kept or not
    return torch.where(keep, z_t, torch.full_like(z_t, mask_id))


@dataclass
class StalePair:
    """One TADM training draw: current state z_t and the staler anchor state z_t' (t' >= t)."""

    z_t: Tensor  # (B, L) long
    z_tprime: Tensor  # (B, L) long, masked wherever z_t is masked
    t: Tensor  # (B,) float
    t_prime: Tensor  # (B,) float, min(1, t + k/T)
    k: Tensor  # (B,) long, cache age in 0..K-1
    K: Tensor  # (B,) long, anchor refresh interval
    T: Tensor  # (B,) long, sampling-step budget


def stale_pair(
    x: Tensor,
    t: Tensor,
    schedule: NoiseSchedule,
    mask_id: int,
    refresh_choices: Sequence[int],
    budget_choices: Sequence[int],
    generator: torch.Generator,
) -> StalePair:
    """Draw (z_t, z_t') for the T-ANELBO (Sec. 5, App. C.2).

    z_t ~ q(z_t | x); (t', k, K, T) ~ stale_times(t); z_t' ~ q(z_t' | z_t) (Eq. 15).
    The paper's choices are PAPER_REFRESH_CHOICES and PAPER_BUDGET_CHOICES.
    """
    z_t = mask_tokens(x, schedule.alpha(t), mask_id, generator)
    t_prime, k, K, T = stale_times(t, refresh_choices, budget_choices, generator)
    z_tprime = remask_towards(z_t, schedule.alpha(t), schedule.alpha(t_prime), mask_id, generator)
    return StalePair(z_t=z_t, z_tprime=z_tprime, t=t, t_prime=t_prime, k=k, K=K, T=T)


# --------------------------------------------------------------------------- uniform state


def uniform_forward(
    x: Tensor, alpha_t: Tensor | float, vocab_size: int, generator: torch.Generator
) -> Tensor:
    """Sample z_t ~ Cat(alpha_t x + (1 - alpha_t) pi) with pi = 1/V (App. B.1.2).

    Each token is kept w.p. alpha_t, else replaced by a token drawn uniformly from 0..V-1
    (which may be the clean token itself, so P(z_t = x) = alpha_t + (1 - alpha_t)/V).
    """
    u = torch.rand(x.shape, generator=generator, device=x.device)
    noise = torch.randint(vocab_size, x.shape, generator=generator, device=x.device)
    return torch.where(u < _per_sample(alpha_t, x), x, noise)


def uniform_posterior(
    z_t: Tensor,
    x_probs: Tensor,
    alpha_s: Tensor | float,
    alpha_t: Tensor | float,
    vocab_size: int,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """q(z_s | z_t, x) for uniform-state diffusion, with x given as a distribution (B, L, V).

    From the general posterior (Sec. 2.1) with pi = 1/V, pi^T z_t = 1/V, alpha_{t|s} =
    alpha_t / alpha_s:
        q(z_s = j | z_t, x) prop. to [alpha_{t|s} [j = z_t] + (1 - alpha_{t|s}) / V]
                                      * [alpha_s x_j + (1 - alpha_s) / V].
    Summing over j (with sum_j x_j = 1) gives the normaliser
        alpha_t x_{z_t} + (alpha_{t|s} (1 - alpha_s) + 1 - alpha_{t|s}) / V
      = alpha_t x_{z_t} + (1 - alpha_t) / V,
    which is App. B.1.2's denominator divided by V. With x one-hot this is the exact posterior;
    with x = x_theta(z_t) it is the reverse transition p_theta(z_s | z_t). Requires s <= t.
    Computed in `dtype` (use float64 for sampling).
    """
    probs = x_probs.to(dtype)
    a_s = _per_sample(alpha_s, probs).to(dtype)
    a_t = _per_sample(alpha_t, probs).to(dtype)
    a_ts = a_t / a_s
    z_onehot = torch.nn.functional.one_hot(z_t, vocab_size).to(dtype)
    from_zt = a_ts * z_onehot + (1.0 - a_ts) / vocab_size
    from_x = a_s * probs + (1.0 - a_s) / vocab_size
    x_at_zt = probs.gather(-1, z_t.unsqueeze(-1))
    normaliser = a_t * x_at_zt + (1.0 - a_t) / vocab_size
    return from_zt * from_x / normaliser
