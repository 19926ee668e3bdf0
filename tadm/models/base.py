"""What every model shares: construction signature, a registry, and save / load.

A checkpoint is a directory with two files:

    config.json        {"model_type", "vocab_size", "seq_len", "model": ModelConfig, "format_version": 1}
    model.safetensors  the state dict (every tensor, strict names)

``model.save_pretrained(dir)`` writes both (each atomically, weights first); ``load_pretrained(dir)``
rebuilds the right class from config.json and loads the weights strictly. Before any tensor is
read or any module allocated, config.json's sizes are bounded and cross-checked against the
safetensors header(s) (``check_checkpoint``, `tadm.weights_header`). Loading is all or
nothing: every tensor name and shape is checked *before* a single weight is copied, so a bad
checkpoint raises :class:`CheckpointError` (one line naming the culprit) and leaves the model
exactly as it was.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Iterable, Mapping

import torch
import torch.nn as nn

from tadm import runtime
from tadm import weights_header as wh
from tadm.config import ModelConfig
from tadm.errors import DataError
from tadm.io import atomic_path
from tadm.models.dit import GELU_APPROXIMATE

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT_VERSION = 1
MAX_LISTED = 5  # mismatched tensors named in an error message before "+N more"

MODEL_REGISTRY: dict[str, type["TadmModel"]] = {}


class CheckpointError(DataError):
    """A checkpoint directory is missing, unreadable, or does not fit the model."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


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
        return {
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "seq_len": self.seq_len,
            "model": dataclasses.asdict(self.cfg),
            "format_version": FORMAT_VERSION,
        }

    # ------------------------------------------------------------------ save

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write config.json and model.safetensors into `directory` (created if needed).

        Each file goes to a temporary sibling and is renamed into place, so an interrupted
        save never leaves a half-written file; other files in the directory are kept.
        The weights are written first, so config.json only appears once they are complete.
        """
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {k: runtime.host(v).contiguous() for k, v in self.state_dict().items()}
        with atomic_path(directory / WEIGHTS_FILE) as tmp:
            # one metadata key only: safetensors writes its metadata map in hash order, so two
            # keys would make the bytes of identical weights differ from run to run
            # (the format version lives in config.json)
            save_file(tensors, str(tmp), metadata={"model_type": self.model_type})
        with atomic_path(directory / CONFIG_FILE) as tmp:
            tmp.write_text(json.dumps(self.config_dict(), indent=2, sort_keys=True) + "\n")
        return directory

    # ------------------------------------------------------------------ load

    def load_weights(self, directory: str | Path) -> "TadmModel":
        """Load ``<directory>/model.safetensors`` (or a .safetensors file) into this model, strictly.

        Raises CheckpointError naming missing / unexpected / wrongly shaped tensors; on any
        error no weight of this model has changed.
        """
        path = Path(directory)
        if path.is_dir():
            path = path / WEIGHTS_FILE
        tensors = read_safetensors(path)
        kind = _saved_model_type(path)
        source = f"{path} (a {kind!r} checkpoint)" if kind and kind != self.model_type else str(path)
        self.load_tensors(tensors, source=source)
        return self

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


def _saved_model_type(path: Path) -> str | None:
    """The model_type recorded in a safetensors file's metadata, if any (for error messages)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("model_type")
    except Exception:
        return None


def read_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Read every tensor of a safetensors file onto the CPU; any failure is a CheckpointError."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint weights {str(path)!r} do not exist")
    try:
        return load_file(str(path))
    except Exception as e:  # SafetensorError, OSError, ... : truncated, corrupted or not safetensors
        raise CheckpointError(
            f"{str(path)!r} is not a readable safetensors file (truncated or corrupted?): "
            f"{type(e).__name__}: {_one_line(e)}"
        ) from None


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
    import tadm.models  # noqa: F401  (importing the package registers every architecture)

    return MODEL_REGISTRY


def build_model(model_type: str, cfg: ModelConfig, vocab_size: int, seq_len: int) -> TadmModel:
    """Build a fresh model of `model_type` ("mdlm", "adlm", "tadm", "sedd", "ar")."""
    registry = _registry()
    if model_type not in registry:
        raise ValueError(f"unknown model_type {model_type!r}; known: {', '.join(sorted(registry))}")
    return registry[model_type](cfg, vocab_size, seq_len)


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
    model.load_tensors(tensors, source=source)
    return model.eval()


# --------------------------------------------------------------------------- counting


def count_parameters(params: nn.Module | Iterable[torch.Tensor]) -> int:
    """Number of unique parameter elements of a module (or an iterable of parameters)."""
    if isinstance(params, nn.Module):
        params = params.parameters()
    seen: dict[int, int] = {}
    for p in params:
        seen[id(p)] = p.numel()
    return sum(seen.values())
