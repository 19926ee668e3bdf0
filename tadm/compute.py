"""Forward FLOPs per token of the building blocks (multiply-add = 2 FLOPs).

Used to size profiles (the LM head's share of per-step compute), for the compute accounting of
the samplers (tadm.sampling.counters) and for the model FLOPs of a training step, the numerator
of MFU (`train_step_flops_per_token`; benchmarks/gpu_check). Norms, activations and softmax are
ignored: they are O(d) per token, negligible beside the matrix products counted here.
"""

from __future__ import annotations

from tadm.registry import METHODS  # each unit of tadm.methods states its formula with the blocks below


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


# ----------------------------------------------------------------------------- training steps

# E[fraction of positions masked] in training: t ~ U(eps, 1) and alpha_t = 1 - t (log-linear), so
# the expected masked fraction is E[t] ~ 1/2; the absorbing-state losses run their LM head on
# the masked rows only (tadm.losses.Readout)
MASKED_FRACTION = 0.5
TRAIN_FORWARD_BACKWARD = 3  # a training step's FLOPs: forward + backward (2x the forward)


def train_forward_flops(kind: str, cfg, vocab_size: int, seq_len: int, head_rows: float = MASKED_FRACTION) -> float:
    """Model forward FLOPs per token of one training pass of method `kind` (a run name of
    train.models) with model config `cfg` (d_model, mlp_ratio and the layer counts of a
    ModelConfig); `head_rows`: the fraction of positions an LM head projects (the masked rows;
    AR's head reads every position, ADLM's anchor head too, since its denoiser reads the anchor's
    distribution everywhere).

    Model FLOPs: what the objective needs, counted once. The LM-head chunks that training
    recomputes in backward (activation checkpointing of the readout, tadm.losses.row_losses) are
    hardware FLOPs, not model FLOPs, and are not counted (MFU's convention; FlopCounterMode on a
    real step counts them)."""
    if kind not in METHODS:
        raise ValueError(f"unknown training method {kind!r}")
    return METHODS[kind].forward_flops(kind, cfg, vocab_size, seq_len, head_rows)


def train_step_flops_per_token(kind: str, cfg, vocab_size: int, seq_len: int, head_rows: float = MASKED_FRACTION) -> float:
    """Model FLOPs per token of one training step (forward + backward = 3 x the forward): the
    numerator of MFU (tokens/s x this / peak FLOP/s)."""
    return TRAIN_FORWARD_BACKWARD * train_forward_flops(kind, cfg, vocab_size, seq_len, head_rows)
