"""The Diffusion Transformer (DiT) block shared by every model in this repo.

It follows MDLM's DiT (and ADLM's, which reuses it) with time conditioning switched off:

    x = x + gate_a * Attn(modulate(LN(x), shift_a, scale_a))        # rotary, bidirectional
    x = x + gate_m * MLP(modulate(LN(x), shift_m, scale_m))

where (shift, scale, gate) x 2 come from ``adaLN_modulation(c)`` (zero-initialised, so every
block starts as the identity). The conditioning vector c would normally embed the noise level;
with ``time_conditioning=False`` MDLM still runs its sigma embedder, on sigma = 0, so c is a
*learned constant*. :class:`ConditionEmbedder` reproduces exactly that.

Nothing here needs flash-attn: attention is ``F.scaled_dot_product_attention``, which picks
the best kernel available (flash / memory-efficient / math) on its own.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from tadm import runtime

COND_DIM = 128  # size of the conditioning vector c (MDLM's cond_dim)
FREQ_DIM = 256  # sinusoidal features fed to the condition embedder (MDLM's default)
ROPE_BASE = 10_000.0


# --------------------------------------------------------------------------- small pieces


class LayerNorm(nn.Module):
    """LayerNorm with a learned scale and no bias (MDLM's DiT norm)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: an affine transform whose parameters come from the conditioning vector."""
    return x * (1 + scale) + shift


def timestep_embedding(t: torch.Tensor, dim: int = FREQ_DIM, max_period: float = 10_000.0) -> torch.Tensor:
    """Sinusoidal features of a scalar time per row: (B,) -> (B, dim) = [cos(t f); sin(t f)]."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class ConditionEmbedder(nn.Module):
    """The constant conditioning vector c of a DiT without time conditioning.

    MDLM with ``time_conditioning=False`` feeds sigma = 0 through its timestep embedder
    (256 sinusoidal features -> Linear -> SiLU -> Linear) and applies SiLU to the result; the
    output is the same for every input but its weights are trained, so c is a learned constant.
    """

    def __init__(self, cond_dim: int = COND_DIM, freq_dim: int = FREQ_DIM):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))
        self.keep = False  # keep c between calls (`constant_conditioning`)
        self._memo: tuple[tuple, torch.Tensor] | None = None  # (key, c) while `keep`

    def compute(self) -> torch.Tensor:
        """c, computed afresh: (1, cond_dim)."""
        device = self.mlp[0].weight.device
        t = torch.zeros(1, device=device)  # sigma = 0: no time conditioning
        features = timestep_embedding(t, self.freq_dim).to(self.mlp[0].weight.dtype)
        return F.silu(self.mlp(features))

    def forward(self) -> torch.Tensor:
        """Return c with shape (1, cond_dim); it broadcasts over the batch.

        Inside `constant_conditioning` (a sampling run) and without gradients, c is computed
        once and reused while nothing it depends on changes -- the weights (the same tensors,
        storage, dtype and version counter) and the autocast state -- so a reverse step does not
        rebuild it (about ten small ops per call); the reused c is the tensor `compute()` returns
        then, bit for bit (tested). Elsewhere (training, or while a CUDA graph is captured) it
        is computed at every call."""
        weights = _weights_key(self.mlp) if self.keep and not torch.is_grad_enabled() and not _capturing() else None
        if weights is None:
            return self.compute()
        key = weights + _autocast_key(self.mlp[0].weight.device)
        if self._memo is None or self._memo[0] != key:
            self._memo = (key, self.compute())
        return self._memo[1]


@contextlib.contextmanager
def constant_conditioning(model: nn.Module) -> Iterator[nn.Module]:
    """Within this block every `ConditionEmbedder` of `model` computes its c once (per weights
    and autocast state) instead of at every call; on leaving, the kept vectors are dropped. For
    runs in which the weights do not change: a sampling run (`tadm.sampling.sample`)."""
    embedders = [m for m in model.modules() if isinstance(m, ConditionEmbedder)]
    previous = [m.keep for m in embedders]
    for m in embedders:
        m.keep = True
    try:
        yield model
    finally:
        for m, keep in zip(embedders, previous):
            m.keep = keep
            if not keep:
                m._memo = None


def _weights_key(module: nn.Module) -> tuple | None:
    """What identifies `module`'s weights as they are now: each parameter's identity, storage,
    dtype and version counter (bumped by every in-place change); None for weights made under
    inference mode (they keep no version counter)."""
    params = list(module.parameters())
    if any(p.is_inference() for p in params):
        return None
    return tuple((id(p), p.data_ptr(), p.dtype, p._version) for p in params)


def _autocast_key(device: torch.device) -> tuple:
    return runtime.autocast_state(device)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


# --------------------------------------------------------------------------- rotary


def rotary_cos_sin(seq_len: int, head_dim: int, device: torch.device | None = None,
                   base: float = ROPE_BASE) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (seq_len, head_dim), for positions 0..seq_len-1 (fp32).

    Channel i and channel i + head_dim/2 form a pair rotated by angle pos * base^(-2i/head_dim)
    (the "rotate half" layout of GPT-NeoX / MDLM).
    """
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., L, head_dim) by its position, so <R_m q, R_n k> depends on m - n only."""
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


# --------------------------------------------------------------------------- the block

# model.gelu -> nn.GELU's `approximate`: the released DiT's tanh approximation, or the exact erf form
GELU_APPROXIMATE = {"tanh": "tanh", "exact": "none"}


class SelfAttention(nn.Module):
    """Multi-head self-attention with rotary positions; bidirectional unless `causal`."""

    def __init__(self, d_model: int, n_heads: int, causal: bool = False):
        super().__init__()
        assert d_model % n_heads == 0 and (d_model // n_heads) % 2 == 0, "head dim must divide d and be even"
        self.n_heads = n_heads
        self.causal = causal
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        B, L, d = x.shape
        # (B, L, 3d) -> three tensors of (B, H, L, head_dim)
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        cos, sin = rope
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)  # values are not rotated
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(B, L, d))


class DiTBlock(nn.Module):
    """Pre-LN Transformer block with adaLN shift / scale / gate around attention and MLP."""

    def __init__(self, d_model: int, n_heads: int, mlp_ratio: int = 4, cond_dim: int = COND_DIM,
                 dropout: float = 0.0, causal: bool = False, gelu: str = "tanh"):
        super().__init__()
        self.norm1 = LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, causal)
        self.norm2 = LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, mlp_ratio * d_model),
            nn.GELU(approximate=GELU_APPROXIMATE[gelu]),  # model.gelu
            nn.Linear(mlp_ratio * d_model, d_model),
        )
        self.dropout = nn.Dropout(dropout)
        self.adaLN_modulation = nn.Linear(cond_dim, 6 * d_model)
        nn.init.zeros_(self.adaLN_modulation.weight)  # gates start at 0: the block is the identity
        nn.init.zeros_(self.adaLN_modulation.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        mods = self.adaLN_modulation(c)[:, None].chunk(6, dim=-1)  # each (B or 1, 1, d)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mods
        x = x + gate_a * self.dropout(self.attn(modulate(self.norm1(x), shift_a, scale_a), rope))
        x = x + gate_m * self.dropout(self.mlp(modulate(self.norm2(x), shift_m, scale_m)))
        return x


class DiTStack(nn.ModuleList):
    """`n_layers` DiT blocks applied in order, sharing one rotary table per call.

    A ModuleList, so parameters are named ``<stack>.<i>.attn.qkv.weight`` etc.
    """

    # train.residual bf16 (set by the trainer, not saved with the model): under autocast the
    # stream enters the blocks in autocast's dtype, so every residual add stays in it; False (the
    # default), an fp32 input stays fp32 (autocast promotes bf16 + fp32 adds to fp32)
    autocast_residual: bool = False

    def __init__(self, n_layers: int, d_model: int, n_heads: int, mlp_ratio: int = 4,
                 cond_dim: int = COND_DIM, dropout: float = 0.0, causal: bool = False, gelu: str = "tanh"):
        super().__init__(DiTBlock(d_model, n_heads, mlp_ratio, cond_dim, dropout, causal, gelu) for _ in range(n_layers))
        self.head_dim = d_model // n_heads

    def rope(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """`rotary_cos_sin(seq_len, head_dim, device)`, built once per (length, device) and kept
        (it depends on nothing else; the kept tables equal fresh ones bit for bit, tested). Built
        as ordinary tensors even under inference mode, so that training can use them too."""
        return _rope_table(seq_len, self.head_dim, torch.device(device))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        rope = self.rope(x.shape[1], x.device)
        if self.autocast_residual and torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        for block in self:
            x = block(x, c, rope)
        return x


def set_autocast_residual(model: nn.Module, on: bool) -> None:
    """train.residual: keep the residual stream of every DiT stack in `model` in autocast's dtype
    (True) or as its input comes (False)."""
    for m in model.modules():
        if isinstance(m, DiTStack):
            m.autocast_residual = on


_ROPE_TABLES: dict[tuple[int, int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
_ROPE_TABLES_MAX = 64  # distinct (length, head_dim, device) kept; more and the oldest is dropped


def _rope_table(seq_len: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (seq_len, head_dim, device)
    table = _ROPE_TABLES.get(key)
    if table is None or _capturing():
        with torch.inference_mode(False), torch.no_grad():
            table = rotary_cos_sin(seq_len, head_dim, device)
        if _capturing():  # a table made during a CUDA graph capture lives in the graph's pool
            return table
        if len(_ROPE_TABLES) >= _ROPE_TABLES_MAX:
            _ROPE_TABLES.pop(next(iter(_ROPE_TABLES)))
        _ROPE_TABLES[key] = table
    return table


class DiTFinalLayer(nn.Module):
    """Output head: LN + adaLN (shift, scale) + Linear(d, n_out). Zero-initialised like MDLM's,
    so a fresh model predicts uniform logits."""

    def __init__(self, d_model: int, n_out: int, cond_dim: int = COND_DIM):
        super().__init__()
        self.norm = LayerNorm(d_model)
        self.linear = nn.Linear(d_model, n_out)
        self.adaLN_modulation = nn.Linear(cond_dim, 2 * d_model)
        for layer in (self.linear, self.adaLN_modulation):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x (B, L, d) with c (B or 1, cond) -> (B, L, n_out); x (N, d) rows with c (1, cond) -> (N, n_out)."""
        mods = self.adaLN_modulation(c)
        shift, scale = mods.view(mods.shape[0], *([1] * (x.dim() - 2)), -1).chunk(2, dim=-1)
        return self.linear(modulate(self.norm(x), shift, scale))


def token_embedding(n_tokens: int, d_model: int) -> nn.Embedding:
    """Token embedding with MDLM's init (kaiming-uniform, i.e. U(-1/sqrt(d), 1/sqrt(d)))."""
    emb = nn.Embedding(n_tokens, d_model)
    nn.init.kaiming_uniform_(emb.weight, a=math.sqrt(5))
    return emb
