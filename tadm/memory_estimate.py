"""Memory estimate behind ``python -m tadm check``: will the configured models fit the machine?

Nothing is built or allocated; the numbers come from closed formulas over the params.
Notation: d = model.d_model, m = model.mlp_ratio, n = the model's layer count, V' = vocabulary
+ 1 (the mask token; AR has no mask), C = 128 (the conditioning width, tadm.models.dit.COND_DIM),
b = train.micro_batch, s = packing.seq_len, a = activation bytes (4 for fp32, 2 for bf16
autocast on a GPU; the CPU trains in fp32 whatever train.precision says).

Parameters (tadm.models, exact up to a few small vectors; tests compare with the real count)::

    block   = (4 + 2m) d^2 + 6 C d + (m + 9) d          qkv, out, MLP, adaLN, norms
    head    = d V' + V' + 2 C d + 3 d                   LN + adaLN + Linear(d, V')
    P(mdlm, sedd, ar) = V' d + n_mdlm block + head + cond
    P(tadm)           = V' d + (n_anchor + n_denoiser) block + 2 head + 2 cond + fusion
    P(adlm)           = 2 V' d + (n_anchor + n_denoiser) block + 2 head + 2 cond
    fusion  = 14 d^2 + 10 d,   cond = 256 C + C^2 + 2 C

Training memory of one process (the largest model of train.models)::

    states      = 20 P bytes       fp32 weights 4 + gradients 4 + AdamW moments 8 + EMA 4
    activations = a b s [n (22 + 2m) d + k V']  +  4 n b H s^2 (CPU only)
                  n (22 + 2m) d: what one DiT block keeps for backward per token (x, the two
                  norms and modulations, q k v and their rotations, attention out, the
                  MLP's m d hidden twice, the gated sums, and the allocator's temporaries;
                  the constant 22 is fitted to measured peaks, see tests), k V': the output
                  heads' logits, their log-softmax and its gradient (k = 3 per head; TADM and
                  ADLM have two), H = model.n_heads: torch's CPU attention keeps the s x s
                  attention weights of every head; on a GPU the fused kernels keep none
    total       = states + activations

When the heads' logits do not fit, the readout checkpoints them (tadm.losses.row_losses: the
forward keeps no logits, backward recomputes one chunk of HEAD_CHUNK_ELEMENTS logits at a time):
the k V' term becomes 4 k HEAD_CHUNK_ELEMENTS bytes once. The trainer keeps the logits (no
head recomputation) when the first estimate fits and checkpoints when only the second does
(:func:`require_training`); ``tadm check`` accepts a run that fits either way.

The post-training base (posttrain.base_model)::

    local: the small DiffusionGemma of posttrain.base trained by dg_base (20 bytes per
      parameter as above; tokens b s with b = posttrain.base.batch_size and
      s = posttrain.max_context_tokens + posttrain.canvas_length; per layer and token
      22 h + 3 I + 3 k_e I_e activation values, + 4 H s^2 per layer and sequence on the CPU;
      h, I, k_e, I_e, H: hidden, intermediate, top_k_experts, moe_intermediate sizes, heads)
    hub id whose weights are in the local hub cache (downloaded before, or the dry run's
      stand-in): the parameters its safetensors headers hold, frozen, at posttrain.precision
    hub id naming its size (e.g. "...-26B-A4B-it"), not cached: that many parameters, frozen,
      at posttrain.precision (2 bytes for bf16); activations are not estimated
    anything else (a local directory): not estimated

The machine: with runtime.device cpu (or auto without CUDA) the physical RAM, or the cgroup
memory limit when lower, shared by runtime.nproc processes; with cuda / cuda:N (auto with
CUDA) the total memory of that GPU, one process per GPU. Total, not currently free, memory:
the check must give the same answer whatever else runs at the moment.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tadm.config import ModelConfig, Params
from tadm.errors import ConfigError, DataError
from tadm.registry import METHODS
from tadm.weights_header import read_weights

GIB = 1024 ** 3
COND = 128  # tadm.models.dit.COND_DIM
FREQ = 256  # tadm.models.dit.FREQ_DIM
STATE_BYTES = 20  # fp32 weights + gradients + two AdamW moments + EMA copy
LOGIT_COPIES = 3  # logits, log-softmax, its gradient
HEAD_CHUNK_ELEMENTS = 1 << 25  # logits of one head chunk (tadm.losses reads it: CHUNK_ELEMENTS)


@dataclass
class Estimate:
    """Bytes one training (or loading) process needs for one model."""

    name: str  # "train tadm", "posttrain base"
    parameters: int
    state_bytes: int  # weights and everything kept per weight
    activation_bytes: int
    note: str = ""  # what the numbers stand for

    @property
    def total(self) -> int:
        return self.state_bytes + self.activation_bytes


def block_parameters(d: int, m: int) -> int:
    """One DiT block: qkv, out, MLP, adaLN, norms."""
    return (4 + 2 * m) * d * d + 6 * COND * d + (m + 9) * d


def head_parameters(d: int, v: int) -> int:
    """An output head: LN + adaLN + Linear(d, V')."""
    return d * v + v + 2 * COND * d + 3 * d


def fusion_parameters(d: int) -> int:
    """TADM's fusion Phi."""
    return 14 * d * d + 10 * d


COND_PARAMS = FREQ * COND + COND * COND + 2 * COND  # the conditioning embedder


def layers(kind: str, m: ModelConfig) -> int:
    """Transformer layers of run `kind` (its unit in tadm.methods)."""
    return METHODS[kind].layers(m)


def heads(kind: str) -> int:
    return METHODS[kind].heads


def model_parameters(kind: str, m: ModelConfig, vocab_size: int) -> int:
    """Parameter count of run `kind` (see the module docstring's formula; each unit of
    tadm.methods states its own)."""
    return METHODS[kind].parameters(kind, m, vocab_size)


def _activation_bytes(p: Params, on_gpu: bool) -> int:
    return 2 if (on_gpu and p.train.precision == "bf16") else 4


def training_estimate(kind: str, p: Params, on_gpu: bool = False, keep_logits: bool = True) -> Estimate:
    """Weights, gradients, AdamW, EMA and one micro-batch's activations of `kind`, with the
    heads' logits kept for backward (`keep_logits`) or checkpointed (one chunk's, recomputed)."""
    m, v = p.model, p.tokenizer.vocab_size
    params = model_parameters(kind, m, v)
    a = _activation_bytes(p, on_gpu)
    tokens = p.train.micro_batch * p.packing.seq_len
    n = layers(kind, m)
    logits = LOGIT_COPIES * heads(kind) * (v + 1)
    per_token = n * (22 + 2 * m.mlp_ratio) * m.d_model + (logits if keep_logits else 0)
    attention = 0 if on_gpu else 4 * n * p.train.micro_batch * m.n_heads * p.packing.seq_len ** 2
    chunk = 0 if keep_logits else 4 * LOGIT_COPIES * heads(kind) * HEAD_CHUNK_ELEMENTS
    note = "" if keep_logits else ", heads checkpointed"
    return Estimate(f"train {kind}", params, STATE_BYTES * params, a * tokens * per_token + attention + chunk,
                    f"d_model {m.d_model} x {n} layers, micro_batch {p.train.micro_batch} x seq_len "
                    f"{p.packing.seq_len}{note}")


def fitting_training_estimate(kind: str, p: Params, available: int, on_gpu: bool) -> tuple[Estimate, bool]:
    """(the estimate `kind` trains under, whether its heads are checkpointed): the logits kept
    when that fits `available` bytes, else the smaller of the two (which may still not fit;
    checkpointing is smaller only when the logits exceed one chunk's)."""
    kept = training_estimate(kind, p, on_gpu)
    if kept.total <= available:
        return kept, False
    checkpointed = training_estimate(kind, p, on_gpu, keep_logits=False)
    return (checkpointed, True) if checkpointed.total < kept.total else (kept, False)


def largest_micro_batch(kind: str, p: Params, available: int, on_gpu: bool) -> int:
    """The largest train.micro_batch (dividing train.global_batch into a multiple of
    runtime.nproc micro-batches) with which run `kind` fits `available` bytes, its logits kept
    or checkpointed; 0 when not even 1 fits. What
    ``tadm check`` suggests: the micro-batch is part of a run's identity (each micro-batch draws
    its own noise), so it is set in the params, never changed behind a run's back."""
    best = 0
    for m in range(1, p.train.global_batch + 1):
        if p.train.global_batch % m or (p.train.global_batch // m) % p.runtime.nproc:
            continue
        q = dataclasses.replace(p, train=dataclasses.replace(p.train, micro_batch=m))
        if fitting_training_estimate(kind, q, available, on_gpu)[0].total <= available:
            best = m
    return best


def require_training(kind: str, p: Params, source: str = "params") -> bool:
    """The trainer's check of run `kind` against this machine: whether its heads must be
    checkpointed (False: the logits are kept and no head forward is recomputed), or a one-line
    ConfigError naming model when it fits neither way."""
    available, where, on_gpu = machine_memory(p)
    e, checkpointed = fitting_training_estimate(kind, p, available, on_gpu)
    _refuse_if_too_big(e, "model", available, where, source)
    return checkpointed


def base_estimate(p: Params, on_gpu: bool = False) -> Optional[Estimate]:
    """The post-training base (see the module docstring), or None when it cannot be told."""
    pt = p.posttrain
    if pt.base_model == "local":
        b = pt.base
        h, depth, v = b.hidden_size, pt.shared_layers + pt.anchor_layers + pt.denoiser_layers, p.tokenizer.vocab_size
        attn = 2 * h * b.num_attention_heads * b.head_dim + 2 * h * b.num_key_value_heads * b.head_dim
        mlp = 3 * h * b.intermediate_size + b.num_experts * 3 * h * b.moe_intermediate_size + h * b.num_experts
        params = v * h + depth * (attn + mlp + 6 * h)
        s = pt.max_context_tokens + pt.canvas_length
        per_token = depth * (22 * h + 3 * b.intermediate_size + 3 * b.top_k_experts * b.moe_intermediate_size) + LOGIT_COPIES * v
        a = 2 if (on_gpu and pt.precision == "bf16") else 4
        attention = 0 if on_gpu else 4 * depth * b.batch_size * b.num_attention_heads * s * s
        return Estimate("train posttrain base (dg_base)", params, STATE_BYTES * params, a * b.batch_size * s * per_token + attention,
                        f"batch_size {b.batch_size} x {s} tokens")
    if Path(pt.base_model).exists():
        return None
    per = 2 if pt.precision == "bf16" else 4
    cached = cached_parameters(pt.base_model)
    if cached is not None:
        return Estimate("load posttrain base", cached, per * cached, 0,
                        f"{pt.base_model} (its cached weights' headers), frozen at {pt.precision}; activations not estimated")
    size = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)[Bb](?![A-Za-z])", pt.base_model.split("/")[-1])
    if size:
        params = int(float(size.group(1)) * 1e9)
        return Estimate("load posttrain base", params, per * params, 0,
                        f"{pt.base_model}, frozen at {pt.precision}; activations not estimated")
    return None


def cached_parameters(repo_id: str) -> Optional[int]:
    """Parameters of hub model `repo_id` counted from its safetensors headers when its weights
    are in the local hub cache (no download, no tensor read); None when they are not."""
    # lazy: huggingface_hub's cache lookup takes ~0.2 s to import; only a hub model's size needs it
    from huggingface_hub import try_to_load_from_cache

    for name in ("model.safetensors.index.json", "model.safetensors"):
        try:
            path = try_to_load_from_cache(repo_id, name)
        except Exception:  # noqa: BLE001 - a malformed id is not cached: fall back to the name
            return None
        if isinstance(path, str):
            try:
                return read_weights(Path(path).parent, DataError).elements
            except DataError:
                return None
    return None


def _ram_bytes() -> int:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < total:
            total = int(text)
    return total


def machine_memory(p: Params) -> tuple[int, str, bool]:
    """(bytes one process may use, what they are, on a GPU?) for runtime.device, resolved as
    every stage resolves it (tadm.runtime; asking for an absent GPU is its one-line error)."""
    import torch  # lazy: torch takes ~1.5 s to import; only the device's memory needs it, not the estimates

    from tadm import runtime  # lazy: tadm.runtime imports torch (~1.5 s); only the device's memory needs it

    device = runtime.resolve_device(p.runtime.device)
    if device.type != runtime.CPU.type:
        props = torch.cuda.get_device_properties(device)
        return props.total_memory, f"GPU memory ({device}, {props.name})", True
    ram, nproc = _ram_bytes(), p.runtime.nproc
    if nproc > 1:
        return ram // nproc, f"RAM per process ({ram / GIB:.1f} GiB shared by runtime.nproc {nproc})", False
    return ram, "RAM", False


def estimates(p: Params, on_gpu: bool = False, available: Optional[int] = None) -> list[Estimate]:
    """Each model of train.models (with `available` bytes: the estimate it trains under there,
    :func:`fitting_training_estimate`), then the post-training base where it can be told."""
    out = [training_estimate(kind, p, on_gpu) if available is None
           else fitting_training_estimate(kind, p, available, on_gpu)[0] for kind in dict.fromkeys(p.train.models)]
    base = base_estimate(p, on_gpu)
    return out + ([base] if base is not None else [])


def _refuse_if_too_big(e: Estimate, key: str, available: int, where: str, source: str) -> None:
    if e.total > available:
        parts = f"states {e.state_bytes / GIB:.1f} GiB"
        if e.activation_bytes:
            parts += f" + activations {e.activation_bytes / GIB:.1f} GiB ({e.note})"
        raise ConfigError(key, f"{e.name} needs about {e.total / GIB:.1f} GiB ({e.parameters / 1e6:,.0f}M parameters: "
                          f"{parts}) but the machine has {available / GIB:.1f} GiB of {where}; "
                          "shrink the model, the batch or the sequence length", source)


def check_memory(p: Params, source: str = "params.yaml", available: Optional[int] = None,
                 where: Optional[str] = None, on_gpu: Optional[bool] = None) -> list[Estimate]:
    """Every estimate, or a one-line ConfigError naming the first that exceeds the machine
    (`available` bytes; default: :func:`machine_memory`)."""
    if available is None:
        available, where, on_gpu = machine_memory(p)
    result = estimates(p, bool(on_gpu), available)
    for e in result:
        _refuse_if_too_big(e, "posttrain.base" if "base" in e.name else "model", available, where or "memory", source)
    return result


def require(p: Params, estimate, key: str, source: str = "params") -> Estimate:
    """The check of one entry point, before it allocates: `estimate(p, on_gpu)` (an Estimate)
    against this machine (:func:`machine_memory`); a one-line ConfigError naming `key`, the
    estimate and what is available when it cannot fit."""
    available, where, on_gpu = machine_memory(p)
    e = estimate(p, on_gpu)
    _refuse_if_too_big(e, key, available, where, source)
    return e


def module_estimate(name: str, build, note: str = "activations not estimated") -> Estimate:
    """Training states (STATE_BYTES per parameter) of the module `build()` makes, counted on the
    meta device (nothing allocated); for models without a closed formula (the trained judge)."""
    import torch  # lazy: torch takes ~1.5 s to import; only measuring a built module needs it

    with torch.device("meta"):
        n = sum(t.numel() for t in build().parameters())
    return Estimate(name, n, STATE_BYTES * n, 0, note)
