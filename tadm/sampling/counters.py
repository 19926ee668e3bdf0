"""Compute accounting for sampling, counted from the calls that really happen.

`instrument(model, counter)` puts forward hooks on the modules that do the work; while the
counter is `active` (the adapter switches it on around its own model calls only) every hook
adds what its module just did:

- Transformer-layer calls: one per DiT block forward, split by network. Blocks under
  ``anchor_blocks`` count as *anchor* layers; every other DiT block (``denoiser_blocks`` of
  ADLM / TADM, and all of MDLM's ``blocks``) counts as a *denoiser* layer. MDLM has a single
  network that runs every step; Table 2 normalises every method to MDLM's 12 layers x T, so
  MDLM's layers are booked under "denoiser", the network evaluated at every step. Per reverse
  trajectory this gives Table 2's compute column (paper Sec. 3.3 with L_S = 0, the shared
  network being the embedding):

      MDLM 12 T,   ADLM (12 + 6) T,   TADM  C_cache = 6 T + 12 ceil(T / K).

- FLOPs (a multiply-add is 2 FLOPs), from the shapes the module saw:
  DiT block           dit_block_flops(d, L, r) per token (QKV/out projections, MLP, attention);
  output head         lm_head_flops(d, n_out) per position it actually projects (read off its
                      output, so a head that projects fewer positions is charged less);
  TADM fusion Phi     fusion_flops(d, h) per token;
  ADLM's input map    dense_flops(V+1, d) per token (Linear from the anchor distribution).
  Free: embedding lookups, norms, activations, softmax, and the per-call conditioning vector c
  with its adaLN maps (O(d cond_dim) once per call, independent of B and L).

- Layer positions (`layer_tokens`): per layer call, the positions it ran (B x L): the work a KV
  cache saves (AR: n_layers B (L - 1) cached against n_layers B L (L - 1) / 2 without). Blocks
  run outside their forward (the AR model's cached step) are booked with `count_block`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Iterator

import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from tadm.compute import dense_flops, dit_block_flops, fusion_flops, lm_head_flops
from tadm.models.dit import DiTBlock, DiTFinalLayer
from tadm.models.fusion import Fusion

ANCHOR_STACK = "anchor_blocks"  # DiT blocks under this attribute are the anchor network


@dataclass
class ComputeCounter:
    """Totals over every trajectory since the last `reset` (FLOPs summed over the batch)."""

    model_calls: int = 0  # adapter calls that ran the network
    reused_calls: int = 0  # steps served by ddpm_cache without calling the network
    anchor_calls: int = 0  # anchor-network evaluations (ADLM: every call; TADM: cache refreshes)
    anchor_layer_calls: int = 0
    denoiser_layer_calls: int = 0
    flops: int = 0
    layer_tokens: int = 0  # positions run through Transformer layers: sum over layer calls of B * (positions)
    tokens: int = 0  # canvas positions generated: sum of B * L over trajectories
    trajectories: int = 0  # batched reverse processes run
    active: bool = field(default=False, repr=False, compare=False)

    @property
    def layer_calls(self) -> int:
        """All Transformer-layer calls: anchor + denoiser."""
        return self.anchor_layer_calls + self.denoiser_layer_calls

    @property
    def layer_calls_per_trajectory(self) -> float:
        """Table 2's compute column: Transformer-layer calls per generated sequence batch."""
        return self.layer_calls / max(self.trajectories, 1)

    @property
    def flops_per_token(self) -> float:
        """Forward FLOPs spent per generated canvas position."""
        return self.flops / max(self.tokens, 1)

    def start_trajectory(self, batch: int, seq_len: int) -> None:
        self.trajectories += 1
        self.tokens += batch * seq_len

    def reset(self) -> None:
        for f in dataclasses.fields(self):
            if f.name != "active":
                setattr(self, f.name, f.default)

    @contextlib.contextmanager
    def counting(self) -> Iterator["ComputeCounter"]:
        """Count the hooked modules' calls inside this block only."""
        previous, self.active = self.active, True
        try:
            yield self
        finally:
            self.active = previous

    def as_dict(self) -> dict[str, float]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "active"}
        out.update(layer_calls=self.layer_calls, layer_calls_per_trajectory=self.layer_calls_per_trajectory,
                   flops_per_token=self.flops_per_token)
        return out

    def copy(self) -> "ComputeCounter":
        return dataclasses.replace(self, active=False)


# --------------------------------------------------------------------------- hooks


def count_block(counter: ComputeCounter, module: DiTBlock, batch: int, positions: int, context: int,
                anchor: bool = False) -> None:
    """Book one call of DiT block `module` on `positions` positions per sequence, each attending
    to `context` keys (a full call: context = positions; a KV-cached step: the cached length)."""
    d = module.mlp[0].in_features
    mlp_ratio = module.mlp[0].out_features // d
    counter.flops += batch * positions * dit_block_flops(d, context, mlp_ratio)
    counter.layer_tokens += batch * positions
    if anchor:
        counter.anchor_layer_calls += 1
    else:
        counter.denoiser_layer_calls += 1


def _block_hook(counter: ComputeCounter, anchor: bool):
    def hook(module: DiTBlock, args: tuple, output) -> None:
        if counter.active:
            B, L, _ = args[0].shape
            count_block(counter, module, B, L, L, anchor)

    return hook


def _head_hook(counter: ComputeCounter):
    def hook(module: DiTFinalLayer, args: tuple, output) -> None:
        if counter.active:  # output (B, L, n_out), or (N, n_out) for rows
            counter.flops += output[..., 0].numel() * lm_head_flops(module.linear.in_features, output.shape[-1])

    return hook


def _fusion_hook(counter: ComputeCounter):
    def hook(module: Fusion, args: tuple, output) -> None:
        if counter.active:
            B, L, d = output.shape
            counter.flops += B * L * fusion_flops(d, module.delta[0].out_features // d)

    return hook


def _dense_hook(counter: ComputeCounter):
    def hook(module: nn.Linear, args: tuple, output) -> None:
        if counter.active:
            counter.flops += output[..., 0].numel() * dense_flops(module.in_features, module.out_features)

    return hook


def instrument(model: nn.Module, counter: ComputeCounter) -> list[RemovableHandle]:
    """Hook every counted module of `model` (see module docstring); returns the hook handles.

    Top-level Linear layers (ADLM's ``denoiser_in``) are counted as dense maps; Linear layers
    inside blocks, heads and the fusion are covered by those modules' formulas.
    """
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, DiTBlock):
            hook = _block_hook(counter, anchor=name.split(".")[0] == ANCHOR_STACK)
        elif isinstance(module, DiTFinalLayer):
            hook = _head_hook(counter)
        elif isinstance(module, Fusion):
            hook = _fusion_hook(counter)
        elif isinstance(module, nn.Linear) and name and "." not in name:
            hook = _dense_hook(counter)
        else:
            continue
        handles.append(module.register_forward_hook(hook))
    return handles
