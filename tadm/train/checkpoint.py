"""Training checkpoints: safetensors weights + a JSON state, written atomically, verified on load.

Layout of a run directory (``checkpoints/<run>/``)::

    step_000100/          one checkpoint (a directory renamed into place when complete)
      model.safetensors   the trained weights
      ema.safetensors     the EMA weights
      optimizer.safetensors  AdamW moments, flattened as "<param name>.<state key>"
      state.json          step, fingerprint of the run, optimizer scalars, SHA-256 of the files
    latest                name of the newest complete checkpoint (atomically replaced)

A checkpoint is only ever visible under its final name once every file is written and hashed,
so a kill during a write leaves at most a temporary directory that is ignored. Loading checks
every hash; a corrupted or truncated checkpoint is refused and the previous one is used.
Nothing is unpickled: tensors go through safetensors, everything else through JSON.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tadm.errors import TadmError
from tadm.io import atomic_path, atomic_write_text, sha256_file

FILES = ("model.safetensors", "ema.safetensors", "optimizer.safetensors")


class CheckpointCorrupt(TadmError):
    """A checkpoint whose files are missing, truncated or do not match their hashes."""


@dataclass
class TrainState:
    step: int
    model: dict[str, torch.Tensor]
    ema: dict[str, torch.Tensor]
    optimizer: dict  # torch optimizer state_dict
    extra: dict  # JSON-serialisable (metrics so far, fingerprint, ...)


def _flatten_optimizer(opt_state: dict, names: list[str]) -> tuple[dict[str, torch.Tensor], dict]:
    """Split an optimizer state_dict into tensors (for safetensors) and JSON scalars."""
    tensors, scalars = {}, {}
    for idx, state in opt_state["state"].items():
        name = names[idx]
        for key, value in state.items():
            if torch.is_tensor(value):
                tensors[f"{name}::{key}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{name}::{key}"] = value
    return tensors, {"param_groups": opt_state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict, names: list[str]) -> dict:
    index = {n: i for i, n in enumerate(names)}
    state: dict[int, dict] = {}
    for key, value in list(tensors.items()) + list(meta["scalars"].items()):
        name, field = key.rsplit("::", 1)
        if name not in index:
            raise CheckpointCorrupt(f"optimizer state names unknown parameter {name!r}")
        state.setdefault(index[name], {})[field] = value
    # JSON has no tuples: restore them (AdamW's betas) so the state equals what was saved
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def save(run_dir: Path, state: TrainState, param_names: list[str], keep: int = 2) -> Path:
    """Write checkpoint ``step_XXXXXX`` atomically, point ``latest`` at it, prune old ones."""
    run_dir = Path(run_dir)
    name = f"step_{state.step:06d}"
    opt_tensors, opt_meta = _flatten_optimizer(state.optimizer, param_names)
    with atomic_path(run_dir / name) as tmp:
        tmp.mkdir()
        save_file(state.model, str(tmp / "model.safetensors"))
        save_file(state.ema, str(tmp / "ema.safetensors"))
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        meta = {
            "step": state.step,
            "optimizer": opt_meta,
            "extra": state.extra,
            "sha256": {f: sha256_file(tmp / f) for f in FILES},
        }
        (tmp / "state.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    atomic_write_text(run_dir / "latest", name + "\n")
    for old in sorted(run_dir.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return run_dir / name


def load(ckpt_dir: Path, param_names: list[str]) -> TrainState:
    """Load and verify one checkpoint directory; raise CheckpointCorrupt on any defect."""
    ckpt_dir = Path(ckpt_dir)
    try:
        meta = json.loads((ckpt_dir / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointCorrupt(f"{ckpt_dir}: unreadable state.json ({type(e).__name__})") from None
    for f in FILES:
        path = ckpt_dir / f
        if not path.is_file() or sha256_file(path) != meta.get("sha256", {}).get(f):
            raise CheckpointCorrupt(f"{ckpt_dir}: {f} is missing or does not match its recorded hash")
    try:
        model, ema = load_file(str(ckpt_dir / "model.safetensors")), load_file(str(ckpt_dir / "ema.safetensors"))
        opt = _unflatten_optimizer(load_file(str(ckpt_dir / "optimizer.safetensors")), meta["optimizer"], param_names)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError(Exception)
        raise CheckpointCorrupt(f"{ckpt_dir}: cannot read weights ({type(e).__name__}: {e})") from None
    return TrainState(step=meta["step"], model=model, ema=ema, optimizer=opt, extra=meta["extra"])


def candidates(run_dir: Path) -> list[Path]:
    """Complete checkpoints, newest first (the one named in ``latest`` leads)."""
    run_dir = Path(run_dir)
    found = sorted(run_dir.glob("step_*"), reverse=True)
    latest = run_dir / "latest"
    if latest.is_file():
        named = run_dir / latest.read_text().strip()
        if named in found:
            found.remove(named)
            found.insert(0, named)
    return [p for p in found if p.is_dir()]  # in-progress writes are hidden ".step_*" dirs


def load_latest(run_dir: Path, param_names: list[str], fingerprint: str, log=print) -> TrainState | None:
    """The newest checkpoint that verifies and belongs to this run (same fingerprint)."""
    for ckpt in candidates(run_dir):
        try:
            state = load(ckpt, param_names)
        except CheckpointCorrupt as e:
            log(f"skipping checkpoint: {e}")
            continue
        if state.extra.get("fingerprint") != fingerprint:
            log(f"{run_dir} holds a run with other parameters, data or code: removing it, starting fresh")
            clear(run_dir)
            return None
        return state
    return None


def clear(run_dir: Path) -> None:
    """Remove every checkpoint of a run directory."""
    for p in Path(run_dir).glob("step_*"):
        shutil.rmtree(p, ignore_errors=True)
    (Path(run_dir) / "latest").unlink(missing_ok=True)
