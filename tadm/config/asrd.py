"""ASRD's section: the training-free decoder, its baselines and the models it runs on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tadm.config.fields import spec
from tadm.registry import LLADA_CACHES


@dataclass(frozen=True)
class DllmCacheConfig:
    """dLLM-Cache's intervals and V-verify share for one LLaDA task (its release's settings)."""

    prompt_every: int = spec(50, ge=1)  # K_p: passes between prompt refreshes
    response_every: int = spec(7, ge=1)  # K_r: passes between response refreshes
    share: float = spec(0.25, gt=0.0, le=1.0)  # rho: response rows V-verify recomputes


@dataclass
class AsrdConfig:
    """ASRD (anchor-supervised revocable decoding, training-free) and its comparison with the
    remasking baselines (tadm.asrd; its model trained by the train stage, compared by the asrd stage)."""

    # the anchor tokens cache and the two mechanisms
    capacity: int = spec(16, ge=1)  # anchors per sequence (the paper: 12-20)
    window: int = spec(2, ge=1)  # k: passes a prediction must hold to become an anchor
    guidance: float = spec(1.0, ge=0.0)  # weight of the anchor centroid in masked embeddings
    perturbation: float = spec(1.0, ge=0.0)  # rho: orthogonal push, relative to the token's norm
    verify_below: float = spec(0.9, gt=0.0, le=1.0)  # candidates committed less confident are verified
    threshold: float = spec(0.9, gt=0.0, le=1.0)  # parallel commit threshold of ASRD and its base
    temperature: float = spec(0.0, ge=0.0)  # token choice: 0 = argmax
    refresh_every: int = spec(2, ge=1)  # K of the time-anchored row (ASRD on TADM)
    # ReMDM-loop baseline
    eta: float = spec(0.02, ge=0.0, le=1.0)
    t_on: float = spec(0.55, gt=0.0, le=1.0)
    t_off: float = spec(0.05, ge=0.0, lt=1.0)
    alpha_on: float = spec(0.9, gt=0.0, lt=1.0)
    # the tasks: fixed layout [prompt | response] for the masked model; DiffusionGemma's canvas
    # is posttrain.canvas_length
    prompt_tokens: int = spec(20, ge=1)
    response_tokens: int = spec(24, ge=1)
    block_size: int = spec(8, ge=1)  # semi-AR block (masked model and DiffusionGemma)
    steps: int = spec(24, ge=1)  # masked model, over the response
    dg_steps: int = spec(32, ge=1)  # DiffusionGemma, over its canvas
    spelling_max: int = spec(999, ge=2, le=999)  # the spelling task's numbers: 1..spelling_max
    spelling_train: int = spec(4000, ge=1)
    spelling_eval: int = spec(200, ge=1)  # held-out numbers
    eval_examples: int = spec(0, ge=0)  # arithmetic problems scored; 0 = all SFT validation ones
    seeds: list[int] = spec([0, 1, 2], nonempty=True, unique=True, ge=0)
    batch_size: int = spec(32, ge=1)  # sequences decoded together
    # one-at-a-time sweeps around the default ASRD on the masked model (first seed; [] skips one)
    sweep_capacity: list[int] = spec([12, 16, 20], unique=True, ge=1)  # anchor tokens cache sizes
    sweep_window: list[int] = spec([1, 2, 4], unique=True, ge=1)  # consistency windows k
    sweep_block_size: list[int] = spec([4, 8, 12, 24], unique=True, ge=1)  # semi-AR blocks: each must tile response_tokens
    sweep_examples: int = spec(0, ge=0)  # first examples of each task the sweeps score; 0 = all
    # the masked diffusion LM the comparison runs on (MDLM, `model` section's width, depth and GELU,
    # its own MLP width: the tasks are mostly memorised, and a 2d MLP fits them far worse)
    mlp_ratio: int = spec(4, ge=1)
    train_steps: int = spec(3000, ge=1)
    train_batch: int = spec(32, ge=1)
    lr: float = spec(1.0e-3, gt=0.0)
    warmup_steps: int = spec(100, ge=0)
    checkpoint_every: int = spec(500, ge=1)
    log_every: int = spec(50, ge=1)
    # LLaDA (the ASRD paper's model family, tadm.models.llada; tadm.experiments.asrd.llada): a hub
    # id or a local directory of LLaDA's released config.json + safetensors + tokenizer; "" = not run
    llada_model: str = ""
    llada_tasks: list[Literal["gsm8k", "humaneval"]] = spec(["gsm8k", "humaneval"], nonempty=True, unique=True)
    llada_gen_tokens: int = spec(256, ge=1)  # generated positions after the chat-templated prompt
    llada_block_size: int = spec(32, ge=1)  # semi-AR block of the LLaDA runs
    llada_steps: int = spec(256, ge=1)  # over the generated positions
    llada_eval_examples: int = spec(0, ge=0)  # per task; 0 = all
    llada_batch_size: int = spec(8, ge=1)
    llada_precision: Literal["fp32", "bf16"] = "bf16"
    # training-free caches on LLaDA (names in tadm.registry.LLADA_CACHES, tadm.caches.llada; rows of
    # the LLaDA group): Fast-dLLM's prefix / dual cache refreshed per block, and the prefix cache,
    # dLLM-Cache (K_p = K_r = K) and naive reuse refreshed every K of llada_cache_refresh;
    # dLLM-Cache as released per task (tasks not named: no such row)
    llada_cache_methods: list[str] = spec(["prefix", "dual", "feature", "naive", "dkv", "d2cache"], unique=True,
                                          registry=LLADA_CACHES)
    llada_cache_refresh: list[int] = spec([2, 3], unique=True, ge=2)  # K = 1 is the base itself
    llada_dllm_cache: dict[str, DllmCacheConfig] = spec(
        {"gsm8k": DllmCacheConfig(50, 7, 0.25), "humaneval": DllmCacheConfig(50, 8, 0.25)})
