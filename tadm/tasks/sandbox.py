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
   kernel would otherwise refuse the exec), pending signals (``PENDING_SIGNALS``, 64: each POSIX timer holds one, so
   ``timer_create`` cannot pin kernel memory) and core dumps (0).
5. **Nothing outlives the run**: after every run (and on the wall-clock timeout) the evaluator
   SIGKILLs the PID namespace's init -- the program -- which takes every process of the namespace
   with it, whatever session or group it moved to (``setsid``), then ``unshare``'s process group.
   Should that be missed, the program carries a parent-death signal (SIGKILL when ``unshare``
   dies; re-armed after the uid switch, which clears the one ``--kill-child`` set), and
   ``unshare`` one for the evaluator's own death.
6. **A seccomp filter** (:mod:`tadm.tasks._sandbox_seccomp`, x86-64 and aarch64), installed last
   before the exec: no new namespaces (``unshare``, ``setns``, ``clone`` with ``CLONE_NEW*``; a
   nested user namespace, with its capabilities, used to be possible), no ``io_uring``, no
   mounts, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``ptrace`` or keyrings, no System V
   IPC (shared memory, message queues, semaphores), ``memfd_create`` or ``memfd_secret`` (memory
   the address-space limit would not count), no sockets but ``AF_UNIX``, ``AF_INET`` and
   ``AF_INET6`` (no ``AF_VSOCK`` to the hypervisor, no netlink or packet sockets), no inotify or
   fanotify (watching the read-only host directories would show other processes' activity), and
   no clearing of the parent-death signal, and no new process (``clone`` without
   ``CLONE_THREAD``, ``fork``, ``vfork``; threads are allowed): each answers EPERM; another ABI
   kills the process.
7. **A Python prelude** that runs the code: the entry line executes it, it installs its guards,
   then compiles ``main.py`` and runs it as the ``__main__`` module (no line of the code runs
   before the guards; ``from __future__`` imports apply as written; tracebacks give the code's
   own line numbers). Once the code's last line has run it writes the **completion marker**
   (``DONE_FD``: "done:" and a per-run secret the evaluator generated, read from that host file
   and erased from it before the code starts). A run has passed only with that marker and exit
   status 0: ``sys.exit`` / ``SystemExit`` at any status, ``os._exit``, a signal to itself, a
   closed or moved descriptor all end it without the marker (reason "early-exit" where the status
   is 0), and text on stdout counts for nothing. Its guards, as defence in depth only, disable
   sockets and name lookups, process creation, signals to other processes, ``ctypes`` and writes outside the
   sandbox directory, so that the common accidents of generated code -- a stray
   ``os.system("rm ...")``, a download, a ``multiprocessing.Pool`` -- end in a clean
   ``sandbox:`` error. It is **not** a security boundary: Python code can get around it (the real
   ``posix`` module through the closure of the ``_imp.create_builtin`` wrapper, the unpatched
   ``io.FileIO.__bases__[0]`` or ``type(sys.stdout.buffer.raw)``, ``sqlite3.connect``,
   ``readline.write_history_file``, ``_ctypes`` loaded under another module name). Each of these
   escapes is a regression test (tests/tasks/test_tasks_sandbox.py): it still runs, and the layers
   above must leave it nothing to reach -- no file outside written, no process run as root, no
   secret of the evaluator read.

Whether the namespaces work is probed once per evaluator process, by running a probe program
through the very same route (as root: without, then with, a user namespace). **Where they do
not** (no ``unshare``, a kernel or container that refuses them), generated code is not run:
:func:`run_python` raises :class:`SandboxUnavailable` with one line saying why and how to allow
it. Only an explicit ``unsafe_host_execution=True`` (``--unsafe-host-execution``) runs it
anyway, the old way: a plain child on the host in the throw-away directory, under the rlimits
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
syscalls the filter allows are the kernel surface that
remains (the seccomp filter is a deny list, not an allow list).

Being pid 1 changes one thing for the code: the kernel ignores default-action signals that a
namespace's init sends itself. The prelude makes ``os.kill(os.getpid(), sig)``,
``signal.raise_signal`` and ``os.abort`` end the program as before (reported as killed by that
signal); signals the kernel sends on its own with no handler installed (SIGXCPU at the CPU
soft limit, SIGALRM from ``signal.alarm``) are ignored there, and the wall-clock timeout or the
hard CPU limit (SIGKILL, reported as "killed") ends such a program instead.

Known costs: ``asyncio`` (needs a socket pair), ``multiprocessing``, ``subprocess`` and
``ctypes`` are unavailable; tracebacks start with two frames of the prelude; each run starts the
interpreter twice (the namespace's init, then the program), a checked run four times (two
sandboxes, started side by side).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import resource
import shutil
import secrets
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SandboxResult", "SandboxUnavailable", "run_python", "run_checked", "build_program", "isolation_available", "PRELUDE"]

FILE_SIZE_LIMIT = 10 * 1024 * 1024  # bytes a program may write to any file, stdout included
OPEN_FILES_LIMIT = 64
# RLIMIT_NPROC in the sandbox: tasks of the sandbox uid, every concurrent run's together (the filter
# refuses processes, so these are threads); one run's threads are bounded by its address space
# first (each thread's stack counts against memory_mb)
THREADS = 256
PENDING_SIGNALS = 64  # RLIMIT_SIGPENDING: queued signals, and so POSIX timers (each holds one)
STDERR_LIMIT = 4000  # characters of stderr kept (the tail: where a traceback ends)
PROGRAM_NAME = "main.py"
CLONE_NEWNET = 0x40000000
# The descriptor (a host file, not reachable by path from inside) the prelude writes to, spelling
# the number out, when as pid 1 of a PID namespace it ends the program "by a signal" the kernel
# would not deliver (see the module docstring); it holds the signal's number, and the exit code is
# 128 + that number.
SIGNAL_FD = 3
# The completion marker's descriptor (a host file): the prelude runs the code (main.py) itself, and
# writes "done:" and a per-run secret there only once the code's last line has run. A program that
# ends early -- sys.exit / SystemExit at any status, os._exit, a signal to itself, a closed or moved
# descriptor -- leaves no marker, and has not passed, whatever its exit status; text on stdout
# counts for nothing. The secret is read from this file and erased from it before the code starts.
DONE_FD = 4
DONE_TAG = "done:"
# A checked run's two halves (:func:`run_checked`) each read one pipe and write the other, at these
# descriptors inside (read, write); a message (a call's arguments, or its value) is at most this long.
CHANNEL_FDS = (5, 6)
MESSAGE_LIMIT = 16 * 1024 * 1024
# The file the interpreter runs: one line that executes the prelude, which then runs main.py.
ENTRY_NAME = "_sandbox_entry.py"
# Each of the two writable places inside, /sandbox (the cwd) and /tmp, is a tmpfs of this size:
# the code's files never reach host disk, and all it can write is 2 x this (plus its stdout and
# stderr, 10 MiB each) -- held in memory, and gone with its mount namespace.
DISK_MB = 64
PR_SET_PDEATHSIG = 1
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
# Each run's throw-away host directory: this prefix, the evaluator's pid, "-", a random part. A
# directory whose evaluator died (kill -9 mid-run) is removed by the next evaluator's first run.
LEFTOVER_PREFIX = "tadm-sandbox-"
_isolation: object = _UNPROBED
_probe_lock = threading.Lock()
_warned_unsafe = False

# Loaded in the parent: the child only calls it between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True)


class SandboxUnavailable(RuntimeError):
    """The kernel will not give generated code its own namespaces here, and running it on the
    host was not explicitly allowed (``unsafe_host_execution``)."""


@dataclass(frozen=True)
class _Isolation:
    """How to start a run inside the namespaces: the `unshare` argv prefix, and whether it makes
    a user namespace (the evaluator is not root, or root lacks the capabilities)."""

    prefix: tuple[str, ...]
    user_namespace: bool


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
                os.write(3, str(int(sig)).encode())  # sandbox.SIGNAL_FD, a host file
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


def _sandbox_channel(fd_in, fd_out):
    """A checked run's two halves talk over two pipes in frames (8 bytes of length, then JSON);
    values cross as plain data (see sandbox.PLAIN_DATA): (send, receive, encode, decode)."""
    import collections, json, os

    limit = _MESSAGE_LIMIT
    mappings = (dict, collections.OrderedDict, collections.defaultdict, collections.Counter)

    def _refuse_data(why):
        raise TypeError(f"not plain data: {why}")

    def pairs_to_dict(pairs):
        if not all(type(p) is list and len(p) == 2 for p in pairs):
            _refuse_data("a dict entry is not a pair")
        return dict(pairs)

    tags = {"tuple": tuple, "set": set, "frozenset": frozenset, "dict": pairs_to_dict,
            "int": lambda text: int(text, 16), "complex": lambda parts: complex(*parts), "bytes": bytes.fromhex}

    def encode(value):
        kind = type(value)
        if value is None or kind is bool or kind is str:
            return value
        if kind is int:
            return value if -2**53 < value < 2**53 else {"int": hex(value)}
        if kind is float:
            return value
        if kind is list:
            return [encode(v) for v in value]
        if kind is tuple:
            return {"tuple": [encode(v) for v in value]}
        if kind in mappings:  # the standard library's dict types compare equal to a dict
            return {"dict": [[encode(k), encode(v)] for k, v in dict.items(value)]}
        if kind is set or kind is frozenset:
            return {kind.__name__: [encode(v) for v in value]}
        if kind is complex:
            return {"complex": [value.real, value.imag]}
        if kind is bytes:
            return {"bytes": value.hex()}
        _refuse_data(f"a value of type {kind.__module__}.{kind.__qualname__}")

    def tagged(pairs):
        if len(pairs) != 1 or pairs[0][0] not in tags:
            _refuse_data(f"an object with keys {[k for k, _ in pairs][:4]}")
        tag, body = pairs[0]
        if tag in ("tuple", "set", "frozenset", "complex", "dict") and type(body) is not list:
            _refuse_data(f"{tag} of a {type(body).__name__}")
        if tag in ("int", "bytes") and type(body) is not str:
            _refuse_data(f"{tag} of a {type(body).__name__}")
        if tag == "complex" and not (len(body) == 2 and all(type(x) in (int, float) for x in body)):
            _refuse_data("a complex is not two numbers")
        return tags[tag](body)

    def decode(text):
        return json.loads(text, object_pairs_hook=tagged)

    def send(obj):
        data = json.dumps(obj, allow_nan=True).encode("utf-8")
        data = len(data).to_bytes(8, "big") + data
        while data:
            data = data[os.write(fd_out, data):]

    def exactly(n):
        chunks, got = [], 0
        while got < n:
            chunk = os.read(fd_in, min(n - got, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def receive():
        """The next frame's text; None where the other half closed its end."""
        header = exactly(8)
        if header is None:
            return None
        n = int.from_bytes(header, "big")
        if n > limit:
            raise RuntimeError(f"sandbox: a message of {n} bytes is over the {limit}-byte limit")
        body = exactly(n)
        if body is None:
            return None
        return body.decode("utf-8")

    return send, receive, encode, decode


def _sandbox_serve(main, name, channel):
    """The completion's half of a checked run: once main.py has run, answer each call of its
    function `name` until the checker closes the channel, every value as plain data."""
    send, receive, encode, decode = channel
    while True:
        text = receive()
        if text is None:
            return
        try:
            args, kwargs = decode(text)
            reply = ["value", encode(main.__dict__[name](*args, **kwargs))]
        except Exception as e:  # noqa: BLE001 -- the function's failure is the checker's to report
            try:
                why = f"{type(e).__name__}: {e}"[:2000]
            except Exception:  # noqa: BLE001
                why = "an exception whose message cannot be shown"
            reply = ["raised", why]
        send(reply)


def _sandbox_candidate(channel):
    """The checker's half: a function that sends its arguments to the completion's process and
    returns what came back, decoded into fresh built-in objects (never the completion's own)."""
    send, receive, encode, decode = channel

    def candidate(*args, **kwargs):
        send([encode(list(args)), {"dict": [[k, encode(v)] for k, v in kwargs.items()]}])
        text = receive()
        if text is None:
            raise RuntimeError("sandbox: the completion's process ended before it answered")
        reply = decode(text)  # a value, never an object of the completion's (refused as not plain data)
        if type(reply) is not list or len(reply) != 2 or reply[0] not in ("value", "raised"):
            raise RuntimeError("sandbox: the completion's process sent something other than a reply")
        if reply[0] == "raised":
            raise RuntimeError(f"the candidate raised {str(reply[1])[:2000]}")
        return reply[1]

    return candidate


def _sandbox_run(done_fd, role=None, channel=None):
    """Run main.py as the __main__ module; mark the run complete only once its last line ran.
    A checked run's checker (`role` "check") finds the completion's function as
    ``__sandbox_candidate__``; its completion (`role` ("serve", name)) answers calls of `name`
    after its last line ran."""
    import os, sys

    serve = role is not None and role != "check"  # the solution's half: no secret, no marker
    if not serve:
        secret = os.pread(done_fd, 64, 0)
        os.ftruncate(done_fd, 0)  # the code cannot read the secret back from the descriptor
    main = sys.modules["__main__"]
    main.__dict__["__file__"] = sys.argv[0] = "main.py"
    if role == "check":
        main.__dict__["__sandbox_candidate__"] = _sandbox_candidate(_sandbox_channel(*channel))
    with open("main.py", "rb") as f:
        code = compile(f.read(), "main.py", "exec", dont_inherit=True)
    exec(code, main.__dict__)
    if serve:
        _sandbox_serve(main, role[1], _sandbox_channel(*channel))
    else:
        os.pwrite(done_fd, b"done:" + secret, 0)


_sandbox_guard()
_sandbox_run(_DONE_FD, _ROLE, _CHANNEL)
'''

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


def _read_only_paths(python: str) -> list[str]:
    """What the sandbox shows read-only: the system's programs and libraries, the dynamic
    loader's configuration, and the interpreter's prefixes (where not already under those)."""
    paths = [p for p in READ_ONLY_PATHS if os.path.lexists(p)]
    for extra in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python)):
        extra = os.path.realpath(extra)
        if not any(extra == p or extra.startswith(p.rstrip("/") + "/") for p in paths):
            paths.append(extra)
    return paths


def _init_argv(isolation: _Isolation, base: str, work: str, env: dict[str, str], marker: int, done: int,
               entry: str, channel: tuple[int, ...] = ()) -> list[str]:
    """unshare ... -- python -I -S _sandbox_init.py SPEC: the run's full argv on the sandbox route."""
    python = _interpreter()
    spec = {"root": os.path.join(base, "root"), "work": work, "ro": _read_only_paths(python),
            "disk_mb": DISK_MB, "marker": marker, "done": done, "channel": list(channel),
            "userns": isolation.user_namespace, "uid": SANDBOX_UID, "nproc": THREADS, "env": env,
            "argv": [python, "-I", "-S", "-B", entry]}
    return [*isolation.prefix, python, "-I", "-S", "-B", str(INIT_SCRIPT), json.dumps(spec)]


def _candidates() -> list[_Isolation]:
    """The routes to try, in order: as root, namespaces without a user namespace (root's own
    capabilities; the code then runs as SANDBOX_UID); otherwise (or where root lacks them) a user
    namespace first."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    plain = _Isolation((unshare, *NAMESPACES, "--"), False)
    user = _Isolation((unshare, *USER_NAMESPACE, *NAMESPACES, "--"), True)
    return [plain, user] if os.geteuid() == 0 else [user]


PROBE_PROGRAM = "import os\nprint(os.getpid(), os.getuid(), os.getcwd(), sorted(os.listdir('/')))\n"


def _probe_isolation() -> object:
    """The first route under which a probe program runs as pid 1, as SANDBOX_UID, in SANDBOX_DIR,
    with only the sandbox's file-system view; otherwise why not (one line)."""
    candidates = _candidates()
    if not candidates:
        return "util-linux `unshare` is not installed"
    why = "unknown"
    for isolation in candidates:
        try:
            returncode, _, stdout, stderr, _ = _spawn(PROBE_PROGRAM, timeout_s=PROBE_TIMEOUT_S, memory_mb=512,
                                                   stdin="", isolation=isolation)
        except (OSError, subprocess.SubprocessError) as e:
            why = f"{type(e).__name__}: {e}"
            continue
        pid, _, rest = stdout.strip().partition(" ")
        expected = f"{SANDBOX_UID} {SANDBOX_DIR} "
        if returncode == 0 and pid == "1" and rest.startswith(expected) and "work" not in rest:
            return isolation
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        why = (lines[-1] if lines else f"exit status {returncode}, output {stdout.strip()[:200]!r}")
        why = f"{' '.join(isolation.prefix[1:-1])}: {why}"
    return why


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


def _children(pid: int) -> list[int]:
    """The children of `pid` (its main thread's; ``unshare`` has one thread)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _kill_group(pgid: int) -> None:
    """Kill the run: first the namespace's init (``unshare``'s child; its death takes every
    process of the PID namespace with it, whatever session or group they moved to), then
    ``unshare``'s process group."""
    for pid in _children(pgid):
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


def _read(f, limit: int) -> str:
    f.seek(0)
    return f.read(limit).decode("utf-8", errors="replace")


def _tail(text: str, limit: int = STDERR_LIMIT) -> str:
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
        _kill_group(self.proc.pid)  # the code's leftovers too, if it ever managed to fork
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
    namespaces do not work: SandboxUnavailable, unless `unsafe_host_execution` (then a plain
    child on the host, as the module docstring says).
    """
    if not timeout_s > 0:
        raise ValueError(f"sandbox: timeout_s must be > 0, got {timeout_s}")
    if not memory_mb > 0:
        raise ValueError(f"sandbox: memory_mb must be > 0, got {memory_mb}")
    isolation = _isolation_or_reason()
    if not isinstance(isolation, _Isolation):
        if not unsafe_host_execution:
            _refuse(str(isolation))
        _warn_unsafe(str(isolation))
        isolation = None
    returncode, timed_out, stdout, stderr, completed = _spawn(
        program, timeout_s=timeout_s, memory_mb=memory_mb, stdin=stdin, isolation=isolation, prelude=prelude)
    if returncode == -signal.SIGXCPU:  # the CPU-seconds limit is a timeout too
        timed_out = True
    if not prelude:
        completed = returncode == 0 and not timed_out
    reason = _classify(returncode, timed_out, stderr, completed)
    return SandboxResult(
        passed=returncode == 0 and not timed_out and completed, completed=completed, returncode=returncode,
        timed_out=timed_out, stdout=stdout, stderr=_tail(stderr), reason=reason,
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
    if not timeout_s > 0:
        raise ValueError(f"sandbox: timeout_s must be > 0, got {timeout_s}")
    if not memory_mb > 0:
        raise ValueError(f"sandbox: memory_mb must be > 0, got {memory_mb}")
    isolation = _isolation_or_reason()
    if not isinstance(isolation, _Isolation):
        if not unsafe_host_execution:
            _refuse(str(isolation))
        _warn_unsafe(str(isolation))
        isolation = None
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
    stderr = check_err + (f"\n[the solution's process]\n{_tail(solve_err)}" if solve_err.strip() else "")
    return SandboxResult(
        passed=returncode == 0 and not timed_out and completed, completed=completed, returncode=returncode,
        timed_out=timed_out, stdout=stdout, stderr=_tail(stderr), reason=_classify(returncode, timed_out, check_err,
                                                                                   completed))


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
