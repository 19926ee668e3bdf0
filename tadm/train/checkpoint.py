"""Training checkpoints: safetensors weights + a JSON state, written atomically, verified on load.

Layout of a run directory (``checkpoints/<run>/``)::

    step_000100/          one checkpoint (a directory renamed into place when complete)
      model.safetensors   the trained weights
      ema.safetensors     the EMA weights
      optimizer.safetensors  AdamW moments, flattened as "<param name>.<state key>"
      state.json          step, the run's settings and their fingerprint, optimizer scalars,
                          SHA-256 of the files
    latest                name of the newest complete checkpoint (atomically replaced)

A checkpoint is only ever visible under its final name once every file is written and hashed,
so a kill during a write leaves at most a temporary directory that is ignored. Loading checks
every hash; a corrupted or truncated checkpoint is refused and the previous one is used.
Nothing is unpickled: tensors go through safetensors, everything else through JSON.

Settings: each checkpoint records the settings that define its run's objective (a flat
mapping, e.g. ``train.lr``) and their fingerprint. A run whose settings differ is refused with
a one-line :class:`SettingsChanged` naming the changed keys -- checkpoints are never deleted
because settings changed. Starting over is explicit: :func:`move_aside` (the CLI's
``--restart``) renames the run directory to ``<run>.old-<step>``.

Devices: tensors are written from the host (``runtime.host``); loaded tensors are on the host,
and the loops move them where they belong (``load_state_dict`` copies into the model's device,
:func:`restore_optimizer` lets torch place the AdamW moments on each parameter's device).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from tadm.errors import TadmError
from tadm.io import atomic_path, atomic_write_text, sha256_file
from tadm.runtime import host

FILES = ("model.safetensors", "ema.safetensors", "optimizer.safetensors")


class CheckpointCorrupt(TadmError):
    """A checkpoint whose files are missing, truncated or do not match their hashes."""


class SettingsChanged(TadmError):
    """The run directory holds checkpoints trained with other settings (refused, kept)."""


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
                tensors[f"{name}::{key}"] = host(value).contiguous()
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


def _on_host(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: host(v).contiguous() for k, v in tensors.items()}


def restore_optimizer(opt: torch.optim.Optimizer, saved: dict) -> None:
    """Load a saved optimizer state into `opt`, keeping `opt`'s own implementation choice
    (fused / foreach / capturable): a checkpoint written on a GPU with the fused kernel resumes
    on the CPU with the default one and vice versa. torch puts every moment on its parameter's
    device (and AdamW's step counter where the fused kernel wants it)."""
    impl = ("fused", "foreach", "capturable", "differentiable")
    groups = [{**g, **{k: mine[k] for k in impl if k in mine}} for g, mine in zip(saved["param_groups"], opt.param_groups)]
    opt.load_state_dict({**saved, "param_groups": groups})


def save(run_dir: Path, state: TrainState, param_names: list[str], keep: int = 2) -> Path:
    """Write checkpoint ``step_XXXXXX`` atomically, point ``latest`` at it, prune old ones."""
    run_dir = Path(run_dir)
    name = f"step_{state.step:06d}"
    opt_tensors, opt_meta = _flatten_optimizer(state.optimizer, param_names)
    with atomic_path(run_dir / name) as tmp:
        tmp.mkdir()
        save_file(_on_host(state.model), str(tmp / "model.safetensors"))
        save_file(_on_host(state.ema), str(tmp / "ema.safetensors"))
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
    meta = _read_meta(ckpt_dir)
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


def fingerprint(settings: dict[str, Any]) -> str:
    """A short hash of a run's settings (a JSON-serialisable mapping)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def flatten(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys: {"train": {"lr": 1}} -> {"train.lr": 1}."""
    out: dict[str, Any] = {}
    for k, v in settings.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The dotted keys whose values differ between two settings mappings, as "key (a -> b)"
    (values longer than a few characters, such as hashes, are left out)."""
    a, b = flatten(old), flatten(new)
    out = []
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            va, vb = json.dumps(a.get(key, "<unset>")), json.dumps(b.get(key, "<unset>"))
            out.append(f"{key} ({va} -> {vb})" if len(va) + len(vb) <= 48 else key)
    return out


def _read_meta(ckpt_dir: Path) -> dict:
    try:
        return json.loads((Path(ckpt_dir) / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointCorrupt(f"{ckpt_dir}: unreadable state.json ({type(e).__name__})") from None


def load_latest(run_dir: Path, param_names: list[str], settings: dict[str, Any] | str, log=print,
                restart: str = "the same command with --restart") -> TrainState | None:
    """The newest checkpoint that verifies. `settings` is the run's settings mapping (or only
    its fingerprint); a checkpoint of other settings raises :class:`SettingsChanged` naming the
    changed keys and how to start over (`restart`: the command that does), and is kept."""
    run_dir = Path(run_dir)
    fp = settings if isinstance(settings, str) else fingerprint(settings)
    for ckpt in candidates(run_dir):
        try:
            meta = _read_meta(ckpt)
            extra = meta.get("extra", {}) if isinstance(meta, dict) else {}
            if extra.get("fingerprint") != fp:
                if isinstance(settings, dict) and isinstance(extra.get("settings"), dict):
                    keys = changed(extra["settings"], settings)
                    what = "changed: " + ", ".join(keys) if keys else "settings differ"
                else:
                    what = "its settings are not recorded (an older checkpoint) or differ"
                raise SettingsChanged(f"{ckpt} was trained with other settings ({what}); resume with the settings "
                                      f"it was trained with, or start over with {restart} (moves {run_dir.name}/ "
                                      f"aside to {run_dir.name}.old-<step>/, deletes nothing)")
            state = load(ckpt, param_names)
        except CheckpointCorrupt as e:
            log(f"skipping checkpoint: {e}")
            continue
        return state
    return None


def _step_of(ckpt: Path) -> int:
    try:
        return int(ckpt.name.split("_", 1)[1])
    except (IndexError, ValueError):
        return 0


def move_aside(run_dir: Path) -> Path | None:
    """Rename a run's checkpoint directory to ``<run>.old-<step>`` (the newest checkpoint's
    step; ``-2``, ``-3``... appended if taken) so that the run starts fresh. Nothing is
    deleted. Returns the new path, or None when there was nothing to move."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    found = candidates(run_dir)
    base = run_dir.with_name(f"{run_dir.name}.old-{_step_of(found[0]) if found else 0}")
    dest, n = base, 1
    while dest.exists():
        n += 1
        dest = base.with_name(f"{base.name}-{n}")
    os.replace(run_dir, dest)
    return dest
