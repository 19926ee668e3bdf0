"""What every model shares: the construction signature, the registry by model_type and the
strict, all-or-nothing loading of a state dict.

    model = build_model("tadm", cfg, vocab_size, seq_len)   # any registered model_type
    model.load_tensors(tensors)                             # every name, shape and dtype checked first

Saving and loading a checkpoint directory (config.json + model.safetensors) is
`tadm.models.io`; ``TadmModel.save_pretrained`` / ``load_weights`` call it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import torch
import torch.nn as nn

from tadm.config import ModelConfig
from tadm.models.io import CheckpointError, config_dict, load_weights, save_pretrained
from tadm.models.dit import GELU_APPROXIMATE

MAX_LISTED = 5  # mismatched tensors named in an error message before "+N more"

MODEL_REGISTRY: dict[str, type["TadmModel"]] = {}


# --------------------------------------------------------------------------- base class


class TadmModel(nn.Module):
    """Base of MDLM, ADLM, TADM, SEDD and AR: ``Cls(cfg, vocab_size, seq_len)``.

    Token ids 0..V-1 are the vocabulary; the absorbing mask token is ``mask_id == V``.
    Subclasses set ``model_type`` and are registered under it automatically.
    """

    model_type: str = ""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.model_type:
            MODEL_REGISTRY[cls.model_type] = cls

    def __init__(self, cfg: ModelConfig, vocab_size: int, seq_len: int):
        super().__init__()
        check_model_args(cfg, vocab_size, seq_len)
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.seq_len = seq_len

    @property
    def mask_id(self) -> int:
        return self.vocab_size

    def config_dict(self) -> dict:
        """config.json's content (`tadm.models.io.config_dict`)."""
        return config_dict(self)

    # ------------------------------------------------------------------ save / load (tadm.models.io)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write config.json and model.safetensors into `directory` (`tadm.models.io.save_pretrained`)."""
        return save_pretrained(self, directory)

    def load_weights(self, directory: str | Path) -> "TadmModel":
        """Load ``<directory>/model.safetensors`` into this model, strictly (`tadm.models.io.load_weights`)."""
        return load_weights(self, directory)

    def load_tensors(self, tensors: Mapping[str, torch.Tensor], source: str = "state dict") -> None:
        """Strict, all-or-nothing ``load_state_dict``: validate every name and shape first."""
        n, tally, listed = mismatch_report(self.state_dict(), tensors)
        if n:
            raise CheckpointError(
                f"{source} does not fit {type(self).__name__} "
                f"(d_model={self.cfg.d_model}, vocab_size={self.vocab_size}): {n} tensor(s) differ "
                f"{tally}: {listed}"
            )
        with torch.no_grad():
            self.load_state_dict(dict(tensors), strict=True)


# safetensors' dtype names -> torch dtypes (what a header says a tensor holds)
SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}


def _dtype_differs(saved: torch.dtype | None, model: torch.dtype, rule: str) -> bool:
    """Whether a saved tensor's dtype is refused for a model tensor's: "exact" (our own
    checkpoints: fp16 where fp32 is expected too), "kind" (a release whose floating weights may be
    bf16 or fp32, cast on load: only integer vs floating). None: not known (never refused)."""
    if saved is None:
        return False
    if rule == "exact":
        return saved != model
    return saved.is_floating_point != model.is_floating_point


def state_dict_mismatches(model_sd: Mapping[str, torch.Tensor], ckpt: Mapping[str, torch.Tensor], dtypes: str = "exact"
                          ) -> tuple[list[str], list[str], list[str]]:
    """(shape or dtype mismatches as "name: checkpoint (..) vs model (..)", missing names,
    unexpected names); `dtypes` is the dtype rule of :func:`_dtype_differs`."""
    shape = []
    for k, v in model_sd.items():
        if k not in ckpt:
            continue
        saved = ckpt[k]
        if tuple(saved.shape) != tuple(v.shape):
            shape.append(f"{k}: checkpoint {tuple(saved.shape)} vs model {tuple(v.shape)}")
        elif _dtype_differs(getattr(saved, "dtype", None), v.dtype, dtypes):
            shape.append(f"{k}: checkpoint {str(saved.dtype).removeprefix('torch.')} vs model "
                         f"{str(v.dtype).removeprefix('torch.')}")
    missing = [k for k in model_sd if k not in ckpt]
    unexpected = [k for k in ckpt if k not in model_sd]
    return shape, missing, unexpected


def mismatch_report(model_sd: Mapping[str, torch.Tensor], ckpt: Mapping[str, torch.Tensor], dtypes: str = "exact"
                    ) -> tuple[int, str, str]:
    """The `state_dict_mismatches` of `ckpt` against `model_sd` for a one-line message: (how many
    tensors differ, "(a shape, b missing, c unexpected)" -- shape counting dtype differences too --,
    the first MAX_LISTED of them joined by "; " with "; +N more" after); the count is 0 when every
    name, shape and dtype matches."""
    shape, missing, unexpected = state_dict_mismatches(model_sd, ckpt, dtypes)
    problems = shape + [f"missing {k}" for k in missing] + [f"unexpected {k}" for k in unexpected]
    more = f"; +{len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    tally = f"({len(shape)} shape, {len(missing)} missing, {len(unexpected)} unexpected)"
    return len(problems), tally, "; ".join(problems[:MAX_LISTED]) + more


# --------------------------------------------------------------------------- config checks


def check_model_args(cfg: ModelConfig, vocab_size: int, seq_len: int) -> None:
    """Reject sizes no model can be built with (ValueError: a programming / config mistake)."""
    for name in ("d_model", "n_heads", "mlp_ratio", "mdlm_layers", "anchor_layers", "denoiser_layers"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"model.{name} must be a positive integer, got {value!r}")
    if cfg.d_model % cfg.n_heads or (cfg.d_model // cfg.n_heads) % 2:
        raise ValueError(f"model.d_model ({cfg.d_model}) must be n_heads ({cfg.n_heads}) times an even head dim")
    if isinstance(cfg.dropout, bool) or not isinstance(cfg.dropout, (int, float)) or not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"model.dropout must be in [0, 1), got {cfg.dropout!r}")
    if cfg.gelu not in GELU_APPROXIMATE:
        raise ValueError(f"model.gelu must be one of {', '.join(map(repr, GELU_APPROXIMATE))}, got {cfg.gelu!r}")
    for name, value in (("vocab_size", vocab_size), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _registry() -> dict[str, type[TadmModel]]:
    import tadm.models  # noqa: F401  # lazy: tadm.models imports this module (a circle); it registers every architecture

    return MODEL_REGISTRY


def build_model(model_type: str, cfg: ModelConfig, vocab_size: int, seq_len: int) -> TadmModel:
    """Build a fresh model of `model_type` ("mdlm", "adlm", "tadm", "sedd", "ar")."""
    registry = _registry()
    if model_type not in registry:
        raise ValueError(f"unknown model_type {model_type!r}; known: {', '.join(sorted(registry))}")
    return registry[model_type](cfg, vocab_size, seq_len)


# --------------------------------------------------------------------------- counting


def count_parameters(params: nn.Module | Iterable[torch.Tensor]) -> int:
    """Number of unique parameter elements of a module (or an iterable of parameters)."""
    if isinstance(params, nn.Module):
        params = params.parameters()
    seen: dict[int, int] = {}
    for p in params:
        seen[id(p)] = p.numel()
    return sum(seen.values())
