"""ASRD on LLaDA, the ASRD paper's own model family: GSM8K and HumanEval (paper profile).

`LladaRunner` has the interface of the comparison's runners (`tadm.experiments.asrd.compare`: ``name``,
``backend(refresh_every)``, ``run(backend, task, settings, tally)``), so every decoding method
of the comparison runs on LLaDA unchanged:

- the model: ``asrd.llada_model`` (a hub id -- the paper profile: GSAI-ML/LLaDA-8B-Instruct --
  or a local directory of the release's files), loaded by `tadm.models.llada.load_llada` (no
  remote code, no pickle) in ``asrd.llada_precision`` on the runtime's device;
- the prompt: each benchmark prompt (`tadm.tasks.suite`: GSM8K 5-shot, HumanEval 0-shot) as
  one user turn of LLaDA-Instruct's chat template (the tokenizer's own, assistant header
  appended), followed by ``asrd.llada_gen_tokens`` positions to generate, as in LLaDA's
  ``generate``;
- a batch: prompts of different lengths are left-padded with the EOS / pad token to the
  longest in the batch so the generated span starts at one position, and the batch's padding
  mask (0 at a pad) goes to every model pass (`LladaBackend.set_padding`), as the current
  release's ``generate`` passes the tokenizer's ``attention_mask``: no position attends to a pad,
  and rotary positions are the canvas positions, unshifted, as in the release. A padded row
  decodes as the prompt alone would (greedy; tested) up to rounding; with
  ``asrd.llada_batch_size: 1`` nothing is padded and the mask is not applied at all;
- a completion: the generated tokens up to the first EOS or end-of-turn token, decoded
  without special tokens, scored by the benchmark's scorer.

`llada_plan` lists what the comparison runs on LLaDA: (task name, task, runner, variants);
the variants end with the training-free cache rows (`cache_variants`, `tadm.caches.llada`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tadm import runtime
from tadm.asrd.backends import Backend, LladaBackend
from tadm.asrd.decode import DecodeSettings, decode
from tadm.caches.catalog import CacheSpec
from tadm.config import Params
from tadm.errors import DataError
from tadm.experiments.asrd.runner import ASRD_BASE, BASELINE, Batches, Variant, variants
from tadm.models import llada
from tadm.models.llada import chat_ids
from tadm.registry import LLADA_CACHES
from tadm.tasks.suite import build_task

END_OF_TURN = "<|eot_id|>"  # LLaDA-Instruct's end of an assistant turn (besides EOS)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class BenchmarkTask:
    """A benchmark as the comparison's runners read it: prompts and a scorer by index."""

    name: str
    prompts: list[str]
    scorer: Callable[[int, str], bool]

    def __len__(self) -> int:
        return len(self.prompts)

    def score(self, i: int, text: str) -> bool:
        return bool(self.scorer(i, text))


def benchmark_tasks(p: Params, unsafe_host_execution: bool = False) -> dict[str, BenchmarkTask]:
    """``asrd.llada_tasks`` from the paper's benchmark suite (sources: posttrain.task_sources,
    GSM8K's default sft.gsm8k), the first ``asrd.llada_eval_examples`` of each (0: all)."""
    out = {}
    for name in p.asrd.llada_tasks:
        source = p.posttrain.task_sources.get(name) or (p.sft.gsm8k if name == "gsm8k" else None)
        prompts, score = build_task(name, source, limit=p.asrd.llada_eval_examples,
                                    unsafe_host_execution=unsafe_host_execution)
        out[name] = BenchmarkTask(name, prompts, score)
    return out


class LladaRunner(Batches):
    """LLaDA on a benchmark: chat-templated prompt + generated span in one canvas."""

    name = "llada"

    def __init__(self, p: Params, dist: runtime.Dist | None = None, model=None, tokenizer=None):
        self.dist = dist or runtime.setup(p.runtime)
        self.batch, self.gen = p.asrd.llada_batch_size, p.asrd.llada_gen_tokens
        if model is None or tokenizer is None:
            if not p.asrd.llada_model:
                raise DataError("asrd.llada_model is empty: name LLaDA's hub id or a local directory to run it")
            directory = llada.resolve_source(p.asrd.llada_model)
            if model is None:
                model = llada.load_llada(directory, self.dist.device, DTYPES[p.asrd.llada_precision])
            if tokenizer is None:
                tokenizer = llada.load_llada_tokenizer(directory)
        self.model, self.tok = model, tokenizer
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.cfg.eos_token_id
        if eos is None:
            raise DataError("LLaDA tokenizer: has no EOS token (needed to end and pad completions)")
        self.eos = int(eos)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.cfg.pad_token_id
        self.pad = self.eos if pad is None else int(pad)
        eot = tokenizer.convert_tokens_to_ids(END_OF_TURN) if END_OF_TURN in tokenizer.get_vocab() else None
        self.stops = {self.eos} | ({int(eot)} if eot is not None else set())

    def backend(self, refresh_every: int, cache: CacheSpec | None = None) -> Backend:
        """LLaDA itself, or with a training-free cache (a cache row's `Variant.cache`)."""
        return LladaBackend(self.model, refresh_every) if cache is None else cache.build(self.model)

    def encode(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(canvas (B, P + G) long, region (P + G,) bool, attention mask (B, P + G) bool):
        left-padded chat prompts, then the G = asrd.llada_gen_tokens positions to generate (the
        mask token); the attention mask is False exactly at the pads."""
        ids = [chat_ids(self.tok, text) for text in prompts]
        width = max(len(i) for i in ids)
        limit = self.model.cfg.max_sequence_length
        if width + self.gen > limit:
            raise DataError(f"LLaDA: a prompt of {width} tokens + {self.gen} generated exceeds max_sequence_length {limit}")
        canvas = torch.full((len(ids), width + self.gen), self.model.mask_id, dtype=torch.long, device=runtime.CPU)
        attention = torch.ones(canvas.shape, dtype=torch.bool, device=runtime.CPU)
        for row, seq in enumerate(ids):
            canvas[row, : width - len(seq)] = self.pad
            attention[row, : width - len(seq)] = False
            canvas[row, width - len(seq): width] = torch.tensor(seq, dtype=torch.long)
        region = torch.zeros(width + self.gen, dtype=torch.bool, device=runtime.CPU)
        region[width:] = True
        return canvas, region, attention

    def completions(self, tokens: torch.Tensor, region: torch.Tensor) -> list[str]:
        """The generated span of each row, up to the first EOS / end-of-turn, as text."""
        texts = []
        for row in runtime.host(tokens)[:, runtime.host(region)].tolist():
            cut = next((i for i, t in enumerate(row) if t in self.stops), len(row))
            texts.append(self.tok.decode(row[:cut], skip_special_tokens=True))
        return texts

    def decoder(self, backend: Backend, task: BenchmarkTask, settings: DecodeSettings):
        """`decode_batch(lo)` of `settings` on `task` (run by `Batches.run` /
        `run_interleaved`: batches split over the processes of the runner's dist)."""

        def decode_batch(lo: int):
            canvas, region, attention = self.encode(task.prompts[lo: lo + self.batch])
            # each batch its own padding; None when nothing is padded (the unmasked pass, no check per pass)
            backend.set_padding(None if bool(attention.all()) else attention.to(backend.device))
            r = decode(backend, canvas, region, settings)
            return r, self.completions(r.tokens, region), len(canvas) * self.gen

        return decode_batch


def llada_variants(p: Params, task: str | None = None) -> list[Variant]:
    """The comparison's methods (`tadm.experiments.asrd.compare.variants`) at LLaDA's steps and block size,
    then the cache rows of `task` (`cache_variants`)."""
    a = p.asrd
    out = variants(p, a.llada_steps, False)
    for v in out:
        v.settings = v.settings.replace(block_size=a.llada_block_size)
    return out + cache_variants(p, out, task)


def cache_variants(p: Params, rows: list[Variant], task: str | None = None) -> list[Variant]:
    """The training-free cache rows of asrd.llada_cache_methods (`tadm.registry.LLADA_CACHES`, in
    its order), each on the decoder of its reference row (`base`): the rows refreshed per block
    first, on low-confidence + threshold (Fast-dLLM's cache + parallel recipe), then the rows
    refreshed every K of asrd.llada_cache_refresh or as released on `task` (asrd.llada_dllm_cache)
    on low-confidence (1 token a step, as dLLM-Cache's release decodes). Each method's rows are its
    registry entry's (`tadm.caches.catalog`): Fast-dLLM's prefix cache per block and every K, its
    dual cache per block, dLLM-Cache as released on `task` (none for a task it does not name) and
    with K_p = K_r = K, naive reuse every K, dKV-Cache-Decode at the release's reload intervals.
    A row with a decoding prior (d²Cache: `CacheSpec.prior`) decodes as its release does -- low-
    confidence ranked by confidence x certainty density, one block over the region -- and its
    reference is that decoder without the cache (`prior_base`, added once per prior)."""
    a = p.asrd
    by = {v.label: v for v in rows}
    released = a.llada_dllm_cache.get(task or "")
    specs = [row for name in LLADA_CACHES.names() if name in a.llada_cache_methods
             for row in LLADA_CACHES[name].rows(a.llada_cache_refresh, released)]
    out = []
    for label, spec in sorted(specs, key=lambda row: not row[1].per_block):  # stable: registry order within
        if spec.prior is not None:
            ref = prior_base(by[BASELINE], spec.prior)
            if ref.label not in by:
                by[ref.label] = ref
                out.append(ref)
            out.append(Variant(label, ref.settings, base=ref.label, cache=spec, family=spec.method))
            continue
        base = ASRD_BASE if spec.per_block else BASELINE
        out.append(Variant(label, by[base].settings, base=base, cache=spec, family=spec.method))
    return out


def prior_base(baseline: Variant, sigma: float) -> Variant:
    """LLaDA's low-confidence row (`baseline`) with d²Cache's certainty prior (sigma) over one
    block spanning the region: a cache row with that prior is compared with it."""
    return Variant(f"Low-confidence + certainty prior (sigma={sigma:g}, one block)",
                   baseline.settings.replace(block_size=None, certainty_sigma=sigma), base=BASELINE)


def llada_plan(p: Params, dist: runtime.Dist | None = None, runner: LladaRunner | None = None,
               tasks: dict[str, BenchmarkTask] | None = None) -> list[tuple[str, BenchmarkTask, LladaRunner, list]]:
    """What the ASRD comparison runs on LLaDA: (task name, task, runner, variants) per
    ``asrd.llada_tasks``; empty when ``asrd.llada_model`` is "" (the default profile)."""
    if not p.asrd.llada_model and runner is None:
        return []
    runner = runner or LladaRunner(p, dist)
    tasks = tasks if tasks is not None else benchmark_tasks(p)
    return [(name, tasks[name], runner, llada_variants(p, name)) for name in p.asrd.llada_tasks]
