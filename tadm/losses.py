"""Training objectives: MDLM NELBO, TADM's T-ANELBO, ADLM's anchor loss, SEDD, AR.

Every loss is a pure function of logits / log-probs and targets and returns a per-sequence
tensor (B,) summed over positions; callers average over the batch and normalise per token.
Conventions: token ids 0..V-1, mask id `mask_id = V`, logits (B, L, V+1); x, z_t (B, L) long;
t (B,) float. Losses are computed in `dtype` (float32 by default) whatever the logits' dtype.

Paper notation: lambda_t = alpha'_t / (1 - alpha_t) < 0 is the continuous-time NELBO weight
(`NoiseSchedule.nelbo_weight`), so -lambda_t log p >= 0 is a positive loss, written below as
lambda_t * log p (both factors negative).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from tadm.forward_process import StalePair
from tadm.schedule import NoiseSchedule


def _log_softmax_without_mask(logits: Tensor, mask_id: int, dtype: torch.dtype) -> Tensor:
    """log-softmax over the vocabulary with the mask logit (if present) set to -inf."""
    logits = logits.to(dtype)
    if logits.shape[-1] > mask_id:
        is_mask = torch.arange(logits.shape[-1], device=logits.device) == mask_id
        logits = logits.masked_fill(is_mask, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def _log_prob_of(log_probs: Tensor, x: Tensor) -> Tensor:
    """log p(x^l) for every position: (B, L, C) gathered at x (B, L) -> (B, L)."""
    return log_probs.gather(-1, x.unsqueeze(-1)).squeeze(-1)


def _nelbo_weight(schedule: NoiseSchedule, t: Tensor, dtype: torch.dtype) -> Tensor:
    """lambda_t evaluated in the loss precision (t is cast first, not the result)."""
    return schedule.nelbo_weight(t.to(dtype))


def _weighted_masked_sum(log_p: Tensor, weight: Tensor, selected: Tensor) -> Tensor:
    """sum_l [selected^l] weight * log_p^l -> (B,); unselected terms are exact zeros.

    `where` (not a product) so a -inf log-prob at an unselected position cannot give NaN.
    """
    terms = torch.where(selected, log_p, torch.zeros_like(log_p))
    return weight * terms.sum(-1)


# --------------------------------------------------------------------------- MDLM


def subs_log_probs(
    logits: Tensor, z_t: Tensor, mask_id: int, dtype: torch.dtype = torch.float32
) -> Tensor:
    """MDLM's SUBS parameterisation of x_theta(z_t) as log-probabilities (B, L, V+1).

    Zero masking: the mask logit is -inf, so x_theta never puts mass on m.
    Carry-over unmasking: where z_t^l != m the prediction is the point mass on z_t^l
    (log-prob 0 there, -inf elsewhere). Built with `where`, so no NaN in value or gradient.
    """
    log_probs = _log_softmax_without_mask(logits, mask_id, dtype)
    carry = F.one_hot(z_t, log_probs.shape[-1]).bool()
    point_mass = torch.zeros((), dtype=dtype, device=logits.device)
    point_mass = torch.where(carry, point_mass, float("-inf"))
    is_masked = (z_t == mask_id).unsqueeze(-1)
    return torch.where(is_masked, log_probs, point_mass)


def mdlm_nelbo(
    log_probs: Tensor,
    x: Tensor,
    z_t: Tensor,
    t: Tensor,
    schedule: NoiseSchedule,
    mask_id: int,
) -> Tensor:
    """Continuous-time MDLM NELBO for one draw of t, per sequence (B,):

        L(x) = sum_l [z_t^l = m] * lambda_t * log <x_theta^l(z_t), x^l>,
        lambda_t = alpha'_t / (1 - alpha_t).

    Its expectation over t ~ U(0, 1), z_t ~ q(z_t | x) is the T -> inf limit of the
    discrete-time bound (App. B.1.1); a perfect predictor gives 0.
    """
    log_p = _log_prob_of(log_probs, x)
    return _weighted_masked_sum(log_p, _nelbo_weight(schedule, t, log_p.dtype), z_t == mask_id)


# --------------------------------------------------------------------------- anchors


def anchor_cross_entropy(
    anchor_logits: Tensor,
    x: Tensor,
    z_tprime: Tensor,
    t_prime: Tensor,
    schedule: NoiseSchedule,
    mask_id: int,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """TADM's anchor term of the T-ANELBO (Thm 5.1), per sequence (B,):

        sum_l [z_t'^l = m] * lambda_t' * log <y_A^l(z_t'), y^l>,

    with anchor targets y = the clean tokens x at the positions masked in z_t' (Sec. 5), the
    anchor head's distribution y_A over the vocabulary (mask logit excluded), and the NELBO
    weight taken at the stale time t'.
    """
    log_probs = _log_softmax_without_mask(anchor_logits, mask_id, dtype)
    log_p = _log_prob_of(log_probs, x)
    weight = _nelbo_weight(schedule, t_prime, dtype)
    return _weighted_masked_sum(log_p, weight, z_tprime == mask_id)


def t_anelbo(
    denoiser_log_probs: Tensor,
    anchor_logits: Tensor | None,
    x: Tensor,
    pair: StalePair,
    schedule: NoiseSchedule,
    mask_id: int,
    gamma: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """T-ANELBO (Thm 5.1 with sigma_t = 0, continuous time), per sequence (B,):

        L = sum_l lambda_t log <x_theta^l(z_t, z_t'), x^l>            (MDLM NELBO at (z_t, t))
            + gamma * sum_l lambda_t' log <y_A^l(z_t'), y^l>           (anchor term at t').

    `denoiser_log_probs` are SUBS log-probs of x_theta(z_t, z_t'). gamma = 0 is TADM-dagger:
    the anchor logits are not read at all (may be None), so no gradient reaches an anchor head.
    Returns (total, {"nelbo": ..., "anchor": ...}).
    """
    nelbo = mdlm_nelbo(denoiser_log_probs, x, pair.z_t, pair.t, schedule, mask_id)
    if gamma == 0:
        anchor = torch.zeros_like(nelbo)
        return nelbo, {"nelbo": nelbo, "anchor": anchor}
    if anchor_logits is None:
        raise ValueError("t_anelbo: gamma > 0 needs anchor_logits")
    anchor = anchor_cross_entropy(anchor_logits, x, pair.z_tprime, pair.t_prime, schedule, mask_id)
    return nelbo + gamma * anchor, {"nelbo": nelbo, "anchor": anchor}


def important_token_mask(x: Tensor, max_count: int = 5, vocab_size: int | None = None) -> Tensor:
    """ADLM's important tokens: bool (B, L), True where x^l occurs <= max_count times in x.

    Counts are per sequence (a token repeated more often, e.g. punctuation or "the", is not
    an anchor). `vocab_size` sizes the count table; inferred from x when None.
    """
    size = int(x.max().item()) + 1 if vocab_size is None else vocab_size
    counts = torch.zeros(x.shape[0], size, dtype=torch.long, device=x.device)
    counts.scatter_add_(1, x, torch.ones_like(x))
    return counts.gather(1, x) <= max_count


def adlm_anchor_loss(
    anchor_logits: Tensor,
    x: Tensor,
    z_t: Tensor,
    t: Tensor,
    schedule: NoiseSchedule,
    mask_id: int,
    max_count: int = 5,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """ADLM's anchor loss (fresh anchor, t' = t), per sequence (B,):

        sum_l [z_t^l = m and x^l important] * lambda_t * log <y_A^l(z_t), x^l>,

    important = occurs at most `max_count` times in its sequence (ADLM).
    """
    log_probs = _log_softmax_without_mask(anchor_logits, mask_id, dtype)
    log_p = _log_prob_of(log_probs, x)
    selected = (z_t == mask_id) & important_token_mask(x, max_count, log_probs.shape[-1])
    return _weighted_masked_sum(log_p, _nelbo_weight(schedule, t, dtype), selected)


# --------------------------------------------------------------------------- SEDD


def sedd_log_scores(logits: Tensor, mask_id: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """SEDD's unnormalised log scores l (mask column dropped) from network logits, offset by
    -log V as SEDD offsets by -log(V-1): a zero-initialised network then starts at the
    uniform score sum_y e^{l_y} = 1 instead of V. The concrete score is e^{l_y} * r_t."""
    logits = logits.to(dtype)
    if logits.shape[-1] > mask_id:
        logits = logits[..., :mask_id]
    return logits - math.log(logits.shape[-1])


def sedd_score_entropy(
    logits: Tensor,
    x: Tensor,
    z_t: Tensor,
    t: Tensor,
    schedule: NoiseSchedule,
    mask_id: int,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """SEDD's score-entropy loss for absorbing diffusion, per sequence (B,).

    Derivation. From a masked state z_t^l = m the forward rate matrix jumps to every y in the
    vocabulary at rate dsigma(t) (absorbing Q), so the diffusion-weighted score entropy is

        dsigma(t) * sum_y [ s_y - r_y log s_y + K(r_y) ],   K(a) = a (log a - 1),

    with the true concrete score r_y = q_t(y | x) / q_t(m | x) = [y = x] * alpha_t/(1-alpha_t).
    Terms with r_y = 0 reduce to s_y (K(0) = 0), leaving, with r = alpha_t / (1 - alpha_t),

        dsigma(t) * [ sum_y s_y - r log s_x + r (log r - 1) ].

    Parameterisation (SEDD's "scale by sigma"): l = sedd_log_scores(logits) are *unnormalised*
    log scores up to the known factor, log s_y = l_y + log r. The bracket is
    then exactly
        r * [ sum_y exp(l_y) - l_x - 1 ],
    evaluated in that form to avoid cancelling the large r log r terms (r ~ 1/eps at small t).
    It is >= 0 and 0 iff exp(l) is the one-hot of x; at the optimum exp(l_y) = p(x0 = y | z_t).
    Because sum_y e^{l_y} - 1 - l_x >= logsumexp(l) - l_x and dsigma * r = -alpha'/(1 - alpha),
    it upper-bounds the MDLM NELBO of softmax(l), with equality iff the logits are normalised:
    SEDD learns the normalisation, MDLM imposes it. Unmasked positions contribute 0.
    """
    logits = sedd_log_scores(logits, mask_id, dtype)
    t = t.to(dtype)
    r = schedule.alpha(t) / schedule.one_minus_alpha(t)
    total_score = torch.exp(torch.logsumexp(logits, dim=-1))  # sum_y exp(l_y)
    bracket = total_score - _log_prob_of(logits, x) - 1.0
    weight = schedule.dsigma(t) * r
    masked = z_t == mask_id
    terms = torch.where(masked, bracket, torch.zeros_like(bracket))
    return weight * terms.sum(-1)


# --------------------------------------------------------------------------- AR


def ar_nll(logits: Tensor, x: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Autoregressive NLL per sequence (B,): -sum_{l>=1} log p(x^{l+1} | x^{<=l}).

    logits[:, l] predicts x[:, l + 1]; the first token is not scored.
    """
    pred = logits[:, :-1].to(dtype)
    target = x[:, 1:]
    nll = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1), reduction="none")
    return nll.view(target.shape).sum(-1)
