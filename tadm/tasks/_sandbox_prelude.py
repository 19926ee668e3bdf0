"""The Python prelude of a sandboxed run: source text, never a module to import.

:mod:`tadm.tasks.sandbox` reads this file (``sandbox.PRELUDE``) and
:func:`~tadm.tasks.sandbox.build_program` writes the entry line the sandboxed interpreter runs:
it executes this text in a namespace of its own that holds ``_DONE_FD`` (the completion marker's
descriptor), ``_ROLE`` and ``_CHANNEL`` (a checked run's half and its pipes, else None) and
``_MESSAGE_LIMIT``, and ``__name__`` "_sandbox_prelude": only there do its last lines install the
guards and run the code (imported, it would define its functions and run nothing; nothing
imports it). Stdlib only, and quick: it runs once per program.

It installs its guards, then compiles ``main.py`` and runs it as the ``__main__`` module (no line
of the code runs before the guards; ``from __future__`` imports apply as written; tracebacks give
the code's own line numbers, after two frames of this prelude). Once the code's last line has run
it writes the **completion marker** to ``_DONE_FD``: "done:" and the per-run secret the evaluator
generated, read from that host file and erased from it before the code starts. ``sys.exit`` /
``SystemExit`` at any status, ``os._exit``, a signal to itself, a closed or moved descriptor all
end the program without the marker.

Its guards, as defence in depth only, disable sockets and name lookups, process creation, signals
to other processes, ``ctypes`` and writes outside the sandbox directory, so that the common
accidents of generated code -- a stray ``os.system("rm ...")``, a download, a
``multiprocessing.Pool`` -- end in a clean ``sandbox:`` error. They are **not** a security
boundary: Python code can get around them (the real ``posix`` module through the closure of the
``_imp.create_builtin`` wrapper, the unpatched ``io.FileIO.__bases__[0]`` or
``type(sys.stdout.buffer.raw)``, ``sqlite3.connect``, ``readline.write_history_file``,
``_ctypes`` loaded under another module name). Each of these escapes is a regression test
(tests/tasks/test_tasks_sandbox.py): it still runs, and the OS layers of
:mod:`tadm.tasks.sandbox` must leave it nothing to reach.

Being pid 1 of its PID namespace changes one thing for the code: the kernel ignores
default-action signals that a namespace's init sends itself. The prelude makes
``os.kill(os.getpid(), sig)``, ``signal.raise_signal`` and ``os.abort`` end the program as before:
it writes the signal's number to descriptor 3 (``sandbox.SIGNAL_FD``) and exits with 128 + that
number, which the evaluator reports as killed by that signal. Signals the kernel sends on its own
with no handler installed (SIGXCPU at the CPU soft limit, SIGALRM from ``signal.alarm``) are
ignored there, and the wall-clock timeout or the hard CPU limit (SIGKILL, reported as "killed")
ends such a program instead.

In a checked run (``sandbox.run_checked``) the solution's half (``_ROLE`` ("serve", name)) runs
``main.py``, then answers calls of ``name`` over ``_CHANNEL``; the checker's half (``_ROLE``
"check") finds a stand-in as ``__sandbox_candidate__`` that sends each call's arguments there and
returns the value, both as plain data (:func:`_sandbox_codec`). Only the checker's half holds the
secret and writes the marker.
"""


def _sandbox_guard():
    """Install every guard: files, then processes and signals, the network, and last the import
    block (each module a guard patches is loaded here, before any is patched)."""
    import _imp, _io, _posixsubprocess, _signal, _socket, builtins, errno, io, os, posix, shutil  # noqa: F401  # lazy: every module a guard patches, loaded before any is patched
    import signal, socket, subprocess, sys  # noqa: F401  # lazy: every module a guard patches, loaded before any is patched

    def deny(what, target=None):
        raise PermissionError(errno.EPERM, f"sandbox: {what} is not allowed", target)

    _sandbox_guard_files(deny)
    _sandbox_guard_processes(deny)
    _sandbox_guard_network()
    _sandbox_guard_imports()


def _sandbox_guard_files(deny):
    """open / FileIO / the os.* calls that create, change or delete: refused outside the sandbox
    directory (the cwd)."""
    import _io, builtins, io, os, posix, shutil  # lazy: each guard imports what it patches as it installs

    root = os.path.realpath(os.getcwd())

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


def _sandbox_guard_processes(deny):
    """No new process, no signal to another process; as pid 1, a signal to itself ends the
    program the way the signal would have (see the module docstring)."""
    import _posixsubprocess, _signal, os, posix, signal, subprocess  # lazy: each guard imports what it patches as it installs

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


def _sandbox_guard_network():
    """No sockets, no name lookups."""
    import _socket, errno, socket  # lazy: each guard imports what it patches as it installs

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


def _sandbox_guard_imports():
    """No ctypes or multiprocessing, no fresh copies of the patched built-in modules."""
    import _imp, sys  # lazy: each guard imports what it patches as it installs

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


def _sandbox_codec():
    """How values cross between a checked run's halves: (encode, decode) between a value and
    JSON-ready data. Plain data only -- None, bool, int, float, complex, str, bytes and lists,
    tuples, dicts, sets and frozensets of them (the standard library's dict types as a dict);
    anything else is refused (TypeError "not plain data"), and decoding builds fresh built-in
    objects."""
    import collections, json  # lazy: kept in place: prelude text the sandboxed child runs; each function imports its own

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

    return encode, decode


def _sandbox_channel(fd_in, fd_out):
    """A checked run's two halves talk over two pipes in frames (8 bytes of length, then JSON,
    at most _MESSAGE_LIMIT bytes), values crossing as plain data (:func:`_sandbox_codec`):
    (send, receive, encode, decode)."""
    import json, os  # lazy: kept in place: prelude text the sandboxed child runs; each function imports its own

    limit = _MESSAGE_LIMIT  # noqa: F821 -- the entry line's global
    encode, decode = _sandbox_codec()

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
    import os, sys  # lazy: kept in place: prelude text the sandboxed child runs; each function imports its own

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


if __name__ == "_sandbox_prelude":  # the entry line's namespace (build_program), never an import
    _sandbox_guard()
    _sandbox_run(_DONE_FD, _ROLE, _CHANNEL)  # noqa: F821 -- the entry line's globals
