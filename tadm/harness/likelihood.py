"""Likelihoods of the pretraining models for lm-evaluation-harness (`tadm.harness.pretrain`).

A masked diffusion model has no exact likelihood; what it has is the continuous-time NELBO, an
upper bound on -log p, estimated by Monte Carlo over the diffusion time t and the masks. The
estimates here are the ones training and validation use (`tadm.losses`), restricted to the
positions a request scores:

- **a canvas** (:func:`canvas_nelbo`): ``x`` (L,) holds real tokens at the positions it knows and
  the mask id where it knows nothing (a tail that is never scored); ``scored`` (L,) marks the
  positions whose -log p is bounded. Each of the ``mc_num`` draws takes a time t (the
  antithetic, low-discrepancy times of `tadm.forward_process.sample_times`) and masks every
  scored position independently with probability 1 - alpha_t (`mask_tokens`' rule); the other
  known positions stay clean. The draw's bound is MDLM's ``lambda_t sum log x_theta(z_t)[x]``
  over the masked scored positions (`tadm.losses.mdlm_nelbo` on SUBS log-probabilities), or
  SEDD's score entropy (`tadm.losses.sedd_score_entropy`) for a SEDD network. With every
  position scored and no tail it is exactly the validation NELBO the trainer reports
  (`Method.nelbo`), per canvas.
- **the same bound by the number of masked tokens** (:func:`count_nelbo`, LLaDA's estimator in
  its ``eval_llada.py``): for a network that does not read t (none of Table 2's does) and
  alpha_t = 1 - t, integrating t out of the bound leaves, over the n scored positions,
  ``E_{k ~ U{1..n}} [(n / k) sum over k positions masked uniformly at random of -log
  x_theta(z)[x]]`` (the probability of exactly k masked, times lambda_t, integrates to 1 / k).
  Each draw masks exactly k >= 1 positions, so its weight is at most n, where a time draw near 0
  weighs 1 / t: far less Monte Carlo noise on a short continuation. The ``mc_num`` draws take
  k stratified over 1..n from one uniform start (``k_j = ((k_0 + j n / mc_num - 1) mod n) + 1``,
  rounded, as LLaDA does). Its expectation is the time bound's with MDLM's schedule epsilon set
  to 0 (1e-3 of the time range apart). Masked-diffusion networks only (not SEDD's score entropy).
- **a conditional likelihood** log p(continuation | context): the canvas ``[BOS, context,
  continuation, mask ...]`` with only the continuation scored: minus the mean of the draws.
- **a document** (rolling): the token stream ``tokens + EOS`` cut as the data pipeline cuts it
  (`tadm.data.packing.wrap`: pieces of L - 2 tokens, each ``[BOS, piece, EOS]``), every full
  canvas scored whole; the remainder, shorter than L - 2 tokens, is the canvas ``[BOS, rest,
  mask ...]`` scored on its first 1 + len(rest) positions (:func:`rolling_canvases`).

The network's logits on a noised canvas come from its method's `Method.canvas_logits` (TADM: a
fresh anchor on the same canvas, cache age 0, as its validation bound; ADLM: the denoiser's).
The AR model's likelihoods are exact (:func:`ar_continuation_logprob`, :func:`ar_canvas_logprob`).

Randomness: every draw comes from the generator passed in (`pretrain` seeds one per document),
so two continuations of one document see the same times and the same uniforms, and the
difference of their scores carries no Monte Carlo noise from different draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from tadm.forward_process import sample_times
from tadm.losses import mdlm_nelbo, sedd_score_entropy, subs_log_probs
from tadm.schedule import NoiseSchedule

EPS = 1e-3  # MDLM's schedule / time-sampling epsilon (tadm.methods.base.EPS)


@dataclass(frozen=True)
class Estimate:
    """A Monte Carlo NELBO: its mean (nats) and the standard error of the mean over the draws
    (the sample standard deviation / sqrt(draws); antithetic times make it conservative)."""

    nelbo: float
    se: float
    draws: int


def encode_pair(encode, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as LLaDA's harness wrapper splits them: trailing spaces of
    the context move onto the continuation, the pair is encoded whole and the continuation is
    what follows the encoded context, so a token straddling the boundary is not split twice.
    `encode(text)` -> ids without special tokens."""
    moved = len(context) - len(context.rstrip(" "))
    if moved:
        context, continuation = context[:-moved], context[-moved:] + continuation
    whole = encode(context + continuation)
    ctx = encode(context) if context else []
    if whole[:len(ctx)] != ctx:  # the tokenizer merged across the boundary: keep the context as encoded alone
        return ctx, encode(continuation)
    return ctx, whole[len(ctx):]


def rolling_canvases(tokens: list[int], seq_len: int, bos: int, eos: int, mask_id: int
                     ) -> list[tuple[list[int], int]]:
    """The canvases of a document (module docstring): [(canvas of seq_len ids, scored prefix
    length)], the full ones scored whole, the remainder's on BOS + its tokens."""
    body = seq_len - 2
    stream = [*tokens, eos]
    out = []
    full = len(stream) // body
    for i in range(full):
        out.append(([bos, *stream[i * body:(i + 1) * body], eos], seq_len))
    rest = stream[full * body:]
    if rest:
        canvas = [bos, *rest]
        out.append((canvas + [mask_id] * (seq_len - len(canvas)), len(canvas)))
    return out


def canvas_nelbo(logits_fn, x: Tensor, scored: Tensor, mask_id: int, schedule: NoiseSchedule, mc_num: int,
                 mc_batch: int, generator: torch.Generator, sedd: bool = False) -> Tensor:
    """The `mc_num` draws (mc_num,) float64 of the NELBO of the `scored` positions of canvas `x`
    (module docstring), `mc_batch` canvases per network call. `logits_fn(z)` (B, L) -> (B, L, V+1)."""
    device = x.device
    t_all = sample_times(mc_num, EPS, True, generator, device)
    u_all = torch.rand((mc_num, x.shape[0]), generator=generator, device=device)
    target = torch.where(x == mask_id, torch.zeros_like(x), x)  # the tail's targets are never read
    out = []
    for lo in range(0, mc_num, mc_batch):
        t, u = t_all[lo:lo + mc_batch], u_all[lo:lo + mc_batch]
        alpha = schedule.alpha(t)
        hide = scored.unsqueeze(0) & (u >= alpha.unsqueeze(-1))  # mask_tokens: keep with probability alpha_t
        z = torch.where(hide, torch.full_like(hide, mask_id, dtype=torch.long), x.unsqueeze(0))
        selected = torch.where(hide, z, target.unsqueeze(0))  # masked scored positions only
        xs = target.unsqueeze(0).expand_as(z)
        logits = logits_fn(z)
        if sedd:
            bound = sedd_score_entropy(logits, xs, selected, t, schedule, mask_id)
        else:
            bound = mdlm_nelbo(subs_log_probs(logits, z, mask_id), xs, selected, t, schedule, mask_id)
        out.append(bound.double())
    return torch.cat(out)


def count_nelbo(logits_fn, x: Tensor, scored: Tensor, mask_id: int, mc_num: int, mc_batch: int,
                generator: torch.Generator) -> Tensor:
    """The `mc_num` draws (mc_num,) float64 of the NELBO of the `scored` positions of canvas `x`
    by the number of masked positions (module docstring), `mc_batch` canvases per network call."""
    device = x.device
    where = scored.nonzero().squeeze(-1)  # (n,) the scored positions
    n = where.numel()
    start = float(torch.randint(1, n + 1, (), generator=generator, device=device))
    k_all = ((torch.round(start + torch.arange(mc_num, device=device, dtype=torch.float64) * n / mc_num).long() - 1)
             % n) + 1  # (mc_num,) in 1..n
    order = torch.rand((mc_num, n), generator=generator, device=device).argsort(-1)  # a uniform order per draw
    target = torch.where(x == mask_id, torch.zeros_like(x), x)  # the tail's targets are never read
    out = []
    for lo in range(0, mc_num, mc_batch):
        k, rank = k_all[lo:lo + mc_batch], order[lo:lo + mc_batch]
        hide_scored = torch.empty_like(rank, dtype=torch.bool).scatter_(-1, rank, torch.arange(n, device=device)
                                                                     .expand_as(rank) < k.unsqueeze(-1))
        hide = torch.zeros((k.numel(), x.shape[0]), dtype=torch.bool, device=device)
        hide[:, where] = hide_scored  # exactly k of the scored positions masked
        z = torch.where(hide, torch.full_like(hide, mask_id, dtype=torch.long), x.unsqueeze(0))
        logp = subs_log_probs(logits_fn(z), z, mask_id).double()  # (b, L, V+1)
        token = logp.gather(-1, target.unsqueeze(0).expand_as(z).unsqueeze(-1)).squeeze(-1)  # (b, L)
        nll = -torch.where(hide, token, torch.zeros_like(token)).sum(-1)  # (b,)
        out.append(nll * n / k.double())
    return torch.cat(out)


def summarise(draws: Tensor) -> Estimate:
    """The mean and standard error of NELBO draws."""
    n = draws.numel()
    se = float(draws.std(unbiased=True)) / math.sqrt(n) if n > 1 else float("nan")
    return Estimate(float(draws.mean()), se, n)


def ar_continuation_logprob(model, ids: list[int], n_cont: int, device) -> tuple[float, bool]:
    """log p(the last `n_cont` ids | the ids before them) under the causal model, exactly, and
    whether greedy decoding would have produced them (every token the argmax)."""
    x = torch.tensor([ids], dtype=torch.long, device=device)
    logits = model(x[:, :-1]).double()
    logp = torch.log_softmax(logits[0, -n_cont:], dim=-1)
    cont = x[0, -n_cont:]
    total = float(logp.gather(-1, cont.unsqueeze(-1)).sum())
    return total, bool((logp.argmax(-1) == cont).all())


def ar_canvas_logprob(model, ids: list[int], device) -> float:
    """log p(ids[1:] | ids[0]) under the causal model (`tadm.losses.ar_nll`'s positions)."""
    x = torch.tensor([ids], dtype=torch.long, device=device)
    logp = torch.log_softmax(model(x[:, :-1]).double(), dim=-1)
    return float(logp[0].gather(-1, x[0, 1:].unsqueeze(-1)).sum())


__all__ = ["EPS", "Estimate", "ar_canvas_logprob", "ar_continuation_logprob", "canvas_nelbo", "count_nelbo", "encode_pair",
           "rolling_canvases", "summarise"]
