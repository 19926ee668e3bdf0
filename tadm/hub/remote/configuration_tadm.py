"""Configuration of a TADM hub checkpoint (standalone: imports transformers only).

This file travels with every directory `python -m tadm.hub export` writes, next to
``modeling_tadm.py`` and ``generation_tadm.py``; transformers imports it when a checkpoint is
loaded with ``trust_remote_code=True`` (config.json's ``auto_map`` names its classes), so it
must not import the ``tadm`` package.

config.json holds (read as attributes; no key is renamed):

    model_type      the family: mdlm, sedd, adlm, tadm or ar
    vocab_size      V, the vocabulary; masked families embed V + 1 tokens (the mask token id is V)
    seq_len         the sequence length the network was trained on
    model           the network's sizes: d_model, n_heads, mlp_ratio, mdlm_layers, anchor_layers,
                    denoiser_layers, dropout, gelu ("tanh" or "exact")
    format_version  1 (the project's own loader, ``tadm.models.load_pretrained``, reads it too)
    noise_schedule  {"type": "loglinear", "eps": 0.001}
    method          {run, family, title, objective, ...}: what trained it (informative)

plus transformers' standard names as aliases (hidden_size, num_attention_heads, ...). One class
per family, each with the family as its ``model_type``, over a shared base.
"""

from __future__ import annotations

from transformers import PretrainedConfig

FAMILIES = ("mdlm", "sedd", "adlm", "tadm", "ar")
MODEL_FIELDS = ("d_model", "n_heads", "mlp_ratio", "mdlm_layers", "anchor_layers", "denoiser_layers", "dropout",
                "gelu")


class TadmHubConfig(PretrainedConfig):
    """The shared base: config.json's keys become attributes (no custom ``__init__``, so any
    transformers version accepts the file as written). `sizes()` checks and returns the network's."""

    model_type = ""

    def sizes(self) -> dict:
        """The ``model`` mapping with every network field present; a ValueError (one line
        naming the key) when one is missing."""
        model = getattr(self, "model", None)
        if not isinstance(model, dict):
            raise ValueError(f"config.json: 'model' must be a mapping of {', '.join(MODEL_FIELDS)}, got {model!r}")
        missing = [k for k in MODEL_FIELDS if k not in model]
        if missing:
            raise ValueError(f"config.json: model lacks {', '.join(missing)}")
        for key in ("vocab_size", "seq_len"):
            value = getattr(self, key, None)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config.json: {key} must be a positive integer, got {value!r}")
        return dict(model)

    def validate(self):
        """transformers' class validators (v5), with `validate_token_ids` the one below: the
        generic one reads ids >= vocab_size as out of the vocabulary, and the mask token is V."""
        for validator in getattr(PretrainedConfig, "__class_validators__", ()):
            if getattr(validator, "__name__", "") != "validate_token_ids":
                validator(self)
        self.validate_token_ids()

    def validate_token_ids(self):
        """The special token ids lie in 0..V (V: the mask token, the embedding's extra row); the
        generic check (ids below vocab_size) would flag the mask token on every load."""
        V = getattr(self, "vocab_size", None)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id"):
            value = getattr(self, name, None)
            if isinstance(V, int) and isinstance(value, int) and not 0 <= value <= V:
                raise ValueError(f"config.json: {name} must lie in 0..{V}, got {value}")

    @property
    def mask_id(self) -> int | None:
        """The absorbing mask token's id (V), None for the autoregressive family."""
        return None if self.model_type == "ar" else self.vocab_size


class MDLMConfig(TadmHubConfig):
    model_type = "mdlm"


class SEDDConfig(TadmHubConfig):
    model_type = "sedd"


class ADLMConfig(TadmHubConfig):
    model_type = "adlm"


class TADMConfig(TadmHubConfig):
    model_type = "tadm"


class ARConfig(TadmHubConfig):
    model_type = "ar"


CONFIG_CLASSES = {c.model_type: c for c in (MDLMConfig, SEDDConfig, ADLMConfig, TADMConfig, ARConfig)}

__all__ = ["TadmHubConfig", "MDLMConfig", "SEDDConfig", "ADLMConfig", "TADMConfig", "ARConfig", "CONFIG_CLASSES",
           "FAMILIES"]
