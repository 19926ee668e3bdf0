"""Training objectives: MDLM NELBO, TADM's T-ANELBO, ADLM's anchor loss, SEDD, AR.

Every loss is a pure function of logits / log-probs and targets and returns a per-sequence
tensor (B,) summed over positions; callers average over the batch and normalise per token.
Conventions: token ids 0..V-1, mask id `mask_id = V`, logits (B, L, V+1); x, z_t (B, L) long;
t (B,) float. Losses are computed in `dtype` (float32 by default) whatever the logits' dtype.

Paper notation: lambda_t = alpha'_t / (1 - alpha_t) < 0 is the continuous-time NELBO weight
(`NoiseSchedule.nelbo_weight`), so -lambda_t log p >= 0 is a positive loss, written below as
lambda_t * log p (both factors negative).

Two implementations of the same objectives:

- On full logits (``subs_log_probs`` + ``mdlm_nelbo``, ``anchor_cross_entropy``, ...): the
  definitions, used by the samplers and kept as the reference the fast path is tested against.
- On scored rows only (``Readout`` and the ``*_rows`` / ``*_readout`` functions, used for
  training and validation): every objective here reads only some positions (SUBS puts a point
  mass on unmasked positions, so they contribute exactly 0), so the model gathers the hidden
  states of those rows, (N, d), and runs its LM head and a cross-entropy on them in chunks of
  ~CHUNK_ELEMENTS logits: no (B, L, V+1) tensor is built. A readout made with ``checkpoint``
  runs each chunk under non-reentrant activation checkpointing (once the rows' logits reach
  CHECKPOINT_MIN_ELEMENTS), so backward keeps no chunk's logits and recomputes one chunk's head
  at a time; the trainer asks for that only where the memory estimate with every logit kept
  does not fit (``Method.checkpoint_heads``, ``memory_estimate.require_training``). The per-row
  values are placed back at their positions of a (B, L) zero tensor and summed over positions,
  as the reference sums, so the two agree to float rounding.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint as _checkpoint

from tadm.forward_process import StalePair
from tadm.memory_estimate import HEAD_CHUNK_ELEMENTS
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


# --------------------------------------------------------------------------- scored rows only

CHUNK_ELEMENTS = HEAD_CHUNK_ELEMENTS  # logits per chunk: 667 rows at V+1 = 50258 (128 MiB in fp32)
# Checkpoint only when the rows' logits are at least this many values (4 MiB in fp32): below,
# keeping them costs nothing worth a recomputation (and checkpointing's fixed overhead is ~20%
# of a micro-profile training step).
CHECKPOINT_MIN_ELEMENTS = 1 << 20


def chunk_rows(n_cols: int) -> int:
    """Rows per chunk so that one chunk's logits hold about CHUNK_ELEMENTS values."""
    return max(1, CHUNK_ELEMENTS // max(1, n_cols))


def _piece(h: Tensor, y: Tensor, head: Callable[[Tensor], Tensor] | None,
           row_loss: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """One chunk: row_loss(head(h), y) (h already logits when head is None)."""
    return row_loss(h if head is None else head(h), y)


_COMPILED: dict[str, Callable] = {}


def compiled_piece(backend: str) -> Callable:
    """`_piece` under torch.compile with `backend` (one compiled function per backend, shared by
    every readout): the head's linear map, the cast, the log-softmax, the target's gather and
    their backward as one graph per chunk shape. The readouts' gathers have fixed sizes, so a run
    sees a few chunk shapes (a full chunk and each readout's last one), each compiled once."""
    if backend not in _COMPILED:
        _COMPILED[backend] = torch.compile(_piece, backend=backend, fullgraph=True, dynamic=False)
    return _COMPILED[backend]


def row_losses(
    h_rows: Tensor,
    targets: Tensor,
    head: Callable[[Tensor], Tensor] | None,
    row_loss: Callable[[Tensor, Tensor], Tensor],
    n_cols: int,
    checkpoint: bool = True,
    compile: str | None = None,
) -> Tensor:
    """row_loss(head(h_rows), targets) -> (N,), computed chunk_rows(n_cols) rows at a time.

    h_rows (N, d) are hidden states (or logits already, with head=None), targets (N,) ids,
    n_cols the head's output width. While autograd records and the N rows' logits would hold
    at least CHECKPOINT_MIN_ELEMENTS values, each chunk runs under non-reentrant activation
    checkpointing: the forward keeps only the chunk's inputs and backward recomputes that
    chunk's logits, so at most one chunk's logits (and softmax) are alive at any time, at the
    price of one more head forward per row. Non-reentrant, so the whole step stays one
    autograd graph and each parameter's gradient is accumulated once (what DDP's hooks expect).
    The chunks are one `split` (its backward concatenates the chunks' gradients once, no
    per-chunk full-size zeros), and there is always at least one chunk, possibly empty, so the
    head is in the graph even when no row scores. `compile` (a torch.compile backend, or None):
    each chunk runs `compiled_piece(compile)` instead of the eager ops.
    """
    piece = _piece if compile is None else compiled_piece(compile)
    chunk = chunk_rows(n_cols)
    record = checkpoint and torch.is_grad_enabled() and h_rows.shape[0] * n_cols >= CHECKPOINT_MIN_ELEMENTS
    out = [
        _checkpoint(piece, h, y, head, row_loss, use_reentrant=False, preserve_rng_state=False) if record
        else piece(h, y, head, row_loss)
        for h, y in zip(h_rows.split(chunk), targets.split(chunk))
    ]
    return out[0] if len(out) == 1 else torch.cat(out)


class Readout:
    """What a model computes in place of its logits in training and validation: the
    per-sequence sum (B,) of a per-row loss over the rows that score.

    ``model(z_t, readout=r)`` returns ``r(h, head)``: the hidden states h (B, L, d) are
    gathered at the scored rows, then the head and ``row_loss`` run on them chunk by chunk
    (:func:`row_losses`); the values go back to their positions in a (B, L) zero tensor, summed
    over L like the full-logits reference. It is called inside the model's forward, so a
    DDP-wrapped model sees its head used through its own forward. A plain class (not a
    dataclass), so DDP passes it to forward unchanged.

    No host sync: the number N of scored rows is random, so the gather has a fixed size,
    ``capacity`` rows (None: all B L rows, no gather). A stable sort puts the scored rows first,
    in position order, and the first ``capacity`` positions are gathered; rows past N are
    computed and given weight 0 (exact zeros, no gradient). The capacity is a bound N exceeds
    with negligible probability (`tadm.forward_process.masked_rows_capacity`); should N exceed it
    anyway, every sequence's sum is NaN (never a sum over fewer rows) and ``excess`` (a device
    scalar, rows past the capacity) says why: the trainer reads it with its periodic checks.
    """

    def __init__(self, rows: Tensor, targets: Tensor, row_loss: Callable[[Tensor, Tensor], Tensor],
                 n_cols: int, checkpoint: bool = True, capacity: int | None = None, compile: str | None = None):
        if capacity is not None and capacity < 1:
            raise ValueError(f"readout capacity must be a positive number of rows, got {capacity}")
        self.rows = rows  # bool (B, L)
        self.row_loss = row_loss
        self.n_cols = n_cols
        self.checkpoint = checkpoint
        self.compile = compile  # the chunks' torch.compile backend (`row_losses`); None: eager
        flat = rows.reshape(-1)
        if capacity is None or capacity >= flat.numel():  # every row: no gather, no overflow
            self.index, self.excess = None, None
            self.scored, self.targets = flat, targets.reshape(-1)
        else:
            # the scored rows first, each group in position order: the first N entries are the
            # rows a boolean mask would select, in its order
            self.index = torch.argsort(flat, descending=True, stable=True)[:capacity]  # (C,)
            self.scored = flat[self.index]  # (C,) True for the first min(N, C)
            self.targets = targets.reshape(-1)[self.index]
            self.excess = (flat.sum() - capacity).clamp(min=0)  # 0-dim long, on the device

    def __call__(self, h: Tensor, head: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """h (B, L, ...) -> (B,): sum over the rows of row_loss(head(h^l), target^l)."""
        if tuple(h.shape[:2]) != tuple(self.rows.shape):
            raise ValueError(f"readout over rows {tuple(self.rows.shape)} got states of shape {tuple(h.shape)}")
        flat = h.reshape(-1, *h.shape[2:])
        picked = flat if self.index is None else flat.index_select(0, self.index)
        values = row_losses(picked, self.targets, head, self.row_loss, self.n_cols, self.checkpoint, self.compile)
        values = torch.where(self.scored, values, values.new_zeros(()))
        if self.index is not None:  # back to the rows' positions
            values = values.new_zeros(flat.shape[0]).index_copy(0, self.index, values)
        sums = values.view(self.rows.shape).sum(-1)
        if self.excess is not None:  # more scored rows than the capacity: no value at all
            sums = torch.where(self.excess > 0, sums.new_full((), float("nan")), sums)
        return sums


def _subs_cross_entropy(logits: Tensor, target: Tensor, mask_id: int, dtype: torch.dtype) -> Tensor:
    """-log x_theta[target] at masked rows: cross-entropy over the vocabulary with the mask
    logit excluded (SUBS zero masking; the column is dropped rather than set to -inf)."""
    return F.cross_entropy(logits[..., :mask_id].to(dtype), target, reduction="none")


def subs_readout(z_t: Tensor, x: Tensor, mask_id: int, dtype: torch.dtype = torch.float32,
                 checkpoint: bool = True, capacity: int | None = None, compile: str | None = None) -> Readout:
    """-sum_l [z_t^l = m] log x_theta^l[x^l] per sequence: the rows masked in z_t (under SUBS
    every other row is a point mass on its own token, log-prob 0), targets x, at most
    `capacity` of them gathered (`Readout`). Also the anchor cross-entropy's rows when given
    z_t' (TADM)."""
    return Readout(z_t == mask_id, x, functools.partial(_subs_cross_entropy, mask_id=mask_id, dtype=dtype),
                   mask_id + 1, checkpoint, capacity, compile)


def nelbo_from_rows(ce_sum: Tensor, t: Tensor, schedule: NoiseSchedule) -> Tensor:
    """lambda_t * sum_l log p^l (the `mdlm_nelbo` / `anchor_cross_entropy` value) from the
    per-sequence cross-entropy sum -sum_l log p^l of a :func:`subs_readout`."""
    return -_nelbo_weight(schedule, t, ce_sum.dtype) * ce_sum


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


def t_anelbo_rows(
    nelbo_ce: Tensor,
    anchor_ce: Tensor | None,
    pair: StalePair,
    schedule: NoiseSchedule,
    gamma: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`t_anelbo` from scored rows: `nelbo_ce` from subs_readout(z_t, x) on the denoiser,
    `anchor_ce` from subs_readout(z_t', x) on the anchor head (not read when gamma = 0)."""
    nelbo = nelbo_from_rows(nelbo_ce, pair.t, schedule)
    if gamma == 0:
        return nelbo, {"nelbo": nelbo, "anchor": torch.zeros_like(nelbo)}
    if anchor_ce is None:
        raise ValueError("t_anelbo_rows: gamma > 0 needs the anchor rows' cross-entropy")
    anchor = nelbo_from_rows(anchor_ce, pair.t_prime, schedule)
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
    """ADLM's anchor loss (fresh anchor, t' = t), per sequence (B,), as released:

        sum_l [x^l important] * lambda_t * log softmax(y_A^l(z_t))[x^l],

    important = occurs at most `max_count` times in its sequence. Released code (LituRout/ADLM,
    `adlm_diffusion.py`, `_forward_pass_diffusion`): the anchor term is added to log p_theta at
    every position under `anchor_mask` (masked *and* unmasked: the visible anchors are
    supervised too), the anchor's raw output normalised over the whole row (the mask column
    included: no SUBS), and the sum weighted by the same dsigma / expm1(sigma) = lambda_t as
    the NELBO. `z_t` is unused (kept so that the call matches the other per-draw losses).
    """
    del z_t
    log_probs = torch.log_softmax(anchor_logits.to(dtype), dim=-1)
    log_p = _log_prob_of(log_probs, x)
    selected = important_token_mask(x, max_count, log_probs.shape[-1])
    return _weighted_masked_sum(log_p, _nelbo_weight(schedule, t, dtype), selected)


def adlm_anchor_readout(z_t: Tensor, x: Tensor, mask_id: int, max_count: int = 5,
                        dtype: torch.dtype = torch.float32, compile: str | None = None) -> Readout:
    """`adlm_anchor_loss`'s rows (every position whose token x^l is important, plain
    cross-entropy over the whole row) as a readout of the anchor logits (head None); weight
    the sum with :func:`nelbo_from_rows` at t. `z_t` is unused (see `adlm_anchor_loss`)."""
    rows = important_token_mask(x, max_count, mask_id + 1)
    return Readout(rows, x, functools.partial(_ar_cross_entropy, dtype=dtype), mask_id + 1, compile=compile)


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


def _sedd_bracket(logits: Tensor, target: Tensor, mask_id: int, dtype: torch.dtype) -> Tensor:
    """sum_y exp(l_y) - l_x - 1 per row (see `sedd_score_entropy`)."""
    scores = sedd_log_scores(logits, mask_id, dtype)
    return torch.exp(torch.logsumexp(scores, dim=-1)) - scores.gather(-1, target.unsqueeze(-1)).squeeze(-1) - 1.0


def sedd_readout(z_t: Tensor, x: Tensor, mask_id: int, dtype: torch.dtype = torch.float32,
                 checkpoint: bool = True, capacity: int | None = None, compile: str | None = None) -> Readout:
    """The score entropy reads masked positions only (an unmasked one contributes 0): the
    rows masked in z_t (at most `capacity` gathered), targets x, per-row bracket
    sum_y exp(l_y) - l_x - 1."""
    return Readout(z_t == mask_id, x, functools.partial(_sedd_bracket, mask_id=mask_id, dtype=dtype), mask_id + 1,
                   checkpoint, capacity, compile)


def sedd_score_entropy_rows(bracket_sum: Tensor, t: Tensor, schedule: NoiseSchedule) -> Tensor:
    """`sedd_score_entropy` from the per-sequence bracket sum of a :func:`sedd_readout`."""
    t = t.to(bracket_sum.dtype)
    r = schedule.alpha(t) / schedule.one_minus_alpha(t)
    return schedule.dsigma(t) * r * bracket_sum


# --------------------------------------------------------------------------- AR


def _ar_cross_entropy(logits: Tensor, target: Tensor, dtype: torch.dtype) -> Tensor:
    return F.cross_entropy(logits.to(dtype), target, reduction="none", ignore_index=-100)


def ar_nll(logits: Tensor, x: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Autoregressive NLL per sequence (B,): -sum_{l>=1} log p(x^{l+1} | x^{<=l}).

    logits[:, l] predicts x[:, l + 1]; the first token is not scored. Cross-entropy on the
    flattened logits, chunk by chunk (:func:`row_losses`), with the last position's target
    ignored (loss 0): no shifted, cast or reshaped copy of the (B, L, V) logits.
    """
    B, L, C = logits.shape
    target = torch.cat([x[:, 1:], x.new_full((B, 1), -100)], dim=1)
    nll = row_losses(logits.reshape(B * L, C), target.reshape(-1), None,
                     functools.partial(_ar_cross_entropy, dtype=dtype), C)
    return nll.view(B, L).sum(-1)
