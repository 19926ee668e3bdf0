"""What the LLaDA caches share: the depth split and TADM's budget on LLaDA (`scaled_split`,
`tadm_share`), the interval check, and the base backend (`LladaCacheBackend`: the full pass's
head and key mask)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from tadm.asrd.backends import LladaBackend
from tadm.errors import ConfigError
from tadm.models.llada import LladaBlock, padding_keys

SPLIT = (2, 22, 8)  # front / middle / back of LLaDA-8B's 32 layers (TADM's 2/20/8 of 30, scaled)


def scaled_split(n_layers: int, split: tuple[int, int, int] = SPLIT) -> tuple[int, int, int]:
    """`split` (front, middle, back) scaled to `n_layers`: front and back rounded, the back at
    least 1 layer (it and the head run every pass), the middle the rest (at least 1)."""
    total = sum(split)
    s, d = round(split[0] * n_layers / total), max(1, round(split[2] * n_layers / total))
    if n_layers - s - d < 1:
        raise ConfigError("asrd.llada_cache_methods", f"naive reuse needs at least 2 layers, the model has {n_layers}")
    return s, n_layers - s - d, d


def tadm_share(n_layers: int, k: int, split: tuple[int, int, int] = SPLIT) -> float:
    """(s + d + a / K) / L: TADM's layer calls per pass at refresh interval K, relative to the
    full model, with `split` scaled to this depth -- the budget a row refreshed every K matches."""
    s, a, d = scaled_split(n_layers, split)
    return (s + d + a / k) / n_layers


def check_every(value, name: str, block_ok: bool = False) -> None:
    if block_ok and value == "block":
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        allowed = '"block" or an integer >= 1' if block_ok else "an integer >= 1"
        raise ConfigError(name, f"must be {allowed}, got {value!r}")


class LladaCacheBackend(LladaBackend):
    """What the LLaDA caches share: the full pass of `LladaModel.forward` with K/V capture, the
    head, and the key mask of the current padding (`key_mask`, one place a test can change)."""

    budget_x: float | None = None

    def _check(self, model) -> None:
        if getattr(model, "model_type", None) != "llada":
            raise ConfigError("asrd model", f"{type(self).__name__} runs a LLaDA model, got {type(model).__name__}")

    @property
    def blocks(self) -> list[LladaBlock]:
        return self.model.blocks

    def key_mask(self, shape: tuple[int, int], device: torch.device) -> Tensor | None:
        """The key mask of a full pass over the canvas: the padding mask's (B, 1, 1, N) or None."""
        return padding_keys(self._padding, shape, device)

    def _logits(self, x: Tensor) -> Tensor:
        """`LladaModel.forward` after the blocks, then LladaBackend's float32 and masked class."""
        t = self.model.transformer
        x = t["ln_f"](x)
        out = (F.linear(x, t["wte"].weight) if self.model.cfg.weight_tying else t["ff_out"](x)).float()
        out[..., self.mask_id] = float("-inf")
        return out
