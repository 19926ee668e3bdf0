"""A step-time model of training and sampling on one GPU: projected MFU and tokens/s.

No GPU has run this project's paper profile, so its speed on an H100 / H200 is projected from
the code's work per step and a few hardware efficiencies, all stated here (`Gpu`, `Code`):

    step time = GEMMs / (peak x gemm_efficiency)             the blocks, the fusion, the LM heads
              + attention / (peak x attention_efficiency)      fused (flash) attention
              + bytes of elementwise passes / (HBM x elementwise_efficiency)
              + host syncs x sync_seconds                      each drains the launch queue
              + optimizer and EMA traffic, per step / micro-batches per process
              + gradient all-reduce not hidden behind backward

for a training micro-batch (MFU = model FLOPs / (time x peak): `tadm.compute` counts the model
FLOPs, the masked rows' mean, not the rows a readout pads to its capacity), and

    step time = max(host time, device time)   with no host read in the step (the device runs
                                              ahead of the host, which queues kernels)
              = host time + device time        with a read every step (each waits for the other)

for a sampling step, host time = kernels launched x launch_seconds (one launch per captured CUDA
graph). The efficiencies are assumptions, not measurements: `benchmarks/gpu_check` section (a)
measures training MFU and (c) sampling tokens/s, and its numbers replace these where they exist.
`benchmarks/step_time.py` prints the projections docs/gpus.md quotes.

    >>> from tadm.step_time import H100, Code, training_step
    >>> s = training_step("tadm", paper_params, H100, Code())        # the code as it is
    >>> round(s.mfu, 2), s.seconds                                   # projected MFU, one micro-batch
"""

from __future__ import annotations

from dataclasses import dataclass

from tadm import compute
from tadm.config import Params
from tadm.forward_process import masked_rows_capacity
from tadm.methods.base import EPS
from tadm.registry import METHODS


@dataclass(frozen=True)
class Gpu:
    """One GPU: datasheet peaks and the fractions of them the kernels are assumed to reach."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    hbm_bytes_per_s: float
    link_bytes_per_s: float  # NVLink, per direction (the all-reduce's ring)
    gemm_efficiency: float = 0.70  # cuBLAS bf16 at d = 768 shapes with >= 16k rows
    attention_efficiency: float = 0.40  # flash attention forward + backward, head dim 64
    elementwise_efficiency: float = 0.70  # of HBM bandwidth, memory-bound kernels
    sync_seconds: float = 60e-6  # a host sync: the queue drains, the next kernels start late
    launch_seconds: float = 8e-6  # host time to issue one eager op (Python + dispatch + launch)


H100 = Gpu("H100 SXM (80 GB)", 989.4e12, 3.35e12, 450e9)
H200 = Gpu("H200 (141 GB)", 989.4e12, 4.8e12, 450e9)


@dataclass(frozen=True)
class Code:
    """What the code does, as the projection's switches (defaults: the code as it is)."""

    compiled_blocks: bool = True  # runtime.compile: Inductor fuses each block's elementwise chain
    host_syncs: int = 0  # per training micro-batch (boolean-mask gathers, pageable copies: 3 before)
    capacity_rows: bool = True  # readouts gather a fixed capacity (False: exactly the masked rows)
    kept_logits: bool = True  # heads' logits kept for backward (False: checkpointed, recomputed)
    # runtime.compile compiles each readout chunk (head, cast, cross-entropy and their backward:
    # Method.compile_heads): the cast and log-softmax fuse into one reduction over bf16 logits
    compiled_head: bool = True
    residual_bytes: int | None = None  # the residual stream's element size; None: train.residual's (sampling: 4)
    micro_batch: int | None = None  # None: train.micro_batch
    sampling_plan: bool = True  # sampling: no host read per step (masks drawn ahead)
    cuda_graphs: bool = False  # sampling: the blocks replayed from CUDA graphs


# elementwise passes over a (tokens, d) tensor per DiT block, forward (read + write = 2 units
# per pass of a d-wide tensor; the MLP's 4d-wide GELU counts 4): eager ops one by one (norms,
# adaLN modulate and gate, residual adds, rotary, GELU, casts) against Inductor's fused chains
EAGER_UNITS, COMPILED_UNITS = 44, 20
BACKWARD_FACTOR = 2  # backward's elementwise traffic, in forwards
ATTENTION_BACKWARD = 2.5  # flash attention's backward, in forwards of FLOPs
# bytes per logit of one head's cross-entropy, forward + backward: eager (bf16 logits written,
# cast to fp32, log-softmax, its gradient, cast back) against a compiled chunk (the GEMM writes
# bf16 logits; one fused reduction reads them; backward reads them once and writes the bf16
# gradient the GEMMs read)
CE_BYTES_EAGER, CE_BYTES_COMPILED = 30, 8
OPTIMIZER_BYTES = 44  # per parameter and step: fused AdamW (28) + the fp32 EMA (12) + zeroing (4)
ALLREDUCE_HIDDEN = 0.8  # share of the gradient all-reduce overlapped with backward (DDP buckets)
# sampling: eager ops per DiT block forward, and per step of the loop around the network
# (transition rates, uniforms, masks, gather, SUBS, nucleus, draw, scatter)
OPS_PER_BLOCK, OPS_PER_STEP = 26, 60
NUCLEUS_PASSES = 12  # float64 passes over a decoded row's V probabilities (softmax, sort, cumsum, draw)


@dataclass
class StepTime:
    """A projected step: its seconds by part, the model FLOPs it does and what they give."""

    parts: dict[str, float]
    model_flops: float
    tokens: int
    peak_flops: float

    @property
    def seconds(self) -> float:
        return sum(self.parts.values())

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.seconds * self.peak_flops)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def _block_units(code: Code) -> float:
    return COMPILED_UNITS if code.compiled_blocks else EAGER_UNITS


def training_step(kind: str, p: Params, gpu: Gpu, code: Code = Code(), processes: int | None = None) -> StepTime:
    """One training micro-batch of run `kind` at params `p` on `gpu` (see the module docstring);
    `processes`: the data-parallel world (default runtime.nproc) for the optimizer's and the
    all-reduce's share."""
    if kind not in METHODS:
        raise ValueError(f"unknown training method {kind!r}")
    m, unit = p.model, METHODS[kind]
    B, L = code.micro_batch or p.train.micro_batch, p.packing.seq_len
    V, d, tokens = p.tokenizer.vocab_size, m.d_model, B * L
    world = processes or p.runtime.nproc
    layers = unit.layers(m)
    gemm_per_token = layers * (compute.dit_block_flops(d, L, m.mlp_ratio) - 4 * L * d)
    gemm_per_token += unit.train_extra_flops(m, V)  # TADM: the fusion
    attention_per_token = layers * 4 * L * d
    # the heads' rows (Method.train_head_rows): each readout's capacity (or the mean masked rows)
    mean = compute.MASKED_FRACTION * tokens

    def readout_rows(shift: float = 0.0) -> float:
        return masked_rows_capacity(B, L, EPS, shift) if code.capacity_rows else mean

    head_rows = sum(unit(kind, p).train_head_rows(tokens, readout_rows))
    head_flops = head_rows * compute.lm_head_flops(d, V + 1)
    passes = compute.TRAIN_FORWARD_BACKWARD + (0 if code.kept_logits else 1)
    residual = code.residual_bytes or (2 if p.train.residual == "bf16" else 4)
    elementwise_bytes = layers * _block_units(code) * (1 + BACKWARD_FACTOR) * tokens * d * (residual + 2) / 2
    ce_bytes = head_rows * (V + 1) * (CE_BYTES_COMPILED if code.compiled_head else CE_BYTES_EAGER)
    params = unit.parameters(kind, m, V)
    micro_per_process = max(1, p.train.global_batch // (B * world))
    allreduce = 2 * (world - 1) / world * 4 * params / gpu.link_bytes_per_s if world > 1 else 0.0
    parts = {
        "GEMMs (blocks, fusion)": compute.TRAIN_FORWARD_BACKWARD * gemm_per_token * tokens
                                  / (gpu.peak_flops * gpu.gemm_efficiency),
        "LM heads (GEMMs)": passes * head_flops / (gpu.peak_flops * gpu.gemm_efficiency),
        "attention": attention_per_token * tokens * (1 + ATTENTION_BACKWARD) / (gpu.peak_flops * gpu.attention_efficiency),
        "elementwise (blocks)": elementwise_bytes / (gpu.hbm_bytes_per_s * gpu.elementwise_efficiency),
        "cross-entropy (elementwise)": ce_bytes / (gpu.hbm_bytes_per_s * gpu.elementwise_efficiency),
        "host syncs": code.host_syncs * gpu.sync_seconds,
        "optimizer + EMA": OPTIMIZER_BYTES * params / (gpu.hbm_bytes_per_s * gpu.elementwise_efficiency)
                           / micro_per_process,
        "all-reduce (not hidden)": (1 - ALLREDUCE_HIDDEN) * allreduce / micro_per_process,
    }
    model = compute.train_step_flops_per_token(kind, m, V, L) * tokens
    return StepTime(parts, model, tokens, gpu.peak_flops)


def sampling_step(kind: str, p: Params, gpu: Gpu, batch: int, steps: int, refresh_every: int = 1,
                  code: Code = Code()) -> StepTime:
    """One reverse step of run `kind` (a name of train.models: mdlm, adlm, tadm, ...) sampling
    `batch` canvases of sample.canvas_length in `steps` steps, TADM's anchor refreshed every
    `refresh_every` steps (averaged over a cycle: `Method.sampling_layers`). Tokens per step:
    batch x L / steps (a trajectory's tokens over its steps); the head and the nucleus draw run
    on the rows decoded at the step (batch x L / steps on average)."""
    if kind not in METHODS:
        raise ValueError(f"unknown method {kind!r}")
    m, L, V, d = p.model, p.sample.canvas_length, p.tokenizer.vocab_size, p.model.d_model
    unit, tokens = METHODS[kind], batch * L
    layers, extra = unit.sampling_layers(m, refresh_every), unit.sampling_extra_flops(m, V)
    decoded = tokens / steps
    block = compute.dit_block_flops(d, L, m.mlp_ratio)
    gemm = layers * (block - 4 * L * d) * tokens + extra * tokens + decoded * compute.lm_head_flops(d, V + 1)
    attention = layers * 4 * L * d * tokens
    elementwise = layers * _block_units(code) * tokens * d * ((code.residual_bytes or 4) + 2) / 2 \
        + decoded * (V + 1) * 8 * NUCLEUS_PASSES
    device = gemm / (gpu.peak_flops * gpu.gemm_efficiency) + attention / (gpu.peak_flops * gpu.attention_efficiency) \
        + elementwise / (gpu.hbm_bytes_per_s * gpu.elementwise_efficiency)
    launches = (layers if code.cuda_graphs else layers * OPS_PER_BLOCK) + OPS_PER_STEP
    host = launches * gpu.launch_seconds
    if code.sampling_plan:
        parts = {"device": device, "host (not hidden)": max(0.0, host - device)}
    else:
        parts = {"device": device, "host": host, "host read": gpu.sync_seconds}
    flops = gemm + attention
    return StepTime(parts, flops, tokens / steps, gpu.peak_flops)


__all__ = ["Gpu", "H100", "H200", "Code", "StepTime", "training_step", "sampling_step"]
