"""The pretraining sections: the transformer sizes (`model`) and the training run (`train`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tadm.config.fields import spec
from tadm.registry import METHODS


@dataclass
class ModelConfig:
    """Transformer sizes shared by MDLM, ADLM, TADM, SEDD and AR (paper: App. C.2)."""

    d_model: int = spec(768, ge=8)
    n_heads: int = spec(12, ge=1)
    mlp_ratio: int = spec(4, ge=1)
    mdlm_layers: int = spec(12, ge=1)
    anchor_layers: int = spec(12, ge=1)
    denoiser_layers: int = spec(6, ge=1)
    dropout: float = spec(0.0, ge=0.0, lt=1.0)
    # the MLP's GELU: "tanh" (the tanh approximation of the released MDLM / ADLM DiT) or "exact"
    # (erf; the same function to 5e-4, and ~3x cheaper than the approximation on a CPU)
    gelu: Literal["tanh", "exact"] = "tanh"


@dataclass
class TrainConfig:
    # run names registered in tadm.registry.METHODS (tadm.methods). The default is a literal, not
    # METHODS.names(): it is the profiles' training order (registration order is ar, sedd, mdlm,
    # ...), a unit defined later (a test's own) must not join every default run list, and reading
    # the registry would import tadm.methods (torch, the models) to build a config
    models: list[str] = spec(
        ["mdlm", "adlm", "tadm", "tadm_gamma0", "sedd", "ar"], nonempty=True, unique=True, registry=METHODS
    )
    steps: int = spec(1_000_000, ge=1)
    global_batch: int = spec(512, ge=1)
    micro_batch: int = spec(16, ge=1)
    lr: float = spec(3.0e-4, gt=0.0)
    # after warm-up: "constant" (MDLM's) or "cosine" down to min_lr_ratio x lr at the last step
    schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = spec(0.1, ge=0.0, le=1.0)
    betas: list[float] = spec([0.9, 0.999], length=2, ge=0.0, lt=1.0)
    eps: float = spec(1.0e-8, gt=0.0)
    weight_decay: float = spec(0.0, ge=0.0)
    warmup_steps: int = spec(2500, ge=0)
    grad_clip: float = spec(1.0, gt=0.0)
    ema: float = spec(0.9999, ge=0.0, lt=1.0)
    precision: Literal["fp32", "bf16"] = "bf16"
    # the DiT blocks' residual stream under bf16 autocast: fp32 (MDLM's released training, whose
    # autocast promotes each residual add to fp32) or bf16 (Megatron-LM's default without
    # --fp32-residual-connection: half the blocks' elementwise traffic; needs precision bf16)
    residual: Literal["fp32", "bf16"] = "fp32"
    gamma: float = spec(3.0e-3, ge=0.0)  # weight of TADM's anchor cross-entropy
    refresh_choices: list[int] = spec([1, 2, 4, 8], nonempty=True, unique=True, ge=1)  # K ~ U{...}
    budget_choices: list[int] = spec([128, 256, 512, 1024, 2048, 4096], nonempty=True, unique=True, ge=1)
    eval_every: int = spec(10_000, ge=1)
    eval_sequences: int = spec(256, ge=1)  # validation sequences scored at each evaluation
    checkpoint_every: int = spec(10_000, ge=1)
    log_every: int = spec(100, ge=1)
    # training replicates: each run of replicate_models also trains with seeds seed + 1 ..
    # seed + replicates - 1 (checkpoints/replicates/<run>-s<seed>); the run at `seed` stays the
    # one the tables show. The claims' between-run variance comes from them (1: none)
    replicates: int = spec(1, ge=1)
    replicate_models: list[str] = spec([], unique=True, registry=METHODS)
