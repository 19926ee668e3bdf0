"""A model's checkpoint directory, written and read (`tadm.models.base.TadmModel`'s
``save_pretrained`` / ``load_weights`` / ``config_dict`` call it; `tadm.models.loading` checks
and rebuilds a whole directory).

A checkpoint is a directory with two files:

    config.json        {"model_type", "vocab_size", "seq_len", "model": ModelConfig, "format_version": 1}
    model.safetensors  the state dict (every tensor, strict names)

``model.save_pretrained(dir)`` writes both, each atomically, the weights first. This module and
`tadm.models.loading` read and write what training produced without shaping it, so they are
outside the code fingerprint of a training run (`tadm.train.fingerprint.NOT_OBJECTIVE`): a change
here never makes a finished checkpoint stale.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping

import safetensors.torch
import torch
from safetensors import safe_open

from tadm import runtime
from tadm.errors import DataError
from tadm.io import atomic_path

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT_VERSION = 1


class CheckpointError(DataError):
    """A checkpoint directory is missing, unreadable, or does not fit the model."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _saved_model_type(path: Path) -> str | None:
    """The model_type recorded in a safetensors file's metadata, if any (for error messages)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("model_type")
    except Exception:
        return None


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Read every tensor of a safetensors file onto the CPU; any failure is a CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint weights {str(path)!r} do not exist")
    try:
        return safetensors.torch.load_file(str(path))
    except Exception as e:  # SafetensorError, OSError, ... : truncated, corrupted or not safetensors
        raise CheckpointError(
            f"{str(path)!r} is not a readable safetensors file (truncated or corrupted?): "
            f"{type(e).__name__}: {_one_line(e)}"
        ) from None


def save_pretrained(model: torch.nn.Module, directory: str | Path) -> Path:
    """Write config.json and model.safetensors of `model` into `directory` (created if needed).

    Each file goes to a temporary sibling and is renamed into place, so an interrupted
    save never leaves a half-written file; other files in the directory are kept.
    The weights are written first, so config.json only appears once they are complete.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: runtime.host(v).contiguous() for k, v in model.state_dict().items()}
    with atomic_path(directory / WEIGHTS_FILE) as tmp:
        # one metadata key only: safetensors writes its metadata map in hash order, so two
        # keys would make the bytes of identical weights differ from run to run
        # (the format version lives in config.json)
        safetensors.torch.save_file(tensors, str(tmp), metadata={"model_type": model.model_type})  # looked up at each call (a test replaces it)
    with atomic_path(directory / CONFIG_FILE) as tmp:
        tmp.write_text(json.dumps(config_dict(model), indent=2, sort_keys=True) + "\n")
    return directory


def config_dict(model: torch.nn.Module) -> dict:
    """config.json of `model`: its model_type, vocab_size, seq_len, ModelConfig and the format."""
    return {
        "model_type": model.model_type,
        "vocab_size": model.vocab_size,
        "seq_len": model.seq_len,
        "model": dataclasses.asdict(model.cfg),
        "format_version": FORMAT_VERSION,
    }


def load_weights(model: torch.nn.Module, directory: str | Path) -> torch.nn.Module:
    """Load ``<directory>/model.safetensors`` (or a .safetensors file) into `model`, strictly.

    Raises CheckpointError naming missing / unexpected / wrongly shaped tensors; on any
    error no weight of the model has changed.
    """
    path = Path(directory)
    if path.is_dir():
        path = path / WEIGHTS_FILE
    tensors = read_safetensors(path)
    kind = _saved_model_type(path)
    source = f"{path} (a {kind!r} checkpoint)" if kind and kind != model.model_type else str(path)
    model.load_tensors(tensors, source=source)
    return model


def check_finite(tensors: Mapping[str, torch.Tensor], source: str) -> None:
    """Refuse weights that hold NaN or infinity: no trained weight is non-finite, and such a
    model would sample garbage silently (one line naming the first such tensor and the count)."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckpointError(f"{source}: tensor {name!r} holds {bad} non-finite value(s) (NaN or inf) of "
                                  f"{t.numel()}: the weights are corrupted or diverged; refused")
