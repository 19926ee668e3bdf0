"""Rebuild a model from its checkpoint directory, checking before reading and reading all or
nothing (:func:`load_pretrained`).

Before any tensor is read or any module allocated, config.json's sizes are bounded and
cross-checked against the safetensors header(s) (:func:`check_checkpoint`,
`tadm.weights_header`); once read, every floating tensor must be finite
(`tadm.models.io.check_finite`). Every tensor name and shape is checked before a single weight is
copied, so a bad checkpoint raises `CheckpointError` (one line naming the culprit). Like
`tadm.models.io`, outside the code fingerprint of a training run.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Mapping

import torch

from tadm import runtime
from tadm import weights_header as wh
from tadm.config import ModelConfig
from tadm.models.base import SAFETENSORS_DTYPES, TadmModel, _registry, build_model, check_model_args, mismatch_report
from tadm.models.io import CONFIG_FILE, FORMAT_VERSION, WEIGHTS_FILE, CheckpointError, check_finite, read_safetensors


def read_checkpoint_config(directory: str | Path) -> tuple[str, ModelConfig, int, int]:
    """Parse and validate ``<directory>/config.json`` -> (model_type, cfg, vocab_size, seq_len)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {str(directory)!r} does not exist")
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{str(path)!r} does not exist (not a checkpoint directory, or an interrupted save)")
    raw = wh.read_json(path, error=CheckpointError)
    missing = [k for k in ("model_type", "vocab_size", "seq_len", "model", "format_version") if k not in raw]
    if missing:
        raise CheckpointError(f"{str(path)!r} lacks key(s): {', '.join(missing)}")
    if raw["format_version"] != FORMAT_VERSION:
        raise CheckpointError(f"{str(path)!r}: unsupported format_version {raw['format_version']!r} (this code reads {FORMAT_VERSION})")
    registry = _registry()
    if raw["model_type"] not in registry:
        raise CheckpointError(f"{str(path)!r}: unknown model_type {raw['model_type']!r}; known: {', '.join(sorted(registry))}")
    if not isinstance(raw["model"], dict):
        raise CheckpointError(f"{str(path)!r}: 'model' must be a mapping of ModelConfig fields")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(raw["model"]) - fields)
    if unknown:
        raise CheckpointError(f"{str(path)!r}: unknown model field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(fields))}")
    cfg = ModelConfig(**raw["model"])
    try:
        check_model_args(cfg, raw["vocab_size"], raw["seq_len"])
    except ValueError as e:
        raise CheckpointError(f"{str(path)!r}: {e}") from None
    where = repr(str(path))
    for name, kind in CONFIG_BOUNDS.items():
        value = raw[name] if name in ("vocab_size", "seq_len") else getattr(cfg, name)
        wh.bounded(value, name if name in ("vocab_size", "seq_len") else f"model.{name}", kind, where, CheckpointError)
    return raw["model_type"], cfg, raw["vocab_size"], raw["seq_len"]


# config.json sizes -> their kind in tadm.weights_header.LIMITS
CONFIG_BOUNDS = {"vocab_size": "vocab", "seq_len": "seq_len", "d_model": "hidden", "n_heads": "heads",
                 "mlp_ratio": "mlp_ratio", "mdlm_layers": "layers", "anchor_layers": "layers",
                 "denoiser_layers": "layers"}
STACK_INDEX = re.compile(r"^(\w+)\.(\d+)\.")  # "anchor_blocks.3.attn..." -> ("anchor_blocks", 3)
STACK_FIELDS = {"blocks": "mdlm_layers", "anchor_blocks": "anchor_layers", "denoiser_blocks": "denoiser_layers"}


class _Shape:
    """A header entry standing in for a tensor in `state_dict_mismatches` (it reads .shape and
    .dtype; None where the header's dtype has no torch equivalent)."""

    def __init__(self, shape, dtype: str | None = None):
        self.shape = tuple(shape)
        self.dtype = SAFETENSORS_DTYPES.get(dtype) if dtype is not None else None


def check_header_tensors(where: str, model_sd: Mapping[str, torch.Tensor], header: "wh.Header",
                         model_name: str, tally: bool = False, dtypes: str = "exact") -> None:
    """CheckpointError (one line, prefixed by `where`) unless the safetensors `header` names
    exactly the tensors of `model_sd` (a model built on the meta device) with the same shapes and
    dtypes (the `dtypes` rule of :func:`_dtype_differs`: a header relabelled F32 -> I32 is refused
    either way); the message lists the first differences and, with `tally`, how many of each kind."""
    saved = {k: _Shape(v, header.dtypes.get(k)) for k, v in header.shapes.items()}
    n, counts, listed = mismatch_report(model_sd, saved, dtypes)
    if n:
        counts = f" {counts}" if tally else ""
        raise CheckpointError(f"{where}: {n} tensor(s) differ from config.json's {model_name}{counts}: {listed}")


def check_checkpoint(directory: str | Path, model_type: str, cfg: ModelConfig, vocab_size: int, seq_len: int,
                     map_location: str | torch.device = runtime.CPU) -> "wh.Header":
    """Cross-check a bounded config.json against the weights' safetensors header(s), reading no
    tensor data and allocating no model: the embedding is (tokens, d_model), each layer stack holds
    exactly the configured layer indices, every tensor's shape is the model's (built on the meta
    device), and the weights fit in memory. CheckpointError (one line) on any difference."""
    directory = Path(directory)
    header = wh.read_weights(directory, CheckpointError)
    weights = directory / (WEIGHTS_FILE if (directory / WEIGHTS_FILE).is_file() else wh.INDEX_FILE)
    where = f"{str(directory / CONFIG_FILE)!r} vs {str(weights)!r}"
    # the layout of this model type, from a one-layer model on the meta device
    with torch.device("meta"):
        probe = build_model(model_type, ModelConfig(d_model=8, n_heads=1, mlp_ratio=1, mdlm_layers=1,
                                                    anchor_layers=1, denoiser_layers=1, dropout=0.0), 2, 2)
    rows = vocab_size + probe.embed.weight.shape[0] - 2
    emb = header.shapes.get("embed.weight")
    if emb is None:
        raise CheckpointError(f"{where}: the weights have no embed.weight")
    if len(emb) != 2 or emb[0] != rows:
        raise CheckpointError(f"{where}: vocab_size = {vocab_size} needs embed.weight of {rows} rows, the weights have {emb}")
    if emb[1] != cfg.d_model:
        raise CheckpointError(f"{where}: model.d_model = {cfg.d_model} but embed.weight is {emb}")
    stacks = {prefix: getattr(cfg, f) for prefix, f in STACK_FIELDS.items() if hasattr(probe, prefix)}
    found = wh.layer_counts(header.shapes, STACK_INDEX)
    for prefix, depth in stacks.items():
        ix = found.get(prefix, [])
        if ix != list(range(depth)):
            have = f"{len(ix)} (indices {ix[0]}..{ix[-1]})" if ix else "none"
            raise CheckpointError(f"{where}: model.{STACK_FIELDS[prefix]} = {depth} but the weights hold {have} "
                                  f"{prefix} layers")
    # every shape, against the model built on the meta device (no memory; its sizes are bounded)
    with torch.device("meta"):
        meta = build_model(model_type, cfg, vocab_size, seq_len)
    model_sd = meta.state_dict()
    check_header_tensors(where, model_sd, header, "model")
    model_bytes = sum(v.numel() * v.element_size() for v in model_sd.values())
    if model_bytes > wh.SIZE_FACTOR * max(header.nbytes, 1):
        raise CheckpointError(f"{where}: config.json implies {model_bytes} bytes of parameters, the weights hold {header.nbytes}")
    wh.check_fits(header.nbytes, str(weights), None, CheckpointError)  # the tensors, read on the host
    wh.check_fits(model_bytes, str(directory), map_location, CheckpointError)  # the model, where it is built
    return header


def load_pretrained(directory: str | Path, map_location: str | torch.device = runtime.CPU) -> TadmModel:
    """Rebuild the model saved in `directory` and load its weights strictly.

    config.json is bounded and cross-checked against the safetensors header(s) before any
    tensor is read or any module allocated (`check_checkpoint`). The model is returned in eval
    mode on `map_location`. Any problem raises CheckpointError with a one-line message.
    """
    model_type, cfg, vocab_size, seq_len = read_checkpoint_config(directory)  # bounded sizes
    header = check_checkpoint(directory, model_type, cfg, vocab_size, seq_len, map_location)  # headers only
    directory = Path(directory)
    if (directory / WEIGHTS_FILE).is_file():
        tensors, source = read_safetensors(directory / WEIGHTS_FILE), str(directory / WEIGHTS_FILE)
    else:  # sharded: model.safetensors.index.json
        tensors, source = {}, str(directory / wh.INDEX_FILE)
        for shard in sorted(set(header.files.values())):
            tensors.update(read_safetensors(directory / shard))
    with torch.device(map_location):  # built where it runs: no host copy of the weights on a GPU
        model = build_model(model_type, cfg, vocab_size, seq_len)
    check_finite(tensors, source)
    model.load_tensors(tensors, source=source)
    return model.eval()
