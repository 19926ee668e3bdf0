"""Run untrusted, model-generated Python code in a separate, limited process.

:func:`run_python` writes the code to a file in a fresh throw-away directory and runs it with
``python -I -S -B`` (isolated mode, no site-packages, no bytecode writes). What stops runaway
code, from the layer that matters most:

1. **A separate process** in its own session. On the wall-clock timeout the whole process
   group is killed (SIGKILL), and it is killed again after every run so that nothing the code
   left behind keeps running. The evaluator never shares memory, files or signals with it.
2. **Resource limits** set in the child before ``exec``: address space (``memory_mb``), CPU
   seconds (``ceil(timeout_s) + 1``), file size (10 MiB -- also caps stdout/stderr, which go to
   files), open files (64), processes (0: no fork, for a non-root user) and core dumps (0).
3. **A throw-away directory** as cwd, HOME and TMPDIR, deleted afterwards, and a minimal
   environment (PATH only, plus HOME, TMPDIR and a UTF-8 locale).
4. **Fresh PID and network namespaces** where the kernel permits them (root or CAP_SYS_ADMIN):
   the child is started through util-linux ``unshare --pid --fork --kill-child --net``, so the
   code runs as pid 1 of its own PID namespace (it cannot see or signal any process outside it;
   ``kill(-1, ...)`` reaches only what it started itself) and sees only a loopback interface that
   is down. Whether that works is probed once per evaluator process. Where it does not (no
   ``unshare`` binary, or not permitted) the child falls back to ``unshare(CLONE_NEWNET)`` alone
   where that is permitted, and otherwise runs without namespaces, silently; the prelude applies
   either way.
5. **A Python prelude** run before the code: it disables sockets and name lookups, process
   creation (``os.fork``, ``os.system``, ``os.exec*``, ``os.spawn*``, ``subprocess``,
   ``multiprocessing``), signals to other processes, ``ctypes``, and writes, deletions and
   renames outside the sandbox directory (reads stay allowed, so the stdlib works).

The prelude is **defence in depth, not a security boundary**: Python code can always find a
way around Python-level patches (introspection of the wrappers' closures, for example). It
exists to turn the common accidents of generated code -- a stray ``os.system("rm ...")``, a
download, a ``multiprocessing.Pool`` -- into a clean error.

Running as root (as on the project's dev VMs) weakens the OS layers: the kernel does not
enforce RLIMIT_NPROC for root, so the prelude is what blocks ``fork`` (if it is bypassed, the
children die with the run: with the PID namespace, when its pid 1 exits; without it, by the
process-group kill). When the ``unshare`` route works, the PID namespace is what contains
``os.kill(-1, SIGKILL)`` even with the prelude bypassed: it can then only kill the code's own
processes. When it does not (a machine without util-linux ``unshare``, or a kernel or
container that refuses PID namespaces), the child shares the evaluator's PID namespace and
uid, and only the prelude stops ``os.kill(-1, SIGKILL)`` -- which, as root, kills every process
on the machine. Evaluate as a non-root user, or inside a container or VM, whenever that matters.

Being pid 1 changes one thing for the code: the kernel ignores default-action signals that a
namespace's init sends itself. The prelude makes ``os.kill(os.getpid(), sig)``,
``signal.raise_signal`` and ``os.abort`` end the program as before (reported as killed by that
signal); signals the kernel sends on its own with no handler installed (SIGXCPU at the CPU
soft limit, SIGALRM from ``signal.alarm``) are ignored there, and the wall-clock timeout or the
hard CPU limit (SIGKILL, reported as "killed") ends such a program instead.

Known costs of the prelude: ``asyncio`` (needs a socket pair), ``multiprocessing`` and
``ctypes`` are unavailable; tracebacks report line numbers one higher than in the code
(the prelude is one line at the top of the file).
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass

__all__ = ["SandboxResult", "run_python", "build_program", "PRELUDE"]

FILE_SIZE_LIMIT = 10 * 1024 * 1024  # bytes a program may write to any file, stdout included
OPEN_FILES_LIMIT = 64
STDERR_LIMIT = 4000  # characters of stderr kept (the tail: where a traceback ends)
PROGRAM_NAME = "main.py"
CLONE_NEWNET = 0x40000000
# Written (in the sandbox dir) by the prelude, which spells the name out, when as pid 1 of a PID
# namespace it ends the program "by a signal" the kernel would not deliver (see the module
# docstring); it holds the signal's number, and the exit code is 128 + that number.
SIGNAL_MARKER = ".sandbox-signal"
UNSHARE_PROBE_TIMEOUT_S = 10.0
UNSHARE_OPTIONS = ("--pid", "--fork", "--kill-child", "--net", "--")

# The `unshare` argv prefix when PID + network namespaces work here, None when they do not;
# _UNPROBED until the first run probes it (once per process).
_UNPROBED = object()
_namespace_prefix: object = _UNPROBED
_probe_lock = threading.Lock()

# Loaded in the parent: the child only calls it between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run.

    `passed` is exit code 0 without a timeout; `reason` is one of "ok", "error" (a non-zero
    exit: an exception, a failed assert, sys.exit(n)), "timeout" (wall clock or CPU limit),
    "memory" (ran out of its address space) or "killed" (died by a signal, e.g. a segfault).
    """

    passed: bool
    returncode: int
    timed_out: bool
    stdout: str
    stderr: str
    reason: str


# The prelude: executed (from one line at the top of the program) before the user code, in
# its own namespace. Keep it stdlib-only and quick: it runs once per program.
PRELUDE = r'''
def _sandbox_guard():
    import _imp, _io, _posixsubprocess, _signal, _socket, builtins, errno, io, os, posix, shutil
    import signal, socket, subprocess, sys

    root = os.path.realpath(os.getcwd())

    def deny(what, target=None):
        raise PermissionError(errno.EPERM, f"sandbox: {what} is not allowed", target)

    def inside(path, dir_fd=None):
        """Whether `path` (relative to `dir_fd` or the cwd) resolves into the sandbox dir."""
        if isinstance(path, int):  # an already-open file descriptor
            return True
        path = os.fsdecode(os.fspath(path))
        base = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else os.getcwd()
        full = os.path.realpath(os.path.join(base, path))
        return full == root or full.startswith(root + os.sep)

    def check(path, dir_fd=None):
        if not inside(path, dir_fd):
            deny("writing outside the sandbox directory", os.fsdecode(os.fspath(path)))

    def writes(mode):
        return bool(set(str(mode)) & set("wax+"))

    # --- files: open / FileIO / os.* that create, change or delete -------------------------
    real_open, real_os_open, real_fileio, real_rmtree = builtins.open, os.open, _io.FileIO, shutil.rmtree
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def open_(file, mode="r", *args, **kwargs):
        if writes(mode):
            check(file)
        return real_open(file, mode, *args, **kwargs)

    class FileIO(real_fileio):
        def __init__(self, file, mode="r", *args, **kwargs):
            if writes(mode):
                check(file)
            super().__init__(file, mode, *args, **kwargs)

    def os_open(path, flags, *args, **kwargs):
        if flags & write_flags:
            check(path, kwargs.get("dir_fd"))
        return real_os_open(path, flags, *args, **kwargs)

    def rmtree(path, *args, **kwargs):
        check(path)
        return real_rmtree(path, *args, **kwargs)

    def arg(args, kwargs, i, name):
        return args[i] if len(args) > i else kwargs.get(name)

    def one_path(real):
        def guarded(*args, **kwargs):
            check(arg(args, kwargs, 0, "path"), kwargs.get("dir_fd"))
            return real(*args, **kwargs)
        return guarded

    def two_paths(real):
        def guarded(*args, **kwargs):
            check(arg(args, kwargs, 0, "src"), kwargs.get("src_dir_fd"))
            check(arg(args, kwargs, 1, "dst"), kwargs.get("dst_dir_fd"))
            return real(*args, **kwargs)
        return guarded

    def link_path(real):  # symlink(target, link): only the new link must be inside
        def guarded(*args, **kwargs):
            check(arg(args, kwargs, 1, "dst"), kwargs.get("dir_fd"))
            return real(*args, **kwargs)
        return guarded

    builtins.open = io.open = _io.open = open_
    io.FileIO = _io.FileIO = FileIO
    shutil.rmtree = rmtree
    guards = {name: one_path for name in ("remove", "unlink", "rmdir", "mkdir", "chmod", "chown",
                                          "lchown", "truncate", "utime", "mkfifo", "mknod",
                                          "setxattr", "removexattr")}
    guards.update(rename=two_paths, replace=two_paths, link=two_paths, symlink=link_path)
    for module in (os, posix):
        module.open = os_open
        for name, wrap in guards.items():
            if hasattr(module, name):
                setattr(module, name, wrap(getattr(posix, name)))

    # --- processes and signals --------------------------------------------------------------
    def no_process(*args, **kwargs):
        deny("starting a process")

    for module in (os, posix):
        for name in ("fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
                     "execv", "execve", "execl", "execle", "execlp", "execlpe", "execvp", "execvpe",
                     "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp",
                     "spawnvpe", "pidfd_open"):
            if hasattr(module, name):
                setattr(module, name, no_process)
    _posixsubprocess.fork_exec = no_process

    class Popen(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            deny("starting a process")

    subprocess.Popen = Popen

    real_kill, real_killpg, real_raise, real_abort = os.kill, os.killpg, signal.raise_signal, os.abort
    # pid 1 of a PID namespace: the kernel ignores default-action signals it sends itself, so
    # end the program the way the signal would have, and leave its number for the evaluator
    namespace_init = os.getpid() == 1
    not_fatal = {signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH, signal.SIGSTOP,
                 signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}

    def die_by(sig):
        if namespace_init and sig and sig not in not_fatal and signal.getsignal(sig) == signal.SIG_DFL:
            try:
                with real_open(os.path.join(root, ".sandbox-signal"), "w") as f:
                    f.write(str(int(sig)))
            except OSError:
                pass
            os._exit(128 + int(sig))

    def own_group():  # 0 when the group's leader is outside the PID namespace (`unshare`)
        return os.getpgrp() or None

    def kill(pid, sig):
        group = own_group()
        if pid not in (os.getpid(), *((0, -group) if group else ())):
            deny("signalling another process")
        if pid == os.getpid():
            die_by(sig)
        return real_kill(pid, sig)

    def killpg(pgid, sig):
        group = own_group()
        if not group or pgid not in (0, group):
            deny("signalling another process")
        return real_killpg(pgid, sig)

    def raise_signal(sig):
        die_by(sig)
        return real_raise(sig)

    def abort():
        die_by(signal.SIGABRT)
        return real_abort()

    for module in (os, posix):
        module.kill, module.killpg, module.abort = kill, killpg, abort
    for module in (signal, _signal):
        module.raise_signal = raise_signal
        if hasattr(module, "pidfd_send_signal"):
            module.pidfd_send_signal = no_process

    # --- network -----------------------------------------------------------------------------
    def no_network(*args, **kwargs):
        raise OSError(errno.EACCES, "sandbox: network access is disabled")

    class NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            no_network()

    socket.socket = socket.SocketType = _socket.socket = _socket.SocketType = NoSocket
    for module in (socket, _socket):
        for name in ("create_connection", "create_server", "socketpair", "fromfd", "getaddrinfo",
                     "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo"):
            if hasattr(module, name):
                setattr(module, name, no_network)

    # --- imports: no ctypes/multiprocessing, no fresh copies of the patched built-ins -------
    blocked = {"ctypes", "_ctypes", "multiprocessing", "_multiprocessing", "posix", "_posixsubprocess",
               "_signal", "_socket", "_io", "_imp"}

    class BlockImports:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.partition(".")[0] in blocked:
                raise ImportError(f"sandbox: importing {name} is disabled", name=name)
            return None

    sys.meta_path.insert(0, BlockImports)

    def no_fresh_copy(create):  # module_from_spec(posix.__spec__) would give unpatched functions
        def guarded(spec, *args):
            if spec.name.partition(".")[0] in blocked:
                raise ImportError(f"sandbox: importing {spec.name} is disabled", name=spec.name)
            return create(spec, *args)
        return guarded

    _imp.create_builtin = no_fresh_copy(_imp.create_builtin)
    _imp.create_dynamic = no_fresh_copy(_imp.create_dynamic)


_sandbox_guard()
'''

_FUTURE_IMPORT = re.compile(r"^from[ \t]+__future__[ \t]+import[^\n]*$", re.MULTILINE)


def build_program(code: str) -> str:
    """The file the child runs: one line that executes the prelude, then `code`.

    ``from __future__`` imports must open a module, so they are moved onto that first line
    (their original lines are left blank); every other line keeps its place, one line down.
    """
    futures = [line.split("#")[0].rstrip() for line in _FUTURE_IMPORT.findall(code)]
    code = _FUTURE_IMPORT.sub("", code)
    header = f"exec(compile({PRELUDE!r}, '<sandbox-prelude>', 'exec'), {{'__name__': '_sandbox_prelude'}})"
    return "; ".join([*futures, header]) + "\n" + code + "\n"


def _limits(timeout_s: float, memory_mb: int) -> list[tuple[int, tuple[int, int]]]:
    """The rlimits for the child, each capped at the current hard limit (lowering is allowed)."""
    cpu = math.ceil(timeout_s) + 1
    wanted = [
        (resource.RLIMIT_AS, memory_mb * 1024 * 1024, memory_mb * 1024 * 1024),
        (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL at the hard one
        (resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT, FILE_SIZE_LIMIT),
        (resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT, OPEN_FILES_LIMIT),
        (resource.RLIMIT_NPROC, 0, 0),  # not enforced for root; the prelude blocks fork there
        (resource.RLIMIT_CORE, 0, 0),
    ]
    limits = []
    for res, soft, hard in wanted:
        current_hard = resource.getrlimit(res)[1]
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        limits.append((res, (soft, hard)))
    return limits


def _child_setup(limits: list[tuple[int, tuple[int, int]]], *, new_net: bool = True):
    """The preexec_fn: apply the rlimits (`unshare` and its forked child inherit them across
    exec) and, unless `unshare` makes the namespaces, try to enter a fresh network namespace."""

    def setup() -> None:
        for res, values in limits:
            resource.setrlimit(res, values)
        if new_net:
            _LIBC.unshare(CLONE_NEWNET)  # fails with EPERM where not permitted: the prelude remains

    return setup


def _probe_namespaces() -> list[str] | None:
    """The `unshare` argv prefix if a child started through it, under the same rlimits as a run,
    is pid 1 of a fresh PID namespace (with a fresh network namespace); None otherwise."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    prefix = [unshare, *UNSHARE_OPTIONS]
    try:
        probe = subprocess.run(
            [*prefix, sys.executable, "-I", "-S", "-c", "import os; print(os.getpid())"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=UNSHARE_PROBE_TIMEOUT_S,
            start_new_session=True,
            preexec_fn=_child_setup(_limits(UNSHARE_PROBE_TIMEOUT_S, 512), new_net=False),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return prefix if probe.returncode == 0 and probe.stdout.strip() == b"1" else None


def _namespace_prefix_or_none() -> list[str] | None:
    """The probed `unshare` prefix (probed on first use, then cached for the process)."""
    global _namespace_prefix
    with _probe_lock:
        if _namespace_prefix is _UNPROBED:
            _namespace_prefix = _probe_namespaces()
        return _namespace_prefix  # type: ignore[return-value]


def _kill_group(pgid: int) -> None:
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


def _read(f, limit: int) -> str:
    f.seek(0)
    return f.read(limit).decode("utf-8", errors="replace")


def _tail(text: str, limit: int = STDERR_LIMIT) -> str:
    return text if len(text) <= limit else "[...]" + text[-limit:]


def _classify(returncode: int, timed_out: bool, stderr: str) -> str:
    if timed_out:
        return "timeout"
    if returncode == 0:
        return "ok"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory"
    return "killed" if returncode < 0 else "error"


def _signal_from_marker(returncode: int, workdir: str) -> int:
    """-N where the prelude, as pid 1 of a PID namespace, exited with 128+N for signal N."""
    if not 128 < returncode < 128 + signal.NSIG:
        return returncode
    try:
        with open(os.path.join(workdir, SIGNAL_MARKER), encoding="ascii") as f:
            marked = int(f.read(8))
    except (OSError, ValueError):
        return returncode
    return -marked if marked == returncode - 128 else returncode


def _run_program(program: str, *, timeout_s: float, memory_mb: int, stdin: str) -> SandboxResult:
    """Run `program` exactly as given (no prelude) under the OS-level limits.

    This is the process/rlimit/namespace layer on its own; :func:`run_python` adds the prelude.
    `unshare` (when the namespaces work) re-raises a signal that killed its child on itself, so
    the return code is -N for signal N either way.
    """
    if not timeout_s > 0:
        raise ValueError(f"sandbox: timeout_s must be > 0, got {timeout_s}")
    if not memory_mb > 0:
        raise ValueError(f"sandbox: memory_mb must be > 0, got {memory_mb}")
    prefix = _namespace_prefix_or_none()
    workdir = tempfile.mkdtemp(prefix="tadm-sandbox-")
    try:
        path = os.path.join(workdir, PROGRAM_NAME)
        with open(path, "w", encoding="utf-8") as f:
            f.write(program)
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": workdir, "TMPDIR": workdir, "LC_ALL": "C.UTF-8"}
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
            inp.write(stdin.encode("utf-8"))
            inp.seek(0)
            limits = _limits(timeout_s, memory_mb)
            proc = subprocess.Popen(
                [*(prefix or ()), sys.executable, "-I", "-S", "-B", PROGRAM_NAME],
                cwd=workdir, env=env, stdin=inp, stdout=out, stderr=err, close_fds=True,
                start_new_session=True, preexec_fn=_child_setup(limits, new_net=prefix is None),
            )
            try:
                returncode, timed_out = proc.wait(timeout=timeout_s), False
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)  # the code's leftovers too, if it ever managed to fork
                returncode = proc.wait()
            stdout, stderr = _read(out, FILE_SIZE_LIMIT), _read(err, FILE_SIZE_LIMIT)
            if prefix is not None:
                returncode = _signal_from_marker(returncode, workdir)
    finally:
        _remove_tree(workdir)
    if returncode == -signal.SIGXCPU:  # the CPU-seconds limit is a timeout too
        timed_out = True
    reason = _classify(returncode, timed_out, stderr)
    return SandboxResult(
        passed=returncode == 0 and not timed_out, returncode=returncode, timed_out=timed_out,
        stdout=stdout, stderr=_tail(stderr), reason=reason,
    )


def run_python(code: str, *, timeout_s: float = 5.0, memory_mb: int = 512, stdin: str = "") -> SandboxResult:
    """Run untrusted Python `code` in a sandboxed child process and report how it ended.

    `stdin` is fed to the program; its stdout comes back whole (up to 10 MiB), its stderr as
    the last few KB. Whatever the code does, this returns (it never raises for the code's
    behaviour) and leaves no process or file behind.
    """
    return _run_program(build_program(code), timeout_s=timeout_s, memory_mb=memory_mb, stdin=stdin)
