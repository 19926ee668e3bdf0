"""Switching ``params.yaml`` to another profile without losing the committed run.

A checkout commits one run of the pipeline: ``dvc.lock``, the outputs git tracks
(``paper_figures/``, ``metrics/``) and, through ``dvc.lock``, the DVC-cached ones (``models/``,
``data/``, ``results/``, ...). ``dvc repro`` on another profile rewrites every one of them in place.
So ``python -m tadm profile NAME`` refuses, in one line, to switch the ``params.yaml`` at the top of
a git checkout whose HEAD commits a run of another profile (the profile ``dvc.lock`` records,
else HEAD's ``params.yaml``'s), unless asked with ``--force`` (the recommended place for another
profile is a checkout of its own, ``git worktree add``, where ``--force`` is what it takes too);
and ``python -m tadm profile NAME --restore`` brings the committed run back in one command:
``params.yaml``, ``dvc.lock`` and every pipeline output git tracks exactly as HEAD has them (what
another run added under them removed, the index reset for them), then ``dvc checkout`` for the
DVC-cached outputs. A params file elsewhere (``--params``), a directory that is not the top of
a git checkout, or a HEAD that commits no ``dvc.lock`` has no committed run: the switch goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import yaml

from tadm.errors import ConfigError, DataError

SOURCE = "python -m tadm profile"
LOCK = "dvc.lock"
PARAMS = "params.yaml"


def _git(root: Path, *args: str, stdin: bytes | None = None) -> Optional[subprocess.CompletedProcess]:
    """`git <args>` in `root` (literal pathspecs); None when git is missing or hangs."""
    try:
        return subprocess.run(["git", "--literal-pathspecs", *args], cwd=root, input=stdin, capture_output=True,
                              timeout=300)
    except (OSError, subprocess.SubprocessError):
        return None


def _at_head(root: Path, path: str) -> Optional[bytes]:
    """`path` as HEAD commits it, or None (no HEAD, not tracked, no git)."""
    proc = _git(root, "cat-file", "blob", f"HEAD:{path}")
    return proc.stdout if proc is not None and proc.returncode == 0 else None


def _yaml(data: Optional[bytes]) -> object:
    if data is None:
        return None
    try:
        return yaml.load(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (yaml.YAMLError, UnicodeDecodeError, ValueError):
        return None


def _stages(lock: object) -> list[dict]:
    stages = lock.get("stages") if isinstance(lock, dict) else None
    return [s for s in stages.values() if isinstance(s, dict)] if isinstance(stages, dict) else []


def checkout_root(params: Path) -> Optional[Path]:
    """The top of the git checkout whose pipeline reads `params` (its top-level params.yaml), or
    None: a params file of another name or place is nothing `dvc repro` reads."""
    params = Path(params).absolute()
    if params.name != PARAMS or not params.parent.is_dir():
        return None
    root = params.parent
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or top.returncode != 0:
        return None
    try:
        return root if Path(top.stdout.decode().strip()).resolve() == root.resolve() else None
    except (OSError, UnicodeDecodeError):
        return None


def committed_profile(root: Path) -> Optional[str]:
    """The profile of the run HEAD commits: the `profile` its dvc.lock records (a stage's
    params), else the `profile` of HEAD's params.yaml; None when HEAD commits no dvc.lock."""
    lock = _at_head(root, LOCK)
    if lock is None:
        return None
    for stage in _stages(_yaml(lock)):
        params = stage.get("params")
        recorded = params.get(PARAMS) if isinstance(params, dict) else None
        if isinstance(recorded, dict) and isinstance(recorded.get("profile"), str):
            return recorded["profile"]
    params = _yaml(_at_head(root, PARAMS))
    profile = params.get("profile") if isinstance(params, dict) else None
    return profile if isinstance(profile, str) else None


def _lock_differs(root: Path) -> bool:
    proc = _git(root, "diff", "--quiet", "HEAD", "--", LOCK)
    return proc is not None and proc.returncode == 1


def check_switch(name: str, params: Path, force: bool) -> Optional[str]:
    """Refuse (one ConfigError line naming --force and the way back) to switch `params` to
    profile `name` where HEAD commits a run of another profile, unless `force`. Returns a note to
    print after the switch, or None."""
    root = checkout_root(params)
    committed = committed_profile(root) if root is not None else None
    if committed is None:
        return None
    back = f"python -m tadm profile {committed} --restore"
    if committed == name:
        if _lock_differs(root):
            return f"note: {LOCK} differs from the committed one; `{back}` brings the committed run back"
        return None
    if not force:
        raise ConfigError("profile", f"this checkout commits the results of profile {committed!r} ({LOCK}, "
                          f"paper_figures/, metrics/), which `dvc repro` on {name!r} would overwrite: run {name!r} in a "
                          f"checkout of its own (git worktree add ../tadm-{name}; there: python -m tadm profile {name} "
                          f"--force), or pass --force here (back: {back})", source=PARAMS)
    return f"note: `dvc repro` now overwrites this checkout's committed results of profile {committed!r}; `{back}` brings them back"


def _lock_outs(lock: object) -> set[str]:
    outs = set()
    for stage in _stages(lock):
        for out in stage.get("outs") or []:
            if isinstance(out, dict) and isinstance(out.get("path"), str) and out["path"].strip():
                outs.add(out["path"].rstrip("/"))
    return outs


def _files(proc: Optional[subprocess.CompletedProcess]) -> set[str]:
    if proc is None or proc.returncode != 0:
        return set()
    return {f for f in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if f}


def restore(name: Optional[str], params: Path) -> list[str]:
    """Bring back the run HEAD commits (profile `name`; None: whichever it is): params.yaml,
    dvc.lock and every pipeline output git tracks as HEAD has them, then `dvc checkout`.
    Returns the lines to print; a ConfigError / DataError line when it cannot."""
    root = checkout_root(params)
    if root is None:
        raise ConfigError("--restore", f"{params} is not the params.yaml at the top of a git checkout: there is no "
                          "committed run to restore", source=SOURCE)
    committed = committed_profile(root)
    if committed is None:
        raise ConfigError("--restore", f"HEAD commits no {LOCK} (or records no profile): there is no committed run "
                          "to restore", source=SOURCE)
    if name is not None and name != committed:
        raise ConfigError("--restore", f"the committed run is profile {committed!r}'s, not {name!r}'s: "
                          f"python -m tadm profile {committed} --restore", source=SOURCE)
    working = root / LOCK
    outs = _lock_outs(_yaml(_at_head(root, LOCK)))
    if working.is_file():
        outs |= _lock_outs(_yaml(working.read_bytes()))
    paths = sorted({PARAMS, LOCK, *outs})
    # what another run added under the outputs (untracked; ignored, DVC-cached files are left to dvc)
    clean = _git(root, "clean", "-fdq", "--", *paths)
    files = _files(_git(root, "ls-tree", "-r", "-z", "--name-only", "HEAD", "--", *paths))
    files |= _files(_git(root, "ls-files", "-z", "--", *paths))
    restored = _git(root, "restore", "--source=HEAD", "--staged", "--worktree", "--pathspec-from-file=-",
                    "--pathspec-file-nul", stdin="\0".join(sorted(files)).encode("utf-8", "surrogateescape"))
    for step, proc in (("git clean", clean), ("git restore", restored)):
        if proc is None or proc.returncode != 0:
            why = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] if proc is not None else []
            raise DataError(f"{SOURCE}: --restore: {step} failed: {why[0] if why else 'git is not available'}")
    roots = sorted({f.split("/", 1)[0] + ("/" if "/" in f else "") for f in files} - {PARAMS, LOCK})
    lines = [f"restored {', '.join([PARAMS, LOCK, *roots])} as HEAD commits them (profile {committed!r})"]
    env = dict(os.environ, DVC_NO_ANALYTICS="1")
    try:
        proc = subprocess.run([sys.executable, "-m", "dvc", "checkout"], cwd=root, capture_output=True, text=True,
                              env=env, timeout=3600)
    except (OSError, subprocess.SubprocessError) as e:
        raise DataError(f"{SOURCE}: --restore: {lines[0]}; `dvc checkout` did not run ({e})") from None
    if proc.returncode != 0:
        err = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        if err and err[0].startswith("ERROR: Checkout failed for following targets"):
            missing = [line for line in err[1:] if not line.startswith(("Is your cache", "<http"))]
            why = f"{len(missing)} DVC-tracked output(s) are not in this checkout's DVC cache (`dvc pull` them, or `dvc repro` rebuilds them)"
        else:
            why = next((line for line in err if line.startswith("ERROR")), err[0] if err else f"exit {proc.returncode}")
        raise DataError(f"{SOURCE}: --restore: {lines[0]}, but `dvc checkout` failed: {why}")
    lines.append(f"dvc checkout: the DVC-tracked outputs of {LOCK} are back")
    return lines
