"""TADM:Post-train's section: the DiffusionGemma base, the fusion's training, Table 1."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tadm.config.fields import spec
from tadm.registry import DG_CACHES


@dataclass
class DiffusionGemmaSize:
    """The small DiffusionGemma the pipeline trains itself (posttrain.base_model: local).

    Its decoder depth is shared_layers + anchor_layers + denoiser_layers of the posttrain
    section; the MoE fields are required by DiffusionGemma and set small.
    """

    hidden_size: int = spec(128, ge=8)
    intermediate_size: int = spec(256, ge=8)
    num_attention_heads: int = spec(4, ge=1)
    num_key_value_heads: int = spec(1, ge=1)
    head_dim: int = spec(32, ge=4)
    sliding_window: int = spec(128, ge=2)
    num_experts: int = spec(4, ge=1)
    top_k_experts: int = spec(2, ge=1)
    moe_intermediate_size: int = spec(64, ge=4)
    # uniform-state block-diffusion training on the SFT canvases
    steps: int = spec(1000, ge=1)
    batch_size: int = spec(32, ge=1)
    lr: float = spec(2.0e-3, gt=0.0)
    warmup_steps: int = spec(50, ge=0)
    weight_decay: float = spec(0.0, ge=0.0)


@dataclass
class PosttrainConfig:
    """TADM:Post-train on DiffusionGemma (paper: Sec. 4, App. C.1) and its Table 1."""

    # "local": the small DiffusionGemma of `base`, trained by the pipeline (its dg_base job of the train stage);
    # otherwise a hub id or a local from_pretrained directory of DiffusionGemmaForBlockDiffusion
    base_model: str = "google/diffusiongemma-26B-A4B-it"
    base: DiffusionGemmaSize = field(default_factory=DiffusionGemmaSize)
    precision: Literal["fp32", "bf16"] = "bf16"  # of the frozen base (the fusion trains in fp32)
    shared_layers: int = spec(2, ge=1)
    anchor_layers: int = spec(20, ge=1)
    denoiser_layers: int = spec(8, ge=1)
    fusion_rank: int = spec(256, ge=1)
    gate_bias_init: float = -3.0
    steps: int = spec(18_750, ge=1)
    batch_size: int = spec(1, ge=1)  # per device
    lr: float = spec(1.5e-4, gt=0.0)
    betas: list[float] = spec([0.95, 0.99], length=2, ge=0.0, lt=1.0)
    weight_decay: float = spec(1.0e-4, ge=0.0)
    warmup_steps: int = spec(100, ge=0)
    min_lr_ratio: float = spec(0.1, ge=0.0, le=1.0)
    grad_accum: int = spec(4, ge=1)
    grad_clip: float = spec(1.0, gt=0.0)
    kd_weight: float = spec(1.0, ge=0.0)
    kd_temperature: float = spec(1.0, gt=0.0)
    self_cond_p: float = spec(0.5, ge=0.0, le=1.0)
    cache_age_probs: list[float] = spec([0.34, 0.33, 0.33], nonempty=True, ge=0.0, le=1.0)
    max_context_tokens: int = spec(4096, ge=1)  # training: prompt + earlier canvases, last tokens kept
    checkpoint_every: int = spec(1000, ge=1)
    log_every: int = spec(50, ge=1)
    # the fusion's held-out loss (its objective on fixed SFT validation canvases with fixed draws),
    # every val_every steps and at the first and last, written as metrics/posttrain/<run>_eval.csv
    val_every: int = spec(1000, ge=1)
    val_canvases: int = spec(256, ge=1)  # validation canvases per evaluation (at most the split's)
    # fusion replicates: the fusion and the control also train with seeds seed + 1 .. seed +
    # replicates - 1 (checkpoints/replicates/dg_posttrain-s<seed>, models/replicates/dg_tadm-s<seed>,
    # ...); the run at `seed` stays the tables' main run. Table 1's accuracy se of the trained rows
    # takes the between-run variance from them (tadm.metrics.replicates); 1: none
    replicates: int = spec(1, ge=1)
    # sampling (DiffusionGemma's entropy-bound sampler)
    sample_steps: int = spec(48, ge=1)
    canvas_length: int = spec(256, ge=1)
    refresh_every: list[int] = spec([1, 2, 3], nonempty=True, unique=True, ge=1)
    entropy_bound: float = spec(0.1, gt=0.0)
    temperature: list[float] = spec([0.8, 0.4], length=2, gt=0.0)  # t_max -> t_min
    # Table 1
    tasks: list[Literal["arithmetic", "gsm8k", "humaneval", "mmlu_pro", "gpqa_diamond", "aime", "livecodebench"]] = spec(
        ["gsm8k", "humaneval", "gpqa_diamond", "mmlu_pro", "livecodebench", "aime"], nonempty=True, unique=True)
    task_sources: dict[str, str] = spec({})  # task -> hub id or local file (gsm8k: sft.gsm8k)
    eval_examples: int = spec(0, ge=0)  # per task; 0 = all
    # a cap on every benchmark's generation length (0: the paper's per-task lengths,
    # table1.PAPER_LENGTHS, 1,024 to 4,096 tokens); the paper dry run shrinks it with the rest
    max_new_tokens: int = spec(0, ge=0, le=1 << 20)
    eval_batch_size: int = spec(8, ge=1)
    # the training-free caches run beside TADM on the same base (names in tadm.registry.DG_CACHES,
    # tadm.caches.diffusiongemma), each at every K >= 2 of refresh_every (TADM's layer-call budgets);
    # [] leaves them out
    cache_methods: list[str] = spec(["naive", "feature"], unique=True, registry=DG_CACHES)
    # the feature cache's recomputed share of the canvas rows; 0: the share that matches TADM's layer
    # calls at the same K, (s + d - 1) / (L - 1) (tadm.caches.budget.matched_share)
    feature_cache_share: float = spec(0.0, ge=0.0, le=1.0)
    seeds: list[int] = spec([0, 1, 2], nonempty=True, unique=True, ge=0)
    # the training-free cache rows' sampling seeds, every seed of `seeds` and more ([]: `seeds`):
    # they are cheap rows whose accuracy moves most between sampling seeds
    cache_seeds: list[int] = spec([], unique=True, ge=0)
    # the refresh intervals at which Table 1 decodes every fusion replicate (besides the control's
    # replicates, at K = 1); []: the largest K of refresh_every. The main run decodes at every K
    replicate_refresh_every: list[int] = spec([], unique=True, ge=1)
    # seed of the post-train runs (the base's and the fusion's training: initialisation, data
    # order, per-step draws); the paper's is 42 (App. C.1). The SFT data keep the global seed.
    seed: int = spec(42, ge=0)
