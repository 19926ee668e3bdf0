"""Training checkpoints: safetensors weights + a JSON state, written atomically, verified on load.

Layout of a run directory (``checkpoints/<run>/``)::

    step_000100/          one checkpoint (a directory renamed into place when complete)
      model.safetensors   the trained weights
      ema.safetensors     the EMA weights
      optimizer.safetensors  AdamW moments, flattened as "<param name>.<state key>"
      state.json          step, the run's settings and their fingerprint, optimizer scalars,
                          SHA-256 of the files, and ``state_sha256``: the SHA-256 of every
                          other field of state.json itself
    latest                name of the newest complete checkpoint (atomically replaced)
    run.lock              who trains into this directory now (pid, host, since, command)

A checkpoint is only ever visible under its final name once every file is written and hashed,
so a kill during a write leaves at most a temporary directory that is ignored. Loading checks
every hash -- the weight files' and state.json's own (its step, optimizer scalars, history,
settings: an edited field fails it), and the step against the directory's name; a corrupted,
truncated, edited or malformed checkpoint is refused (one line naming the file) and the
previous one is used. When checkpoints exist and none of them verifies, the run is refused
rather than started fresh over them. Nothing is unpickled: tensors go through safetensors,
everything else through JSON. (The hashes detect damage and edits, not forgery: whoever can
write the directory can recompute them.)

One run at a time: :class:`RunLock` takes an exclusive ``flock`` on ``run.lock`` for the
whole run; a second process on the same directory is refused with :class:`RunLocked`, one
line naming the holder. The kernel drops the lock when its holder dies, so a lock file left by
a killed run does not block the next one.

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

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tadm.errors import TadmError
from tadm.io import atomic_path, atomic_write_text, free_space, json_loads, sha256_file
from tadm.models.base import mismatch_report
from tadm.runtime import host
from tadm.train.divergence import Diverged, first_non_finite

FILES = ("model.safetensors", "ema.safetensors", "optimizer.safetensors")
LOCK = "run.lock"


class CheckpointCorrupt(TadmError):
    """A checkpoint whose files are missing, truncated or do not match their hashes."""


class SettingsChanged(TadmError):
    """The run directory holds checkpoints trained with other settings (refused, kept)."""


class RunLocked(TadmError):
    """Another process trains into this run directory now."""


class CheckpointWriteFailed(TadmError):
    """A checkpoint could not be written (a full disk, a read-only directory): nothing of it is
    left, the previous checkpoint stays the one a rerun resumes from."""


_HELD: dict[Path, "RunLock"] = {}  # run directories this process holds (move_aside follows them)


class RunLock:
    """An exclusive, non-blocking ``flock`` on ``<run_dir>/run.lock``, held from
    :meth:`acquire` (or ``with``) to :meth:`release`; the file records the holder (pid, host,
    start time, command). A second holder -- another process, or another open of this one --
    gets :class:`RunLocked` naming the first. The kernel releases the lock when the holding
    process exits, however it exits, so a stale lock file never blocks."""

    def __init__(self, run_dir: Path, command: str | None = None):
        self.run_dir = Path(run_dir)
        self.command = command or " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        self.fd: int | None = None

    @property
    def path(self) -> Path:
        return self.run_dir / LOCK

    def _open_locked(self) -> int:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:  # O_NOFOLLOW: a run.lock planted as a symbolic link is refused, its target never truncated
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise RunLocked(f"lock file {self.path} is a symbolic link (to {os.readlink(self.path)!r}); refusing to "
                                "write through it: remove it") from None
            if e.errno == errno.EISDIR:
                raise RunLocked(f"lock file {self.path} is a directory; remove it") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise RunLocked(f"lock file {self.path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: held elsewhere
            holder = _holder(fd)
            os.close(fd)
            raise RunLocked(f"{self.run_dir} is in use by {holder}; lock file {self.path}: wait for that run to "
                            f"end or stop it (two runs must not share a checkpoint directory)") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode(), 0)
        os.fsync(fd)
        return fd

    def acquire(self) -> "RunLock":
        if self.fd is None:
            self.fd = self._open_locked()
            _HELD[self.run_dir.resolve()] = self
        return self

    def moved(self) -> None:
        """The locked directory was renamed away (``move_aside``): lock the fresh one at the
        old path, then let go of the moved one (its lock file is emptied, not deleted)."""
        old, self.fd = self.fd, None
        try:
            self.fd = self._open_locked()
        finally:
            if old is not None:
                os.ftruncate(old, 0)
                os.close(old)

    def release(self) -> None:
        if _HELD.get(self.run_dir.resolve()) is self:
            del _HELD[self.run_dir.resolve()]
        if self.fd is not None:
            fd, self.fd = self.fd, None
            try:
                os.ftruncate(fd, 0)  # the holder is gone: no stale name left behind
            finally:
                os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _holder(fd: int) -> str:
    """Who holds a lock, from its file (written right after the lock is taken)."""
    try:
        info = json_loads(os.pread(fd, 4096, 0).decode())
        return f"pid {info['pid']} on {info['host']} since {info['since']} (`{info['command']}`)"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its details are not written yet)"


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
    name = step_dir(run_dir, state.step).name
    opt_tensors, opt_meta = _flatten_optimizer(state.optimizer, param_names)
    for what, tensors in (("weights", state.model), ("EMA weights", state.ema), ("optimizer state", opt_tensors)):
        bad = first_non_finite(tensors)
        if bad is not None:  # the loops check first; this keeps any caller from writing one
            raise Diverged(f"{run_dir}: refusing to save step {state.step}: the {what} hold NaN or inf "
                           f"(tensor {bad}); {last_good(run_dir)}")
    try:  # atomic: on any failure the half-written directory is removed, `latest` unchanged
        with atomic_path(run_dir / name, "dir", ours=(*FILES, "state.json")) as tmp:
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
            meta = json.loads(json.dumps(meta))  # as it will read back (tuples -> lists)
            meta["state_sha256"] = _state_hash(meta)
            (tmp / "state.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        atomic_write_text(run_dir / "latest", name + "\n")
    except (OSError, SafetensorError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())[:200]
        raise CheckpointWriteFailed(f"{run_dir}: cannot write checkpoint {name} ({why}; {free_space(run_dir)}); "
                                    f"{last_good(run_dir)}: free space or fix the directory and rerun, "
                                    "training resumes from it") from None
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
        opt_flat = load_file(str(ckpt_dir / "optimizer.safetensors"))
        opt = _unflatten_optimizer(opt_flat, meta["optimizer"], param_names)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError(Exception)
        raise CheckpointCorrupt(f"{ckpt_dir}: cannot read weights ({type(e).__name__}: {e})") from None
    for what, tensors in (("model.safetensors", model), ("ema.safetensors", ema), ("optimizer.safetensors", opt_flat)):
        bad = first_non_finite(tensors)
        if bad is not None:
            raise CheckpointCorrupt(f"{ckpt_dir}: {what} tensor {bad} holds NaN or inf (the run had diverged); "
                                    f"not resumed from")
    return TrainState(step=meta["step"], model=model, ema=ema, optimizer=opt, extra=meta["extra"])


def step_dir(run_dir: Path | str, step: int) -> Path:
    """The directory of step `step`'s checkpoint in `run_dir`."""
    return Path(run_dir) / f"step_{step:06d}"


def check_tensors(ckpt: Path | str, expected: dict[str, torch.Tensor], state: TrainState) -> None:
    """The checkpoint's weights (and EMA weights) name exactly the `expected` tensors (the model's
    state dict, or the trained subset), with their shapes and dtypes: a one-line
    :class:`CheckpointCorrupt` naming the first differences (`models.base.mismatch_report`), instead
    of a RuntimeError from ``load_state_dict`` (the settings fingerprint agreed, so the files were changed)."""
    for what, tensors in (("model.safetensors", state.model), ("ema.safetensors", state.ema)):
        n, tally, listed = mismatch_report(expected, tensors)
        if n:
            raise CheckpointCorrupt(f"{ckpt}: {what}: {n} tensor(s) differ from the model {tally}: {listed}")


# what tadm.io.atomic_path leaves in a run directory when a save is killed: its temporary
# directory (".step_000004.k3j2.tmp", ".latest.x9.tmp") and, mid-swap, the previous copy (".NAME.old")
_TEMPORARY = re.compile(r"^\.(step_\d+|latest)\..+\.tmp$")
_SWAPPED = re.compile(r"^\.(step_\d+)\.old$")


def remove_stale_temporaries(run_dir: Path) -> list[str]:
    """Clear what a save killed mid-write left in `run_dir` (call it holding the run's lock, so no
    save is in progress): temporary directories are removed; a previous copy set aside mid-swap
    is put back where its new copy never arrived, removed otherwise. The names handled."""
    run_dir = Path(run_dir)
    done = []
    for entry in sorted(run_dir.iterdir()) if run_dir.is_dir() else []:
        swapped = _SWAPPED.match(entry.name)
        if swapped and not (run_dir / swapped.group(1)).exists():
            os.replace(entry, run_dir / swapped.group(1))
        elif _TEMPORARY.match(entry.name) or swapped:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        else:
            continue
        done.append(entry.name)
    return done


def last_good(run_dir: Path) -> str:
    """The newest checkpoint directory kept in `run_dir`, said in a few words (for errors)."""
    found = candidates(run_dir) if Path(run_dir).is_dir() else []
    return f"the last good checkpoint is kept ({found[0]})" if found else "no checkpoint had been written yet"


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


def _state_hash(meta: dict) -> str:
    """SHA-256 of every field of state.json but ``state_sha256`` itself (canonical JSON)."""
    body = {k: v for k, v in meta.items() if k != "state_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _read_meta(ckpt_dir: Path) -> dict:
    """state.json of a checkpoint, parsed, typed and verified against its own hash; any defect
    is a one-line :class:`CheckpointCorrupt` naming the file."""
    path = Path(ckpt_dir) / "state.json"
    try:
        meta = json_loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointCorrupt(f"{path}: unreadable ({type(e).__name__})") from None
    kinds = {"step": int, "optimizer": dict, "extra": dict, "sha256": dict, "state_sha256": str}
    if not isinstance(meta, dict):
        raise CheckpointCorrupt(f"{path}: malformed (a JSON object expected, found {type(meta).__name__})")
    for key, kind in kinds.items():
        if key not in meta:
            what = " (written before state.json was hashed)" if key == "state_sha256" else ""
            raise CheckpointCorrupt(f"{path}: malformed ({key!r} missing{what})")
        if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
            raise CheckpointCorrupt(f"{path}: malformed ({key!r} is {type(meta[key]).__name__}, not {kind.__name__})")
    if meta["state_sha256"] != _state_hash(meta):
        raise CheckpointCorrupt(f"{path}: does not match its recorded hash (state_sha256): edited or damaged")
    if Path(ckpt_dir).name.startswith("step_") and _step_of(Path(ckpt_dir)) != meta["step"]:
        raise CheckpointCorrupt(f"{path}: step {meta['step']} does not match the directory's name")
    opt = meta["optimizer"]
    if not isinstance(opt.get("param_groups"), list) or not isinstance(opt.get("scalars"), dict):
        raise CheckpointCorrupt(f"{path}: malformed ('optimizer' lacks param_groups / scalars)")
    return meta


def load_latest(run_dir: Path, param_names: list[str], settings: dict[str, Any] | str, log=print,
                restart: str = "the same command with --restart") -> TrainState | None:
    """The newest checkpoint that verifies. `settings` is the run's settings mapping (or only
    its fingerprint); a checkpoint of other settings raises :class:`SettingsChanged` naming the
    changed keys and how to start over (`restart`: the command that does), and is kept."""
    run_dir = Path(run_dir)
    fp = settings if isinstance(settings, str) else fingerprint(settings)
    refused = []
    for ckpt in candidates(run_dir):
        try:
            meta = _read_meta(ckpt)
            extra = meta["extra"]
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
            refused.append(ckpt.name)
            continue
        return state
    if refused:  # starting fresh would overwrite them: refuse, keep them
        raise CheckpointCorrupt(f"{run_dir}: no checkpoint verifies ({', '.join(refused)}: see the lines above); "
                                f"start over with {restart} (moves {run_dir.name}/ aside, deletes nothing)")
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
    if not run_dir.is_dir() or not any(p.name != LOCK for p in run_dir.iterdir()):
        return None
    held = _HELD.get(run_dir.resolve())
    lock = held or RunLock(run_dir, "move_aside").acquire()  # never move a directory another run holds
    try:
        found = candidates(run_dir)
        base = run_dir.with_name(f"{run_dir.name}.old-{_step_of(found[0]) if found else 0}")
        dest, n = base, 1
        while dest.exists():
            n += 1
            dest = base.with_name(f"{base.name}-{n}")
        os.replace(run_dir, dest)
        if held is not None:
            held.moved()  # keep holding the run's directory, now fresh
    finally:
        if held is None:
            lock.release()
    return dest
