"""Configuration of a TADM:Post-train hub directory (standalone: imports transformers only).

This file travels with every directory ``python -m tadm.hub export-fusion`` writes, next to
``modeling_tadm_posttrain.py``; transformers imports it when the directory is loaded with
``trust_remote_code=True``, so it must not import the ``tadm`` package.

config.json holds (read as attributes; no key is renamed):

    base_model_name_or_path  the frozen DiffusionGemma base: a hub id, an absolute path, or a path
                             starting with ./ or ../ (looked up beside this directory first)
    shared_layers, anchor_layers, denoiser_layers
                             the split S / A / D of the base's canvas decoder (they add up to
                             its num_hidden_layers)
    hidden_size              d, the base's hidden size (the fusion's input and output)
    fusion_rank, fusion_heads, fusion_values
                             the fusion's low-rank width r, its attention heads, and its values:
                             "change" (TADM: v = W_v (c - C0)) or "state" (the fresh-anchor control)
    rms_norm_eps             the fusion's RMSNorm epsilon
    refresh_every            the default K of ``generate`` (the anchor recomputed every K steps)
    base_dtype               the dtype the base is loaded in unless ``dtype=`` says otherwise
                             (the fusion itself stays float32, as it was trained)
"""

from __future__ import annotations

from transformers import PretrainedConfig

FIELDS = ("base_model_name_or_path", "shared_layers", "anchor_layers", "denoiser_layers", "hidden_size",
          "fusion_rank", "fusion_heads", "fusion_values", "rms_norm_eps", "refresh_every")


class TADMPostTrainConfig(PretrainedConfig):
    """config.json's keys become attributes (no custom ``__init__``, so any transformers version
    accepts the file as written); `check()` validates them in one line."""

    model_type = "tadm_posttrain"

    def check(self) -> "TADMPostTrainConfig":
        missing = [k for k in FIELDS if getattr(self, k, None) is None]
        if missing:
            raise ValueError(f"config.json: {', '.join(missing)} missing (not a TADM:Post-train hub directory)")
        for key in ("shared_layers", "anchor_layers", "denoiser_layers", "hidden_size", "fusion_rank", "fusion_heads",
                    "refresh_every"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
        if self.fusion_values not in ("change", "state"):
            raise ValueError(f"config.json: fusion_values must be 'change' or 'state', got {self.fusion_values!r}")
        if self.fusion_rank % self.fusion_heads:
            raise ValueError(f"config.json: fusion_rank {self.fusion_rank} is not a multiple of fusion_heads "
                             f"{self.fusion_heads}")
        return self

    @property
    def split(self) -> tuple[int, int, int]:
        """(shared, anchor, denoiser) decoder-layer counts."""
        return self.shared_layers, self.anchor_layers, self.denoiser_layers


__all__ = ["TADMPostTrainConfig"]
