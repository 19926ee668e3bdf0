"""The host side's mechanics behind :mod:`tadm.tasks.sandbox`: how a run is started, probed,
killed, read back and cleaned up. None of the policy is here: the limits, the uid, the
namespaces and the paths are sandbox's, and come in as arguments.

- :class:`_Isolation`, :func:`_candidates`, :func:`_first_isolation`: the routes into the
  namespaces, and the probe that finds the first that works;
- :func:`_child_setup`: the ``preexec_fn`` that applies the rlimits, arms the parent-death signal
  and, on the unsafe host route, tries a fresh network namespace;
- :func:`_read_only_paths`: the host paths the sandbox shows read-only;
- :func:`_children`, :func:`_kill_group`: the end of a run, its PID namespace's init first;
- :func:`_read`, :func:`_tail`, :func:`_classify`, :func:`_signal_from_marker`: how a run ended;
- :func:`_remove_tree` and :func:`remove_leftovers`: each run's throw-away host directory
  (``LEFTOVER_PREFIX``, the evaluator's pid, a random part) goes after the run, and one left by an
  evaluator killed mid-run (``kill -9``) goes at the next evaluator's first run.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
# Each run's throw-away host directory: this prefix, the evaluator's pid, "-", a random part. A
# directory whose evaluator died (kill -9 mid-run) is removed by the next evaluator's first run.
LEFTOVER_PREFIX = "tadm-sandbox-"

# Loaded in the parent: the child only calls it between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class _Isolation:
    """How to start a run inside the namespaces: the `unshare` argv prefix, and whether it makes
    a user namespace (the evaluator is not root, or root lacks the capabilities)."""

    prefix: tuple[str, ...]
    user_namespace: bool


# The probe's program, run through each route: it prints its pid, uid and cwd and what / holds.
PROBE_PROGRAM = "import os\nprint(os.getpid(), os.getuid(), os.getcwd(), sorted(os.listdir('/')))\n"


def _candidates(unshare: str | None, namespaces: tuple[str, ...],
                user_namespace: tuple[str, ...]) -> list[_Isolation]:
    """The routes into `namespaces` to try with the `unshare` program (none without one), in
    order: as root, without a user namespace (root's own capabilities; the code then runs as the
    sandbox uid); otherwise (or where root lacks them) in a user namespace (`user_namespace`,
    ``unshare``'s options for one) first."""
    if unshare is None:
        return []
    plain = _Isolation((unshare, *namespaces, "--"), False)
    user = _Isolation((unshare, *user_namespace, *namespaces, "--"), True)
    return [plain, user] if os.geteuid() == 0 else [user]


def _first_isolation(candidates: list[_Isolation], spawn, expected: str) -> object:
    """The first of `candidates` under which PROBE_PROGRAM, run by ``spawn(program,
    isolation=...)`` (its (return code, timed out, stdout, stderr, completed)), runs as pid 1,
    prints `expected` (the sandbox uid and directory) and sees only the sandbox's file-system
    view; otherwise why not (one line)."""
    if not candidates:
        return "util-linux `unshare` is not installed"
    why = "unknown"
    for isolation in candidates:
        try:
            returncode, _, stdout, stderr, _ = spawn(PROBE_PROGRAM, isolation=isolation)
        except (OSError, subprocess.SubprocessError) as e:
            why = f"{type(e).__name__}: {e}"
            continue
        pid, _, rest = stdout.strip().partition(" ")
        if returncode == 0 and pid == "1" and rest.startswith(expected) and "work" not in rest:
            return isolation
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        why = (lines[-1] if lines else f"exit status {returncode}, output {stdout.strip()[:200]!r}")
        why = f"{' '.join(isolation.prefix[1:-1])}: {why}"
    return why


def _child_setup(limits: list[tuple[int, tuple[int, int]]], *, new_net: bool = False):
    """The preexec_fn: apply the rlimits (`unshare`, `_sandbox_init` and the program inherit
    them across exec) and, on the unsafe host route only, try a fresh network namespace."""

    def setup() -> None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the run dies with the evaluator
        for res, values in limits:
            resource.setrlimit(res, values)
        if new_net:
            _LIBC.unshare(CLONE_NEWNET)  # fails with EPERM where not permitted: the prelude remains

    return setup


def _interpreter() -> str:
    """The real interpreter behind sys.executable (a venv's bin/python is a symlink to it): the
    sandbox shows its prefix, not the venv (the code runs with -I -S: no site-packages anyway)."""
    return os.path.realpath(sys.executable)


def _read_only_paths(system: tuple[str, ...], python: str) -> list[str]:
    """What the sandbox shows read-only: the `system` paths that exist (programs, libraries, the
    dynamic loader's configuration), then the prefixes of the interpreter `python` and of
    sys.base_prefix (where not already under those)."""
    paths = [p for p in system if os.path.lexists(p)]
    for extra in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python)):
        extra = os.path.realpath(extra)
        if not any(extra == p or extra.startswith(p.rstrip("/") + "/") for p in paths):
            paths.append(extra)
    return paths


def _read(f, limit: int) -> str:
    f.seek(0)
    return f.read(limit).decode("utf-8", errors="replace")


def _tail(text: str, limit: int) -> str:
    """The last `limit` characters of `text` (where a traceback ends), marked where cut."""
    return text if len(text) <= limit else "[...]" + text[-limit:]


def _classify(returncode: int, timed_out: bool, stderr: str, completed: bool = True) -> str:
    if timed_out:
        return "timeout"
    if returncode == 0:
        return "ok" if completed else "early-exit"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory"
    return "killed" if returncode < 0 else "error"


def _signal_from_marker(returncode: int, marker) -> int:
    """-N where the prelude, as pid 1 of a PID namespace, exited with 128+N for signal N (and
    wrote N to the `marker` file, the program's SIGNAL_FD)."""
    if not 128 < returncode < 128 + signal.NSIG:
        return returncode
    try:
        marked = int(_read(marker, 8))
    except ValueError:
        return returncode
    return -marked if marked == returncode - 128 else returncode


def _children(pid: int) -> list[int]:
    """The children of `pid` (its main thread's; ``unshare`` has one thread)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_group(pgid: int, inits: list[int]) -> None:
    """Kill the run: first the namespace's init (`inits`: ``unshare``'s children, :func:`_children`
    of `pgid`; its death takes every process of the PID namespace with it, whatever session or
    group they moved to), then ``unshare``'s process group `pgid`."""
    for pid in inits:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove_tree(path: str) -> None:
    """Delete the sandbox dir even if the code made parts of it unreadable or unwritable."""

    def retry(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=retry)
    shutil.rmtree(path, ignore_errors=True)


def remove_leftovers(tmp: str | None = None) -> list[str]:
    """Delete the throw-away directories of evaluators that died mid-run (``kill -9``): this uid's
    ``tadm-sandbox-<pid>-*`` directories in `tmp` (the temporary directory) whose pid is gone.
    Called once per evaluator, before its first run; returns what it removed."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        pid, dash, _ = name[len(LEFTOVER_PREFIX):].partition("-")
        if not (name.startswith(LEFTOVER_PREFIX) and dash and pid.isdigit()):
            continue
        path = os.path.join(tmp, name)
        try:
            if os.lstat(path).st_uid != os.geteuid() or not stat.S_ISDIR(os.lstat(path).st_mode):
                continue
            os.kill(int(pid), 0)
            continue  # its evaluator is alive (or the pid was reused: left for a later start)
        except ProcessLookupError:
            pass
        except (OSError, OverflowError):
            continue
        _remove_tree(path)
        removed.append(path)
    return removed
