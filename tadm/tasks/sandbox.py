"""Run untrusted, model-generated Python code in a separate, limited process.

The boundary is the operating system, not Python. :func:`run_python` writes the code to
``main.py`` in a fresh throw-away host directory, beside a one-line entry file that runs the
prelude (7), and runs that with ``python -I -S -B`` (isolated mode, no site-packages, no bytecode
writes) through util-linux ``unshare`` and :mod:`tadm.tasks._sandbox_init`:

1. **Its own namespaces**: mount, PID, network, IPC and UTS (``unshare --mount --pid --net --ipc
   --uts --fork --kill-child``; plus ``--user --map-root-user`` where the evaluator is not root,
   or is root without the capabilities). The code is pid 1 of its PID namespace: it cannot see
   or signal any process outside it. Its network namespace has only a loopback interface, down.
2. **Its own file-system view**, built by ``_sandbox_init`` and entered with ``pivot_root`` (the
   host's root is then detached): a read-only tmpfs root holding read-only bind mounts of
   ``/usr``, ``/bin``, ``/sbin``, ``/lib*``, the dynamic loader's files in ``/etc`` and the
   interpreter's own prefix (where it lives outside ``/usr``, e.g. a pyenv under ``/root``);
   ``/dev/{null,zero,full,random,urandom}``; a **private** ``/proc`` (only the sandbox's own
   processes: no ``/proc/<evaluator pid>/environ``); a private tmpfs ``/tmp``; and a private
   tmpfs at ``/sandbox`` (cwd, HOME and TMPDIR) holding a copy of the program. The two tmpfs are
   the only writable places, ``DISK_MB`` (64 MiB) and 4,096 files each: nothing the code writes
   reaches the host's disk, and it all goes with the mount namespace. Nothing else of the
   host is reachable: not the repository, not HOME, not the venv, not ``/etc/passwd``. All
   mounts are nosuid and nodev. The environment is PATH, HOME, TMPDIR and a UTF-8 locale only.
3. **An unprivileged uid**: the code runs as uid/gid 65534 (``nobody``), with no supplementary
   groups, no capabilities and ``no_new_privs``. As root the init process switches to 65534 with
   ``setresuid`` (which drops every capability); in a user namespace, a nested user namespace maps
   65534 to the evaluator's own uid and nothing else. So the code is never root: even if it gets
   past every Python-level guard it can write only to ``/sandbox`` and its private ``/tmp``, and
   ``RLIMIT_NPROC`` (``THREADS``) is enforced, and the seccomp filter refuses every new process
   (point 6), so it cannot fork or run a shell; it may start threads (the ``threading`` idiom
   for deep recursion with a larger stack), as many as its address space holds stacks for, and
   no more than ``THREADS`` tasks of the sandbox uid over all concurrent runs.
4. **Resource limits** set before ``exec`` and inherited: address space (``memory_mb``), CPU
   seconds (``ceil(timeout_s) + 1``), file size (10 MiB -- also caps stdout/stderr, which go to
   files), open files (64), tasks of the sandbox uid (``THREADS``, 256 over all concurrent runs:
   threads, as the filter refuses processes; set by ``_sandbox_init`` after the uid switch, as the
   kernel would otherwise refuse the exec), pending signals (``PENDING_SIGNALS``, 64: each POSIX
   timer holds one, so ``timer_create`` cannot pin kernel memory) and core dumps (0).
5. **Nothing outlives the run**: after every run (and on the wall-clock timeout) the evaluator
   SIGKILLs the PID namespace's init -- the program -- which takes every process of the namespace
   with it, whatever session or group it moved to (``setsid``), then ``unshare``'s process group.
   Should that be missed, the program carries a parent-death signal (SIGKILL when ``unshare``
   dies; re-armed after the uid switch, which clears the one ``--kill-child`` set), and
   ``unshare`` one for the evaluator's own death.
6. **A seccomp filter** (:mod:`tadm.tasks._sandbox_seccomp`, x86-64 and aarch64; its docstring
   lists each call), installed last before the exec: no new namespaces (``unshare``, ``setns``,
   ``clone`` with ``CLONE_NEW*``: no nested user namespace's capabilities), no ``io_uring``, no
   mounts, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``ptrace`` or keyrings, no System V
   IPC or ``memfd`` (memory the address-space limit would not count), no sockets but
   ``AF_UNIX``, ``AF_INET`` and ``AF_INET6``, no inotify or fanotify, no clearing of the
   parent-death signal, and no new process (threads are allowed): each answers EPERM; another
   ABI kills the process.
7. **A Python prelude** (:mod:`tadm.tasks._sandbox_prelude`; its docstring is its contract) that
   installs its guards, runs ``main.py`` as the ``__main__`` module and, once the code's last line
   has run, writes the **completion marker** (``DONE_FD``: "done:" and a per-run secret). A run
   has passed only with that marker and exit status 0: ``sys.exit`` / ``SystemExit`` at any
   status, ``os._exit``, a signal to itself, a closed or moved descriptor all end it without the
   marker (reason "early-exit" where the status is 0), and text on stdout counts for nothing. Its
   guards are defence in depth against the common accidents of generated code, **not** a security
   boundary: each known escape is a regression test (tests/tasks/test_tasks_sandbox.py), and the
   layers above must leave it nothing to reach -- no file outside written, no process run as
   root, no secret of the evaluator read.

Whether the namespaces work is probed once per evaluator process, by running a probe program
through the very same route (as root: without, then with, a user namespace). **Where they do
not** (no ``unshare``, a kernel or container that refuses them), generated code is not run:
:func:`run_python` raises :class:`SandboxUnavailable` with one line saying why and how to allow
it. Only an explicit ``unsafe_host_execution=True`` (``--unsafe-host-execution``) runs it
anyway: a plain child on the host in the throw-away directory, under the rlimits
above and the prelude, in a fresh network namespace where the kernel permits one -- as the
evaluator's uid, with the host's /proc and file system readable, i.e. with no boundary beyond
what the prelude catches (and no seccomp filter). Use it only for code you trust or inside a
disposable VM. Each run's throw-away directory is named after its evaluator's pid; one left by an
evaluator killed mid-run (``kill -9``) is removed by the next evaluator's first run.

Limits of the boundary, stated plainly: the code shares the host kernel (a kernel exploit is out
of scope); ``/usr`` and the interpreter's prefix are readable (they hold no secrets on a normal
set-up -- put none there); the sysctls under ``/proc/sys`` are readable; the set-up (a few
milliseconds of CPU) counts against the run's CPU limit; memory outside the address-space limit
``memory_mb`` is bounded by the two tmpfs (2 x ``DISK_MB`` = 128 MiB) plus kernel buffers of at
most ``OPEN_FILES_LIMIT`` descriptors (pipes: 32 of at most 1 MiB each at the kernel's default
``fs.pipe-max-size``), about 160 MiB per run; in :func:`run_python` the completion marker's
secret lives in the prelude's memory, so code written to defeat the evaluator -- reading the
prelude's frames, scanning ``/proc/self/mem`` -- can forge the marker, at once or from an
``atexit`` handler, a finalizer or a signal handler (there it stops early exits, not an
adversary; the OS layers bound what such code can reach). :func:`run_checked` closes that: the
code under test and the code that judges it run in two sandboxes joined by pipes, values cross
as plain data, and the secret is only in the judge's, which runs none of the other's code; the
syscalls the filter allows are the kernel surface that remains (the seccomp filter is a deny
list, not an allow list).

Being pid 1 changes one thing for the code (the prelude's docstring): a signal it sends itself
ends it as before, but one the kernel sends with no handler installed (SIGXCPU at the CPU soft
limit, SIGALRM) is ignored, and the timeout or the hard CPU limit (SIGKILL) ends it instead.

Known costs: ``asyncio`` (needs a socket pair), ``multiprocessing``, ``subprocess`` and
``ctypes`` are unavailable; tracebacks start with two frames of the prelude; each run starts the
interpreter twice (the namespace's init, then the program), a checked run four times (two
sandboxes, started side by side).

This module holds the policy (every limit, the uid, the layout), the probe, the launch and the
entry points; :mod:`tadm.tasks._sandbox_host` the host side's mechanics (the ``preexec_fn``, the
probe's loop, killing a run, reading it back, removing its directory and dead evaluators' ones).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from tadm.tasks._sandbox_host import (
    LEFTOVER_PREFIX, _candidates, _child_setup, _children, _classify, _first_isolation, _interpreter, _Isolation,
    _kill_group, _read, _read_only_paths, _remove_tree, _signal_from_marker, _tail, remove_leftovers,
)

__all__ = ["SandboxResult", "SandboxUnavailable", "run_python", "run_checked", "build_program", "isolation_available", "PRELUDE"]

FILE_SIZE_LIMIT = 10 * 1024 * 1024  # bytes a program may write to any file, stdout included
OPEN_FILES_LIMIT = 64
# RLIMIT_NPROC in the sandbox: threads of the sandbox uid over every concurrent run (point 3 above)
THREADS = 256
PENDING_SIGNALS = 64  # RLIMIT_SIGPENDING: queued signals, and so POSIX timers (each holds one)
STDERR_LIMIT = 4000  # characters of stderr kept (the tail: where a traceback ends)
PROGRAM_NAME = "main.py"
# A host file where the prelude, as pid 1, records the signal N it ended the program by (exit 128 + N).
SIGNAL_FD = 3
# The completion marker's descriptor (a host file; point 7 above): the secret is read from it and
# erased before the code starts, and "done:" and the secret written back once its last line ran.
DONE_FD = 4
DONE_TAG = "done:"
# A checked run's two halves (:func:`run_checked`) each read one pipe and write the other, at these
# descriptors inside (read, write); a message (a call's arguments, or its value) is at most this long.
CHANNEL_FDS = (5, 6)
MESSAGE_LIMIT = 16 * 1024 * 1024
# The file the interpreter runs: one line that executes the prelude, which then runs main.py.
ENTRY_NAME = "_sandbox_entry.py"
# The size of each of the two writable places inside, /sandbox (the cwd) and /tmp: tmpfs, held in
# memory and gone with the mount namespace (plus stdout and stderr, FILE_SIZE_LIMIT each)
DISK_MB = 64
PROBE_TIMEOUT_S = 20.0

# The OS boundary: the uid the code runs as, where its directory appears, the namespaces.
SANDBOX_UID = 65534  # "nobody"
SANDBOX_DIR = "/sandbox"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
NAMESPACES = ("--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child")
USER_NAMESPACE = ("--user", "--map-root-user")
INIT_SCRIPT = Path(__file__).with_name("_sandbox_init.py")
INIT_FAILED = 125  # _sandbox_init's exit status when it could not build the sandbox
# Host paths shown read-only inside (where they exist), then the interpreter's own prefixes.
READ_ONLY_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                   "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime")
# One line: why generated code is not run, and how to allow it (appended to the probe's reason).
HOW_TO_ALLOW = ("run the evaluator as root, or allow user namespaces (sysctl kernel.unprivileged_userns_clone=1 "
                "and user.max_user_namespaces > 0; in a container: --cap-add SYS_ADMIN with an unconfined "
                "seccomp/AppArmor profile), or opt in to running it on this host behind the Python prelude "
                "only with --unsafe-host-execution (unsafe_host_execution=True)")

# The isolation that works here (an _Isolation), or why none does (a str); _UNPROBED until the
# first run probes it (once per process).
_UNPROBED = object()
_isolation: object = _UNPROBED
_probe_lock = threading.Lock()
_warned_unsafe = False


class SandboxUnavailable(RuntimeError):
    """The kernel will not give generated code its own namespaces here, and running it on the
    host was not explicitly allowed (``unsafe_host_execution``)."""


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run.

    `passed` is exit code 0 without a timeout, the code having run to its last line
    (`completed`, the prelude's marker); `reason` is one of "ok", "error" (a non-zero exit: an
    exception, a failed assert, sys.exit(n)), "early-exit" (exit status 0 before the code's last
    line: sys.exit(0), SystemExit, os._exit(0)), "timeout" (wall clock or CPU limit), "memory" (ran
    out of its address space) or "killed" (died by a signal, e.g. a segfault).
    """

    passed: bool
    returncode: int
    timed_out: bool
    stdout: str
    stderr: str
    reason: str
    completed: bool


# The source text the entry line executes before the code (:mod:`tadm.tasks._sandbox_prelude`: never imported).
PRELUDE = Path(__file__).with_name("_sandbox_prelude.py").read_text(encoding="utf-8")


def build_program(done_fd: int = DONE_FD, role: str | tuple[str, str] | None = None,
                  channel: tuple[int, int] | None = None) -> str:
    """The file the interpreter runs (ENTRY_NAME): one line that executes the prelude, which
    guards, then compiles and runs the code (main.py, beside it) as the ``__main__`` module --
    no line of the code runs before the guards, ``from __future__`` imports apply as written and
    tracebacks give the code's own line numbers -- and writes the completion marker to `done_fd`
    once the code's last line has run. In a checked run (:func:`run_checked`) `role` is "check"
    or ("serve", function name) and `channel` the (read, write) descriptors of its pipes."""
    if (role is None) != (channel is None):
        raise ValueError("sandbox: a role needs a channel, and a channel a role")
    return (f"exec(compile({PRELUDE!r}, '<sandbox-prelude>', 'exec'), "
            f"{{'__name__': '_sandbox_prelude', '_DONE_FD': {int(done_fd)}, '_ROLE': {role!r}, "
            f"'_CHANNEL': {None if channel is None else tuple(int(fd) for fd in channel)!r}, "
            f"'_MESSAGE_LIMIT': {MESSAGE_LIMIT}}})\n")


def _limits(timeout_s: float, memory_mb: int, *, nproc: bool = True) -> list[tuple[int, tuple[int, int]]]:
    """The rlimits for the child, each capped at the current hard limit (lowering is allowed).
    Without `nproc` RLIMIT_NPROC is left out: in the sandbox `_sandbox_init` sets it after the
    switch to the sandbox uid (set before, the kernel would refuse the exec)."""
    cpu = math.ceil(timeout_s) + 1
    wanted = [
        (resource.RLIMIT_AS, memory_mb * 1024 * 1024, memory_mb * 1024 * 1024),
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL at the hard one
        (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT, FILE_SIZE_LIMIT),
        (resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT, OPEN_FILES_LIMIT),
        *([(resource.RLIMIT_NPROC, 0, 0)] if nproc else []),  # not enforced for root
        (resource.RLIMIT_SIGPENDING, PENDING_SIGNALS, PENDING_SIGNALS),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    limits = []
    for res, soft, hard in wanted:
        current_hard = resource.getrlimit(res)[1]
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        limits.append((res, (soft, hard)))
    return limits


def _init_argv(isolation: _Isolation, base: str, work: str, env: dict[str, str], marker: int, done: int,
               entry: str, channel: tuple[int, ...] = ()) -> list[str]:
    """unshare ... -- python -I -S _sandbox_init.py SPEC: the run's full argv on the sandbox route."""
    python = _interpreter()
    spec = {"root": os.path.join(base, "root"), "work": work, "ro": _read_only_paths(READ_ONLY_PATHS, python),
            "disk_mb": DISK_MB, "marker": marker, "done": done, "channel": list(channel),
            "userns": isolation.user_namespace, "uid": SANDBOX_UID, "nproc": THREADS, "env": env,
            "argv": [python, "-I", "-S", "-B", entry]}
    return [*isolation.prefix, python, "-I", "-S", "-B", str(INIT_SCRIPT), json.dumps(spec)]


def _probe_isolation() -> object:
    """The first route under which a probe program runs as pid 1, as SANDBOX_UID, in SANDBOX_DIR,
    with only the sandbox's file-system view; otherwise why not (one line)."""
    candidates = _candidates(shutil.which("unshare"), NAMESPACES, USER_NAMESPACE)
    spawn = functools.partial(_spawn, timeout_s=PROBE_TIMEOUT_S, memory_mb=512, stdin="")
    return _first_isolation(candidates, spawn, f"{SANDBOX_UID} {SANDBOX_DIR} ")


def _isolation_or_reason() -> object:
    """The probed route (an _Isolation) or why there is none (a str); probed once per process,
    after removing the leftovers of evaluators that died mid-run."""
    global _isolation
    with _probe_lock:
        if _isolation is _UNPROBED:
            remove_leftovers()
            _isolation = _probe_isolation()
        return _isolation


def isolation_available() -> bool:
    """Whether generated code can run behind the OS boundary here (probes once per process)."""
    return isinstance(_isolation_or_reason(), _Isolation)


def _refuse(why: str) -> None:
    """Refuse to run generated code: one line, saying why and how to allow it."""
    raise SandboxUnavailable(f"sandbox: refusing to run generated code, it cannot be isolated here ({why}); "
                             + HOW_TO_ALLOW)


def _warn_unsafe(why: str) -> None:
    global _warned_unsafe
    if not _warned_unsafe:
        _warned_unsafe = True
        sys.stderr.write(f"warning: sandbox: running generated code on this host with only the Python prelude "
                         f"and rlimits (--unsafe-host-execution; {why})\n")


def _route(timeout_s: float, memory_mb: int, unsafe_host_execution: bool) -> _Isolation | None:
    """Where a run goes, its limits checked: the probed isolation; where there is none, None (the
    unsafe host route) if `unsafe_host_execution`, else SandboxUnavailable (:func:`_refuse`)."""
    if not timeout_s > 0:
        raise ValueError(f"sandbox: timeout_s must be > 0, got {timeout_s}")
    if not memory_mb > 0:
        raise ValueError(f"sandbox: memory_mb must be > 0, got {memory_mb}")
    isolation = _isolation_or_reason()
    if isinstance(isolation, _Isolation):
        return isolation
    if not unsafe_host_execution:
        _refuse(str(isolation))
    _warn_unsafe(str(isolation))
    return None


class _Launch:
    """One program started behind the boundary: its throw-away directory, the host files it
    writes (stdout, stderr, the signal and completion markers) and reads (stdin), its process.
    `role` and `channel` (host pipe descriptors, (read, write)) make it one half of a checked run
    (:func:`run_checked`); the descriptors appear inside as CHANNEL_FDS."""

    def __init__(self, program: str, *, timeout_s: float, memory_mb: int, stdin: str,
                 isolation: _Isolation | None, prelude: bool = False, role=None,
                 channel: tuple[int, int] | None = None) -> None:
        self.isolation, self.prelude = isolation, prelude
        self.stack = contextlib.ExitStack()
        try:
            self._start(program, timeout_s, memory_mb, stdin, role, channel)
        except BaseException:
            self.close()
            raise

    def _start(self, program, timeout_s, memory_mb, stdin, role, channel) -> None:
        isolation = self.isolation
        self.base = base = tempfile.mkdtemp(prefix=f"{LEFTOVER_PREFIX}{os.getpid()}-")
        self.stack.callback(_remove_tree, base)
        work = os.path.join(base, "work")
        os.mkdir(work)
        with open(os.path.join(work, PROGRAM_NAME), "w", encoding="utf-8") as f:
            f.write(program)
        self.out, self.err, inp, self.marker, self.done = (
            self.stack.enter_context(tempfile.TemporaryFile()) for _ in range(5))
        self.secret = secrets.token_hex(16)
        if role is None or role == "check":  # a checked run's solution half holds no secret
            self.done.write(self.secret.encode())
            self.done.flush()
        host_channel = tuple(channel) if channel is not None else ()
        entry = PROGRAM_NAME
        if self.prelude:
            entry = ENTRY_NAME
            inside = None if channel is None else CHANNEL_FDS if isolation is not None else host_channel
            with open(os.path.join(work, ENTRY_NAME), "w", encoding="utf-8") as f:
                f.write(build_program(DONE_FD if isolation is not None else self.done.fileno(), role, inside))
        if isolation is not None:
            os.mkdir(os.path.join(base, "root"))
            env = {"PATH": SANDBOX_PATH, "HOME": SANDBOX_DIR, "TMPDIR": SANDBOX_DIR, "LC_ALL": "C.UTF-8"}
            argv = _init_argv(isolation, base, work, env, self.marker.fileno(), self.done.fileno(), entry,
                              host_channel)
            cwd, launcher_env = base, {"PATH": SANDBOX_PATH}
            pass_fds = (self.marker.fileno(), self.done.fileno(), *host_channel)
            setup = _child_setup(_limits(timeout_s, memory_mb, nproc=False))
        else:
            env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": work, "TMPDIR": work, "LC_ALL": "C.UTF-8"}
            argv, cwd, launcher_env = [sys.executable, "-I", "-S", "-B", entry], work, env
            setup = _child_setup(_limits(timeout_s, memory_mb), new_net=True)
            pass_fds = (self.done.fileno(), *host_channel)
        inp.write(stdin.encode("utf-8"))
        inp.seek(0)
        self.proc = subprocess.Popen(argv, cwd=cwd, env=launcher_env, stdin=inp, stdout=self.out, stderr=self.err,
                                     close_fds=True, pass_fds=pass_fds, start_new_session=True, preexec_fn=setup)
        self.stack.callback(self._kill)

    def _kill(self) -> None:
        # the code's leftovers too, if it ever managed to fork
        _kill_group(self.proc.pid, _children(self.proc.pid))
        self.proc.wait()

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the program to end; whether it ran out of time."""
        try:
            self.proc.wait(timeout=max(timeout_s, 0.0))
            return False
        except subprocess.TimeoutExpired:
            return True

    def finish(self) -> tuple[int, str, str, bool]:
        """Kill what is left of the run; (return code, stdout, stderr, completed)."""
        self._kill()
        returncode = self.proc.returncode
        stdout, stderr = _read(self.out, FILE_SIZE_LIMIT), _read(self.err, FILE_SIZE_LIMIT)
        completed = self.prelude and _read(self.done, 128) == DONE_TAG + self.secret
        if self.isolation is not None:
            returncode = _signal_from_marker(returncode, self.marker)
        return returncode, stdout, stderr, completed

    def close(self) -> None:
        self.stack.close()


def _spawn(program: str, *, timeout_s: float, memory_mb: int, stdin: str,
           isolation: _Isolation | None, prelude: bool = False) -> tuple[int, bool, str, str, bool]:
    """Run `program` (main.py); (return code, timed out, stdout, stderr, completed). With
    `prelude` the interpreter runs the prelude's entry line (ENTRY_NAME), which runs main.py, and
    `completed` says whether the completion marker is there; without, `program` runs as given and
    `completed` is False. `isolation` None is the unsafe host route: a plain child in a throw-away
    directory (see the module docstring)."""
    launch = _Launch(program, timeout_s=timeout_s, memory_mb=memory_mb, stdin=stdin, isolation=isolation,
                     prelude=prelude)
    try:
        timed_out = launch.wait(timeout_s)
        returncode, stdout, stderr, completed = launch.finish()
    finally:
        launch.close()
    return returncode, timed_out, stdout, stderr, completed


def _run_program(program: str, *, timeout_s: float, memory_mb: int, stdin: str,
                 unsafe_host_execution: bool = False, prelude: bool = False) -> SandboxResult:
    """Run `program` (main.py) behind the OS boundary; with `prelude`, behind the prelude too
    (:func:`run_python`).

    Without the prelude this is the namespace/uid/rlimit layer on its own, and a run counts as
    complete when it exits 0 (there is no marker to read). `unshare` re-raises a signal that
    killed its child on itself, so the return code is -N for signal N either way. Where the
    namespaces do not work: as :func:`_route` says.
    """
    isolation = _route(timeout_s, memory_mb, unsafe_host_execution)
    returncode, timed_out, stdout, stderr, completed = _spawn(
        program, timeout_s=timeout_s, memory_mb=memory_mb, stdin=stdin, isolation=isolation, prelude=prelude)
    if returncode == -signal.SIGXCPU:  # the CPU-seconds limit is a timeout too
        timed_out = True
    if not prelude:
        completed = returncode == 0 and not timed_out
    reason = _classify(returncode, timed_out, stderr, completed)
    return SandboxResult(
        passed=returncode == 0 and not timed_out and completed, completed=completed, returncode=returncode,
        timed_out=timed_out, stdout=stdout, stderr=_tail(stderr, STDERR_LIMIT), reason=reason,
    )


def run_checked(solution: str, checker: str, function: str, *, timeout_s: float = 5.0, memory_mb: int = 512,
                unsafe_host_execution: bool = False) -> SandboxResult:
    """Check untrusted code by trusted tests, each in a sandbox of its own: `solution` (say, a
    prompt and a model's completion) defines `function`; `checker` (the tests) calls it as
    ``__sandbox_candidate__``, and has passed once its last line ran (the completion marker, in
    the checker's run alone) and it exited 0.

    The two programs are two runs of :func:`run_python`'s boundary (separate PID, mount, network
    and IPC namespaces each), joined by two pipes: a call sends its arguments to the solution's
    process, which calls `function` there and sends back the value, and the checker receives it
    as plain data -- None, bool, int, float, complex, str, bytes and lists, tuples, dicts, sets and
    frozensets of them, rebuilt as fresh built-in objects (the standard library's dict types travel
    as a dict). A value of any other type -- an object of a class the solution defined, whatever
    its ``__eq__`` -- fails the call, as does an exception in `function` (the checker sees a
    RuntimeError naming it). So nothing the solution does in its own process reaches the tests:
    not ``sys.settrace`` / ``setprofile``, frame walking, replaced ``builtins``, atexit handlers,
    finalizers or signal handlers; and the checker's secret is in no memory the solution can
    read (another PID namespace: not in its /proc, not signalled, not traced). `timeout_s` and
    `memory_mb` apply to each process; the run times out when the checker has not ended by then.
    ``stdout`` is the solution's, ``stderr`` the checker's with the solution's after it.
    """
    if not function.isidentifier():
        raise ValueError(f"sandbox: function must be a Python identifier, got {function!r}")
    isolation = _route(timeout_s, memory_mb, unsafe_host_execution)
    with contextlib.ExitStack() as stack:
        calls, replies = os.pipe(), os.pipe()  # (read, write) each: checker -> solution, solution -> checker
        host_ends = [*calls, *replies]
        stack.callback(lambda: [os.close(fd) for fd in host_ends])
        kw = dict(timeout_s=timeout_s, memory_mb=memory_mb, stdin="", isolation=isolation, prelude=True)
        solver = _Launch(solution, role=("serve", function), channel=(calls[0], replies[1]), **kw)
        stack.callback(solver.close)
        tests = _Launch(checker, role="check", channel=(replies[0], calls[1]), **kw)
        stack.callback(tests.close)
        for fd in host_ends:  # only the two halves hold the pipes now: either one's end is seen by the other
            os.close(fd)
        host_ends.clear()
        timed_out = tests.wait(timeout_s)
        returncode, _, check_err, completed = tests.finish()
        _, stdout, solve_err, _ = solver.finish()
    if returncode == -signal.SIGXCPU:
        timed_out = True
    solver_part = f"\n[the solution's process]\n{_tail(solve_err, STDERR_LIMIT)}" if solve_err.strip() else ""
    return SandboxResult(
        passed=returncode == 0 and not timed_out and completed, completed=completed, returncode=returncode,
        timed_out=timed_out, stdout=stdout, stderr=_tail(check_err + solver_part, STDERR_LIMIT),
        reason=_classify(returncode, timed_out, check_err, completed))


def run_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512, stdin: str = "",
               unsafe_host_execution: bool = False) -> SandboxResult:
    """Run untrusted Python `code` in a sandboxed child process and report how it ended.

    It has passed only when it exited 0 after its last line ran (the prelude's completion marker):
    a program that ends early with status 0 -- ``sys.exit(0)``, ``raise SystemExit``,
    ``os._exit(0)`` -- has not (reason "early-exit").

    `stdin` is fed to the program; its stdout comes back whole (up to 10 MiB), its stderr as
    the last few KB. Whatever the code does, this returns (it never raises for the code's
    behaviour) and leaves no process or file behind. Where the OS boundary cannot be built it
    raises SandboxUnavailable (one line: why, and how to allow it) unless
    `unsafe_host_execution` is True, which runs the code on the host behind the prelude only.
    """
    return _run_program(code, timeout_s=timeout_s, memory_mb=memory_mb, stdin=stdin,
                        unsafe_host_execution=unsafe_host_execution, prelude=True)
