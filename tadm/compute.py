"""Forward FLOPs per token of the building blocks (multiply-add = 2 FLOPs).

Used to size profiles (the LM head's share of per-step compute) and, later, for the full
compute accounting of the samplers. Norms, activations and softmax are ignored: they are
O(d) per token, negligible beside the matrix products counted here.
"""

from __future__ import annotations


def dit_block_flops(d_model: int, seq_len: int, mlp_ratio: int = 4) -> int:
    """One bidirectional Transformer (DiT) block, per token: QKV + output projections
    (8 d^2), the MLP (4 mlp_ratio d^2), and attention scores + weighted sum (4 L d)."""
    return 8 * d_model**2 + 4 * mlp_ratio * d_model**2 + 4 * seq_len * d_model


def lm_head_flops(d_model: int, vocab_size: int) -> int:
    """The output projection d -> V, per token."""
    return 2 * d_model * vocab_size


def lm_head_share(d_model: int, seq_len: int, vocab_size: int, layers: int = 12, mlp_ratio: int = 4) -> float:
    """Fraction of a single-network (MDLM-like) forward pass spent in the LM head."""
    head = lm_head_flops(d_model, vocab_size)
    return head / (layers * dit_block_flops(d_model, seq_len, mlp_ratio) + head)


def dense_flops(n_in: int, n_out: int) -> int:
    """A Linear(n_in, n_out) applied to one token."""
    return 2 * n_in * n_out


def fusion_flops(d_model: int, hidden_ratio: int = 4) -> int:
    """TADM's gated residual fusion Phi, per token: the gate Linear(2d, d) and
    Delta = Linear(2d, h d) -> Linear(h d, d), i.e. 2 (2 d^2 + 2 h d^2 + h d^2) = (4 + 6 h) d^2."""
    return dense_flops(2 * d_model, d_model) + dense_flops(2 * d_model, hidden_ratio * d_model) + dense_flops(
        hidden_ratio * d_model, d_model
    )


def cached_layer_calls(steps: int, refresh_every: int, anchor_layers: int, denoiser_layers: int,
                       shared_layers: int = 0) -> int:
    """Transformer-layer calls of one reverse trajectory with the anchor cache (paper Sec. 3.3):
    C_cache = T (L_S + L_D) + ceil(T / K) L_A. K = 1 gives C_full = T (L_S + L_A + L_D)."""
    refreshes = -(-steps // refresh_every)
    return steps * (shared_layers + denoiser_layers) + refreshes * anchor_layers
