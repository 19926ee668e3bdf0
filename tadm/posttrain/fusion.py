"""The post-train fusion module Phi (paper App. C.1): paired attention in a low-rank space.

At a refresh step the sampler caches two states of the same canvas: the shallow state
C0 = S(z_t0) and the deep anchor H0 = A(C0). At a later step it has only the current shallow
state c_t = S(z_t). The fusion corrects the stale anchor with what changed since the refresh:

    q = W_q RMSNorm(c_t)                               (r-dim queries, current positions)
    k = W_k [RMSNorm(C0); RMSNorm(H0)]                 (paired keys: shallow and deep cached state)
    v = W_v (c_t - C0)                                 (values: the shallow change only)
    o = MultiHeadAttention(q, k, v)                    (bidirectional over the canvas)
    h~ = H0 + sigmoid(w_g . q + b_g) * W_up o          (gated low-rank correction)

Choices the paper leaves open and made here: the values carry the shallow change and have no
bias, so the correction is *structurally* zero -- exactly, in any precision -- whenever
c_t == C0 (at the refresh step, and whenever nothing moved); the gate is one scalar per
position from the queries, its bias starts at -3 (sigmoid = 0.047); W_up starts at zero, so
an untrained fusion returns H0 exactly and TADM at K = 1 is the frozen model. Heads of 64
channels in the r-space (r = 256 -> 4 heads).

Size (:func:`parameter_count`): 5 d r + r + 1 + 3 d -- W_q d x r, W_k 2d x r (the paired keys),
W_v d x r, W_up r x d, the gate r + 1, three RMSNorm gains of d. At DiffusionGemma-26B's hidden
size d = 2816 and r = 256 that is 3,613,185 (3.61M); the paper quotes "approximately 3.1M"
(App. C.1) without the formula. ~3.1M is about 4.3 d r at that size: four d x r blocks plus
three r x r maps in the low-rank space and the norms (4 d r + 3 r^2 + 3 d = 3,088,640) would
give it -- e.g. keys that read one d-dimensional state instead of the pair [C0; H0]; ours keeps
the fifth d x r block so that a key sees both cached states (docs/deviations.md).

Table 1's fresh-anchor control (``values="state"``): the same module with v = W_v c_t, used
with a freshly computed anchor (c_t = C0, H0 = A(c_t)) at every step. Its correction does not
vanish at c_t == C0, so the control fine-tunes with the same parameters, objective, data and
steps as TADM while never reusing an anchor -- the row TADM's accuracy is compared against to
isolate anchor reuse from the CE term's fine-tuning.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

HEAD_DIM = 64
DIFFUSIONGEMMA_HIDDEN = 2816  # google/diffusiongemma-26B-A4B-it text_config.hidden_size
PAPER_RANK = 256
PAPER_QUOTED = 3.1e6  # App. C.1: "approximately 3.1M fusion parameters"


def parameter_count(hidden_size: int, rank: int) -> int:
    """Parameters of :class:`PairedAttentionFusion` (d = hidden_size, r = rank):
    q d*r + k 2d*r + v d*r + up r*d + gate (r + 1) + three RMSNorm gains 3d."""
    d, r = hidden_size, rank
    return 5 * d * r + r + 1 + 3 * d


def paper_size_count() -> int:
    """The fusion's parameter count at DiffusionGemma-26B's size, counted on a module built on
    the meta device (nothing allocated)."""
    with torch.device("meta"):
        return PairedAttentionFusion(DIFFUSIONGEMMA_HIDDEN, PAPER_RANK).num_parameters


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight.to(x.dtype)


class PairedAttentionFusion(nn.Module):
    """h~ = Phi(c_t; C0, H0); see the module docstring."""

    VALUES = ("change", "state")

    def __init__(self, hidden_size: int, rank: int = 256, gate_bias: float = -3.0, values: str = "change"):
        super().__init__()
        if values not in self.VALUES:
            raise ValueError(f"fusion values: {values!r} is not one of {self.VALUES}")
        self.hidden_size, self.rank, self.values = hidden_size, rank, values
        self.heads = max(1, rank // HEAD_DIM)
        if rank % self.heads:
            raise ValueError(f"posttrain.fusion_rank: {rank} is not a multiple of the head count {self.heads}")
        self.norm_c, self.norm_c0, self.norm_h0 = RMSNorm(hidden_size), RMSNorm(hidden_size), RMSNorm(hidden_size)
        self.q = nn.Linear(hidden_size, rank, bias=False)
        self.k = nn.Linear(2 * hidden_size, rank, bias=False)
        self.v = nn.Linear(hidden_size, rank, bias=False)  # no bias: v = 0 exactly when c_t == C0 ("change")
        self.up = nn.Linear(rank, hidden_size, bias=False)
        self.gate = nn.Linear(rank, 1)
        self.reset_parameters(gate_bias)

    def reset_parameters(self, gate_bias: float = -3.0) -> None:
        for lin in (self.q, self.k, self.v, self.gate):
            nn.init.normal_(lin.weight, std=1.0 / math.sqrt(lin.in_features))
        nn.init.zeros_(self.up.weight)  # training starts from the frozen model
        nn.init.constant_(self.gate.bias, gate_bias)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.heads, self.rank // self.heads).transpose(1, 2)

    def correction(self, c: torch.Tensor, c0: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        """The gated correction added to H0 (zero when c == c0)."""
        dtype = self.q.weight.dtype
        c, c0, h0 = c.to(dtype), c0.to(dtype), h0.to(dtype)
        q = self.q(self.norm_c(c))
        k = self.k(torch.cat([self.norm_c0(c0), self.norm_h0(h0)], dim=-1))
        v = self.v(c - c0 if self.values == "change" else c)
        o = F.scaled_dot_product_attention(self._split(q), self._split(k), self._split(v))
        o = o.transpose(1, 2).reshape(q.shape)
        return torch.sigmoid(self.gate(q)) * self.up(o)

    def forward(self, c: torch.Tensor, c0: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        return h0 + self.correction(c, c0, h0).to(h0.dtype)

    def flops(self, tokens: int) -> int:
        """Multiply-adds x 2 of one call over `tokens` canvas positions (projections + attention)."""
        d, r = self.hidden_size, self.rank
        proj = tokens * (d * r + 2 * d * r + d * r + r * d + r)
        attn = 2 * tokens * tokens * r
        return 2 * (proj + attn)

    @property
    def fresh(self) -> bool:
        """The fresh-anchor control: applied at refresh steps too (its correction reads c_t itself)."""
        return self.values == "state"

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
