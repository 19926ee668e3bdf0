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
from tqdm import tqdm

from tadm.metrics.evaluator import Evaluator


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
    tokens = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, c in enumerate(batch):
        tokens[row, : len(c)] = torch.tensor(c, dtype=torch.long)
        mask[row, : len(c)] = 1
    tokens, mask = tokens.to(device), mask.to(device)
    logits = model(input_ids=tokens, attention_mask=mask).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    return (nll * mask[:, 1:]).double().sum(1).tolist()


def gen_ppl(texts: list[str], evaluator: Evaluator, batch_size: int = 8, context_length: int | None = None,
            max_length: int | None = None, progress: bool = False) -> GenPPL:
    """Generative perplexity of `texts` under `evaluator` (see the module docstring).
    `context_length` overrides the evaluator's (it may only shrink it)."""
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not texts:
        raise ValueError("texts must be a non-empty list of strings")
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must contain only strings")
    return gen_ppl_ids([evaluator.encode(t) for t in texts], evaluator, batch_size, context_length, max_length, progress)


def gen_ppl_ids(sequences: list[list[int]], evaluator: Evaluator, batch_size: int = 8,
                context_length: int | None = None, max_length: int | None = None, progress: bool = False) -> GenPPL:
    """:func:`gen_ppl` of texts already tokenized with the evaluator's tokenizer."""
    if not sequences:
        raise ValueError("sequences must be a non-empty list of token id lists")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    ctx = evaluator.context_length if context_length is None else int(context_length)
    if not 2 <= ctx <= evaluator.context_length:
        raise ValueError(f"context_length must be in [2, {evaluator.context_length}], got {context_length}")
    if max_length is not None and max_length < 2:
        raise ValueError(f"max_length must be >= 2 or None, got {max_length}")

    work = []  # (sample index, chunk)
    for i, ids in enumerate(sequences):
        work += [(i, c) for c in chunks(scored_ids(list(ids), evaluator.eos_id, max_length), ctx)]
    if not work:
        raise ValueError("texts: no sample has 2 or more evaluator tokens to score (all too short)")
    work.sort(key=lambda w: -len(w[1]))  # similar lengths together: less padding
    nll = np.zeros(len(sequences), dtype=np.float64)
    count = np.zeros(len(sequences), dtype=np.int64)
    device = next(evaluator.model.parameters()).device
    batches = [work[i:i + batch_size] for i in range(0, len(work), batch_size)]
    for batch in tqdm(batches, desc=f"gen ppl [{evaluator.name}]", unit="batch", disable=not progress):
        for (i, c), value in zip(batch, _chunk_nll(evaluator.model, [c for _, c in batch], evaluator.eos_id, device)):
            nll[i] += value
            count[i] += len(c) - 1
    return GenPPL(ppl=math.exp(nll.sum() / count.sum()), nll=nll, tokens=count)


@torch.no_grad()
def gen_ppl_and_features(texts: list[str], evaluator: Evaluator, batch_size: int = 8,
                         max_feature_tokens: int = 1024, progress: bool = False) -> tuple[GenPPL, np.ndarray]:
    """Gen PPL of `texts` and, from the same forward passes, MAUVE features: the mean of the
    evaluator's final hidden states over each text's first `max_feature_tokens` tokens (what
    `tadm.metrics.features.CausalMeanPooled` computes with the same model). One pass serves
    both because the model is causal: the NLL up to the first EOS does not see later tokens.
    Texts longer than one chunk fall back to two separate computations."""
    if isinstance(texts, str) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a non-empty list of strings")
    ids = [evaluator.encode(t) or [evaluator.eos_id] for t in texts]
    width = min(evaluator.context_length, max_feature_tokens)
    if max(len(i) for i in ids) > width:
        from tadm.metrics.features import CausalMeanPooled

        featurizer = CausalMeanPooled(evaluator.model.base_model, evaluator.tokenizer, max_feature_tokens, batch_size)
        return gen_ppl_ids(ids, evaluator, batch_size, progress=progress), featurizer.encode(list(texts))
    device = next(evaluator.model.parameters()).device
    nll = np.zeros(len(ids), dtype=np.float64)
    count = np.zeros(len(ids), dtype=np.int64)
    features = None
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc=f"gen ppl + features [{evaluator.name}]", unit="batch", disable=not progress):
        L = max(len(ids[i]) for i in batch)
        tokens = torch.full((len(batch), L), evaluator.eos_id, dtype=torch.long)
        mask = torch.zeros((len(batch), L), dtype=torch.long)
        scored = torch.zeros((len(batch), L), dtype=torch.bool)  # target positions counted in the NLL
        for row, i in enumerate(batch):
            tokens[row, : len(ids[i])] = torch.tensor(ids[i])
            mask[row, : len(ids[i])] = 1
            scored[row, 1: len(scored_ids(ids[i], evaluator.eos_id))] = True
        tokens, mask, scored = tokens.to(device), mask.to(device), scored.to(device)
        out = evaluator.model(input_ids=tokens, attention_mask=mask, output_hidden_states=True)
        logits = out.logits[:, :-1].float()
        token_nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none")
        hidden = out.hidden_states[-1].float()
        m = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = ((hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)).cpu().numpy()
        if features is None:
            features = np.zeros((len(ids), pooled.shape[1]), dtype=np.float32)
        for row, i in enumerate(batch):
            nll[i] = float((token_nll[row] * scored[row, 1:]).double().sum())
            count[i] = int(scored[row].sum())
            features[i] = pooled[row]
    if count.sum() == 0:
        raise ValueError("texts: no sample has 2 or more evaluator tokens to score (all too short)")
    return GenPPL(ppl=math.exp(nll.sum() / count.sum()), nll=nll, tokens=count), features
