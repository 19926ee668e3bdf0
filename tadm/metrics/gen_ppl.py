"""Generative perplexity: how likely a causal-LM evaluator finds generated text (MDLM).

Protocol: MDLM's ``compute_generative_perplexity`` (kuleshov-group/mdlm and remdm,
`diffusion.py`; with its ``eval_retokenize``), reproduced token for token:

1. Samples are decoded to text with the project tokenizer, special tokens kept
   (:func:`decode_samples`), so BOS/EOS appear as ``<|endoftext|>``, and retokenized with the
   evaluator's tokenizer (no special tokens added), truncated to ``max_length`` tokens (MDLM:
   ``truncation=True, max_length=model.length``).
2. The texts are right-padded with EOS to the longest of the whole set (ReMDM's evaluation
   tokenizes every sample at once with ``padding=True``; GPT-2's pad token is its EOS), then taken
   ``batch_size`` at a time in their order, with an attention mask over the real
   tokens; the padded batch is cut into consecutive chunks of the evaluator's context length
   (``torch.split`` along the sequence) and each chunk is scored on its own by teacher forcing:
   the first token of every chunk only conditions (no BOS is prepended).
3. Which targets count, per chunk (``mdlm_target_mask``): every target that is not EOS, and the
   chunk's first EOS -- ``(token != eos) | (cumsum(token == eos) == 1)`` on the targets. So
   tokens after an EOS still count; an EOS counts only as the chunk's first (a leading EOS, the
   BOS of packed samples, is position 0, conditions only, and then no later EOS counts); and a
   text with no EOS shorter than the set's longest gets its first pad EOS counted. Padding beyond
   that never counts. (The counts of such a text therefore depend on the set, as released.)
4. PPL = exp(sum of NLL / number of counted targets) over the whole sample set (a
   token-weighted mean, like MDLM's running ``Perplexity`` metric); per sample, its summed NLL
   and count (for the bootstrap, `tadm.metrics.bootstrap`).

One difference: MDLM scores ``N // batch_size`` full batches and drops the remainder; here the
last, shorter batch is scored too (identical when batch_size divides N, as in Table 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

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

    def ratio_per(self, other: "GenPPL", units: int) -> float:
        """`other`'s Gen PPL over this one's with both totals of NLL counted per the same `units`
        (e.g. words, or the GPT-2 tokens of the texts this set scored): exp((NLL_other -
        NLL_self) / units). With units = the evaluator's own token count of both sets it is the
        plain ratio of the two Gen PPLs; it makes ratios of judges with different tokenizers
        comparable, since a finer tokenizer spreads the same NLL over more tokens."""
        if isinstance(units, bool) or not isinstance(units, (int, np.integer)) or units < 1:
            raise ValueError(f"units must be a positive integer, got {units!r}")
        return float(np.exp((float(other.nll.sum()) - float(self.nll.sum())) / units))


def decode_samples(token_ids, tokenizer) -> list[str]:
    """Text of generated token ids (a (N, L) tensor/array or a list of lists), special
    tokens kept, as MDLM's ``batch_decode`` does."""
    rows = token_ids.tolist() if hasattr(token_ids, "tolist") else [list(r) for r in token_ids]
    return tokenizer.batch_decode(rows, skip_special_tokens=False)


def mdlm_target_mask(chunk: Tensor, eos_id: int) -> Tensor:
    """Which targets chunk[:, 1:] count (B, n - 1) bool, MDLM's rule: not EOS, or the chunk's
    first EOS (module docstring, 3)."""
    is_eos = chunk == eos_id
    first_eos = is_eos.cumsum(-1) == 1
    return (~is_eos | first_eos)[:, 1:]


def pad_batch(rows: list[list[int]], eos_id: int, width: int | None = None) -> tuple[Tensor, Tensor]:
    """(tokens, attention mask) (B, width) on the CPU: rows right-padded with EOS to `width`
    (None: the longest row)."""
    width = max(len(r) for r in rows) if width is None else width
    if width < max(len(r) for r in rows):
        raise ValueError(f"pad_batch: width {width} is shorter than the longest row ({max(len(r) for r in rows)})")
    tokens = torch.full((len(rows), width), eos_id, dtype=torch.long, device=CPU)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=CPU)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long, device=CPU)
        mask[i, : len(r)] = 1
    return tokens, mask


@torch.no_grad()
def _score_batch(model, rows: list[list[int]], eos_id: int, context_length: int, feature_width: int = 0,
                 pooling: str = "mean", width: int | None = None) -> tuple[list[tuple[float, int]], np.ndarray | None]:
    """[(summed NLL, counted targets)] of each row under MDLM's protocol (module docstring) and,
    with `feature_width` W > 0, the evaluator's final hidden states of each row's first W real
    tokens pooled (`pooling`), taken from the first chunk's pass (W <= context length)."""
    device = next(model.parameters()).device
    tokens, mask = pad_batch(rows, eos_id, width)
    nll = torch.zeros(len(rows), dtype=torch.float64, device=CPU)
    count = torch.zeros(len(rows), dtype=torch.long, device=CPU)
    pooled = None
    for k, (chunk, chunk_mask) in enumerate(zip(tokens.split(context_length, -1), mask.split(context_length, -1))):
        if chunk.shape[1] < 2 and not (k == 0 and feature_width):
            continue  # a 1-token tail has no target
        logits, hidden = lm_forward(model, chunk.to(device), chunk_mask.to(device))
        if chunk.shape[1] >= 2:
            token_nll = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2),
                                                          chunk[:, 1:].to(device), reduction="none")
            counted = mdlm_target_mask(chunk, eos_id).to(device)
            nll += torch.where(counted, token_nll, 0.0).double().sum(1).cpu()
            count += counted.sum(1).cpu()
        if k == 0 and feature_width:
            pooled = _pool(hidden.float(), chunk_mask[:, :feature_width].to(device), pooling).cpu().numpy()
    return list(zip(nll.tolist(), count.tolist())), pooled


def _pool(hidden: Tensor, real: Tensor, pooling: str) -> Tensor:
    """Mean over, or the last of, the positions `real` (B, W) marks (its 1s form a prefix)."""
    real = real.to(hidden.dtype)
    if pooling == "mean":
        m = real.unsqueeze(-1)
        return (hidden[:, : real.shape[1]] * m).sum(1) / m.sum(1).clamp_min(1e-9)
    last = (real.sum(1).long() - 1).clamp_min(0)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def _check_context(evaluator: Evaluator, context_length: int | None) -> int:
    ctx = evaluator.context_length if context_length is None else int(context_length)
    if not 2 <= ctx <= evaluator.context_length:
        raise ValueError(f"context_length must be in [2, {evaluator.context_length}], got {context_length}")
    return ctx


def _check_common(batch_size: int, max_length: int | None) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_length is not None and max_length < 2:
        raise ValueError(f"max_length must be >= 2 or None, got {max_length}")


def _truncated(sequences: Iterable[Sequence[int]], max_length: int | None, eos_id: int) -> list[list[int]]:
    """Each token id sequence cut to its first `max_length` ids (all of them when None), an
    empty one scored as a lone EOS (step 1 of the module docstring)."""
    return [list(ids)[:max_length] or [eos_id] for ids in sequences]


def _score(sequences: list[list[int]], evaluator: Evaluator, batch_size: int, ctx: int, progress: bool,
           dist: Dist | None, feature_width: int = 0, pooling: str = "mean") -> tuple[GenPPL, np.ndarray | None]:
    """MDLM's protocol over in-order batches of `batch_size`, padded to the set's longest
    (module docstring)."""
    batches = [list(range(i, min(i + batch_size, len(sequences)))) for i in range(0, len(sequences), batch_size)]
    width = max(len(s) for s in sequences)
    desc = f"gen ppl{' + features' if feature_width else ''} [{evaluator.name}]"
    outputs = map_batches(batches, lambda b: _score_batch(evaluator.model, [sequences[i] for i in b], evaluator.eos_id,
                                                          ctx, feature_width, pooling, width), dist, desc=desc,
                          progress=progress)
    nll = np.zeros(len(sequences), dtype=np.float64)
    count = np.zeros(len(sequences), dtype=np.int64)
    features = None
    for batch, (values, pooled) in zip(batches, outputs):
        for row, i in enumerate(batch):
            nll[i], count[i] = values[row]
        if pooled is not None:
            if features is None:
                features = np.zeros((len(sequences), pooled.shape[1]), dtype=np.float32)
            features[batch] = pooled
    if count.sum() == 0:
        raise ValueError("texts: no sample has a target to score (all too short)")
    return GenPPL(ppl=math.exp(nll.sum() / count.sum()), nll=nll, tokens=count), features


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


def gen_ppl_ids(sequences: list[list[int]], evaluator: Evaluator, batch_size: int = 8,
                context_length: int | None = None, max_length: int | None = None, progress: bool = False,
                dist: Dist | None = None) -> GenPPL:
    """:func:`gen_ppl` of texts already tokenized with the evaluator's tokenizer."""
    if not sequences:
        raise ValueError("sequences must be a non-empty list of token id lists")
    _check_common(batch_size, max_length)
    ctx = _check_context(evaluator, context_length)
    rows = _truncated(sequences, max_length, evaluator.eos_id)
    return _score(rows, evaluator, batch_size, ctx, progress, dist)[0]


POOLINGS = ("mean", "last")


def lm_forward(model, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(logits, final hidden states after the last norm) of a causal LM in one pass: the base
    model's states, then its output head (what ``model(...)`` computes, without keeping every
    layer's states)."""
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return model.get_output_embeddings()(hidden), hidden


def gen_ppl_and_features(texts: list[str], evaluator: Evaluator, batch_size: int = 8,
                         max_feature_tokens: int = 1024, progress: bool = False, pooling: str = "mean",
                         dist: Dist | None = None, max_length: int | None = None) -> tuple[GenPPL, np.ndarray]:
    """Gen PPL of `texts` (MDLM's protocol, the module docstring) and, from the same forward
    passes, MAUVE features of the evaluator's final hidden states (after its last norm) over
    each text's first W = min(context length, `max_feature_tokens`) tokens:

    - ``pooling="mean"``: their mean (`tadm.metrics.features.CausalMeanPooled`, the smollm2
      featurizer);
    - ``pooling="last"``: the state at the last of them (`LastToken`, MAUVE's own featurizer,
      e.g. GPT-2 Large as both evaluator and featurizer).

    One pass serves both because the model is causal: the states of a text's first W tokens are
    those of its first Gen PPL chunk, which right-padding does not change. With `dist` the
    batches are split over its processes (`tadm.metrics.shards`): the values are the same for
    any number of processes."""
    if isinstance(texts, str) or not texts or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a non-empty list of strings")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    _check_common(batch_size, max_length)
    eos, ctx = evaluator.eos_id, evaluator.context_length
    rows = _truncated((evaluator.encode(t) for t in texts), max_length, eos)
    width = min(ctx, max_feature_tokens)
    ppl, features = _score(rows, evaluator, batch_size, ctx, progress, dist, feature_width=width, pooling=pooling)
    return ppl, features
