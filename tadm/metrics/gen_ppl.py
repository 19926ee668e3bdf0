"""Generative perplexity: how likely a causal-LM evaluator finds generated text (MDLM).

Protocol (MDLM's ``compute_generative_perplexity``, with the choices it leaves open fixed):

1. Samples are decoded to text with the project tokenizer, special tokens kept
   (:func:`decode_samples`), so BOS/EOS appear as ``<|endoftext|>``, and retokenized with the
   evaluator's tokenizer (no special tokens added).
2. Each sequence is cut after its first EOS at position >= 1 (inclusive): tokens after it
   are never scored. A leading EOS (the BOS of MDLM-packed samples) conditions only.
   (MDLM's code masks with ``first_eos | (token != eos)``, which also counts non-EOS tokens
   after the first EOS; here counting stops at the first EOS, "every token up to and including
   the first EOS", as the protocol is stated.)
3. The sequence is cut into non-overlapping chunks of the evaluator's context length (MDLM's
   ``torch.split``) and each chunk is scored by teacher forcing on its own; the first token of
   every chunk is conditioning only (no BOS is prepended, as in MDLM), so a chunk of n tokens
   scores n-1, and a plain text's first token is never scored.
   ``max_length`` truncates the retokenized sequence first, as MDLM's ``eval_retokenize`` does
   (MDLM: the sample length, 1024).
4. PPL = exp(sum of NLL / number of scored tokens) over the whole sample set (a
   token-weighted mean, like MDLM's running ``Perplexity`` metric).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tadm.metrics.evaluator import Evaluator
from tadm.metrics.shards import map_batches
from tadm.runtime import CPU, Dist


@dataclass
class GenPPL:
    ppl: float  # exp(total NLL / total scored tokens)
    nll: np.ndarray  # (N,) summed NLL in nats of each sample
    tokens: np.ndarray  # (N,) number of scored tokens of each sample

    @property
    def sample_ppl(self) -> np.ndarray:
        """Each sample's own perplexity (nan for a sample with no scored token)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.exp(self.nll / self.tokens)


def decode_samples(token_ids, tokenizer) -> list[str]:
    """Text of generated token ids (a (N, L) tensor/array or a list of lists), special
    tokens kept, as MDLM's ``batch_decode`` does."""
    rows = token_ids.tolist() if hasattr(token_ids, "tolist") else [list(r) for r in token_ids]
    return tokenizer.batch_decode(rows, skip_special_tokens=False)


def scored_ids(ids: list[int], eos_id: int, max_length: int | None = None) -> list[int]:
    """The tokens of one sequence that take part in scoring: the first `max_length`, then
    up to and including the first EOS after position 0."""
    if max_length is not None:
        ids = ids[:max_length]
    for pos in range(1, len(ids)):
        if ids[pos] == eos_id:
            return ids[: pos + 1]
    return ids


def chunks(ids: list[int], context_length: int) -> list[list[int]]:
    """Non-overlapping pieces of at most `context_length` tokens that score >= 1 token."""
    pieces = [ids[i:i + context_length] for i in range(0, len(ids), context_length)]
    return [p for p in pieces if len(p) >= 2]


@torch.no_grad()
def _chunk_nll(model, batch: list[list[int]], pad_id: int, device) -> list[float]:
    width = max(len(c) for c in batch)
    tokens = torch.full((len(batch), width), pad_id, dtype=torch.long, device=CPU)
    mask = torch.zeros((len(batch), width), dtype=torch.long, device=CPU)
    for row, c in enumerate(batch):
        tokens[row, : len(c)] = torch.tensor(c, dtype=torch.long, device=CPU)
        mask[row, : len(c)] = 1
    tokens, mask = tokens.to(device), mask.to(device)
    logits = model(input_ids=tokens, attention_mask=mask).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    return (nll * mask[:, 1:]).double().sum(1).tolist()


def gen_ppl(texts: list[str], evaluator: Evaluator, batch_size: int = 8, context_length: int | None = None,
            max_length: int | None = None, progress: bool = False, dist: Dist | None = None) -> GenPPL:
    """Generative perplexity of `texts` under `evaluator` (see the module docstring).
    `context_length` overrides the evaluator's (it may only shrink it). With `dist` (a
    `tadm.runtime.Dist`) the batches are split over its processes (`tadm.metrics.shards`)."""
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
        raise ValueError("texts must be a non-empty list of strings")
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must contain only strings")
    return gen_ppl_ids([evaluator.encode(t) for t in texts], evaluator, batch_size, context_length, max_length, progress,
                       dist=dist)


def _check_context(evaluator: Evaluator, context_length: int | None) -> int:
    ctx = evaluator.context_length if context_length is None else int(context_length)
    if not 2 <= ctx <= evaluator.context_length:
        raise ValueError(f"context_length must be in [2, {evaluator.context_length}], got {context_length}")
    return ctx


def _score_chunks(work: list[tuple[int, list[int]]], evaluator: Evaluator, batch_size: int, nll: np.ndarray,
                  count: np.ndarray, progress: bool, dist: Dist | None) -> None:
    """Add the NLL and scored-token count of every (sample index, chunk) of `work` to nll / count."""
    if not work:
        return
    work = sorted(work, key=lambda w: -len(w[1]))  # similar lengths together: less padding (stable)
    device = next(evaluator.model.parameters()).device
    batches = [work[i:i + batch_size] for i in range(0, len(work), batch_size)]
    values = map_batches(batches, lambda b: _chunk_nll(evaluator.model, [c for _, c in b], evaluator.eos_id, device),
                         dist, desc=f"gen ppl [{evaluator.name}]", progress=progress)
    for batch, batch_values in zip(batches, values):
        for (i, c), value in zip(batch, batch_values):
            nll[i] += value
            count[i] += len(c) - 1


def gen_ppl_ids(sequences: list[list[int]], evaluator: Evaluator, batch_size: int = 8,
                context_length: int | None = None, max_length: int | None = None, progress: bool = False,
                dist: Dist | None = None) -> GenPPL:
    """:func:`gen_ppl` of texts already tokenized with the evaluator's tokenizer."""
    if not sequences:
        raise ValueError("sequences must be a non-empty list of token id lists")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ctx = _check_context(evaluator, context_length)
    if max_length is not None and max_length < 2:
        raise ValueError(f"max_length must be >= 2 or None, got {max_length}")

    work = []  # (sample index, chunk)
    for i, ids in enumerate(sequences):
        work += [(i, c) for c in chunks(scored_ids(list(ids), evaluator.eos_id, max_length), ctx)]
    if not work:
        raise ValueError("texts: no sample has 2 or more evaluator tokens to score (all too short)")
    nll = np.zeros(len(sequences), dtype=np.float64)
    count = np.zeros(len(sequences), dtype=np.int64)
    _score_chunks(work, evaluator, batch_size, nll, count, progress, dist)
    return GenPPL(ppl=math.exp(nll.sum() / count.sum()), nll=nll, tokens=count)


POOLINGS = ("mean", "last")


def lm_forward(model, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(logits, final hidden states after the last norm) of a causal LM in one pass: the base
    model's states, then its output head (what ``model(...)`` computes, without keeping every
    layer's states)."""
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return model.get_output_embeddings()(hidden), hidden


@torch.no_grad()
def gen_ppl_and_features(texts: list[str], evaluator: Evaluator, batch_size: int = 8,
                         max_feature_tokens: int = 1024, progress: bool = False, pooling: str = "mean",
                         dist: Dist | None = None) -> tuple[GenPPL, np.ndarray]:
    """Gen PPL of `texts` and, from the same forward passes, MAUVE features of the evaluator's
    final hidden states (after its last norm) over each text's first W = min(context length,
    `max_feature_tokens`) tokens:

    - ``pooling="mean"``: their mean (`tadm.metrics.features.CausalMeanPooled`, the smollm2
      featurizer);
    - ``pooling="last"``: the state at the last of them (`LastToken`, MAUVE's own featurizer,
      e.g. GPT-2 Large as both evaluator and featurizer).

    One pass serves both because the model is causal: each text's first forward window is its
    first Gen PPL chunk extended to W tokens, and neither the NLL up to the first EOS nor the
    states of the first W tokens see later tokens. Only the further chunks of texts longer than
    the evaluator's context take more passes. With `dist` the batches are split over its
    processes (`tadm.metrics.shards`): the values are the same for any number of processes."""
    if isinstance(texts, str) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a non-empty list of strings")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    eos, ctx = evaluator.eos_id, evaluator.context_length
    ids = [evaluator.encode(t) or [eos] for t in texts]
    width = min(ctx, max_feature_tokens)
    pieces = [chunks(scored_ids(i, eos), ctx) for i in ids]
    # the first window of text i: its first Gen PPL chunk (a prefix of it), extended to W tokens
    windows = [i[: max(width, len(p[0]) if p else 0)] for i, p in zip(ids, pieces)]
    device = next(evaluator.model.parameters()).device
    order = sorted(range(len(ids)), key=lambda i: -len(windows[i]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]

    def run(batch: list[int]) -> tuple[list[tuple[float, int]], np.ndarray]:
        L = max(len(windows[i]) for i in batch)
        tokens = torch.full((len(batch), L), eos, dtype=torch.long, device=CPU)
        mask = torch.zeros((len(batch), L), dtype=torch.long, device=CPU)
        scored = torch.zeros((len(batch), L), dtype=torch.bool, device=CPU)  # target positions counted in the NLL
        pooled_over = torch.zeros((len(batch), L), dtype=torch.long, device=CPU)  # positions the feature pools
        for row, i in enumerate(batch):
            tokens[row, : len(windows[i])] = torch.tensor(windows[i], device=CPU)
            mask[row, : len(windows[i])] = 1
            scored[row, 1: len(pieces[i][0]) if pieces[i] else 0] = True
            pooled_over[row, : min(width, len(windows[i]))] = 1
        tokens, mask, scored = tokens.to(device), mask.to(device), scored.to(device)
        logits, hidden = lm_forward(evaluator.model, tokens, mask)
        token_nll = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), tokens[:, 1:],
                                                      reduction="none")
        hidden = hidden.float()
        if pooling == "mean":
            m = pooled_over.to(device).unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)
        else:
            last = (pooled_over.sum(1) - 1).to(device)
            pooled = hidden[torch.arange(len(batch), device=device), last]
        values = [(float((token_nll[row] * scored[row, 1:]).double().sum()), int(scored[row].sum()))
                  for row in range(len(batch))]
        return values, pooled.cpu().numpy()

    nll = np.zeros(len(ids), dtype=np.float64)
    count = np.zeros(len(ids), dtype=np.int64)
    features = None
    outputs = map_batches(batches, run, dist, desc=f"gen ppl + features [{evaluator.name}]", progress=progress)
    for batch, (values, pooled) in zip(batches, outputs):
        if features is None:
            features = np.zeros((len(ids), pooled.shape[1]), dtype=np.float32)
        for row, i in enumerate(batch):
            nll[i], count[i] = values[row]
            features[i] = pooled[row]
    # the further chunks of texts longer than the evaluator's context
    _score_chunks([(i, c) for i, p in enumerate(pieces) for c in p[1:]], evaluator, batch_size, nll, count, progress,
                  dist)
    if count.sum() == 0:
        raise ValueError("texts: no sample has 2 or more evaluator tokens to score (all too short)")
    return GenPPL(ppl=math.exp(nll.sum() / count.sum()), nll=nll, tokens=count), features
