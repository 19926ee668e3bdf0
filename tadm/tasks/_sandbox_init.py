"""The first process inside the sandbox's namespaces: build its file-system view, drop to an
unprivileged uid, then exec the program.

Started by :mod:`tadm.tasks.sandbox` as ``unshare [--user --map-root-user] --mount --pid --net
--ipc --uts --fork --kill-child -- python -I -S _sandbox_init.py SPEC``, so it runs as pid 1 of
fresh PID, mount, network, IPC and UTS namespaces, with root's capabilities over them (real
root, or root of a fresh user namespace). ``SPEC`` is JSON:

``root``     an empty host directory to build the new root in (a tmpfs is mounted on it);
``work``     the host directory holding the program: its files are copied into ``/sandbox``, a
             size-capped tmpfs (the program's cwd), so nothing the code writes reaches host disk;
``disk_mb``  the size of each of the two writable tmpfs, ``/sandbox`` and ``/tmp``;
``marker``   a host file descriptor, moved to fd 3 for the program: where the prelude, as pid 1,
             records the signal it ended the program by (see sandbox.SIGNAL_FD);
``done``     a host file descriptor, moved to fd 4: the completion marker (sandbox.DONE_FD), where
             the prelude confirms the code ran to its last line;
``channel``  in one half of a checked run, two host pipe descriptors (read, write), moved to fds 5
             and 6 (sandbox.CHANNEL_FDS); empty otherwise;
``ro``       host paths shown read-only at the same place (the interpreter, /usr, /lib...);
``userns``   whether ``unshare`` made a user namespace (the evaluator is not root);
``uid``      the uid/gid the program runs as: as real root, setresuid to it (caps are lost);
             in a user namespace, a nested one maps it to the namespace's root and nothing else;
``nproc``    RLIMIT_NPROC applied after the switch (the kernel refuses the exec if it is applied
             before, as the process itself would exceed it);
``argv``, ``env``  what to exec, inside the new root, in ``/sandbox``.

Just before the exec it re-arms the parent-death signal (SIGKILL when ``unshare`` dies; the uid
switch cleared the one ``--kill-child`` set) and installs a seccomp filter
(:mod:`tadm.tasks._sandbox_seccomp`) that refuses new namespaces, io_uring, mounts, ptrace, bpf,
keyrings and clearing that parent-death signal.

Any failure ends it with exit status 125 and one line on stderr that starts with
``sandbox-init:``. Stdlib only; it runs under the run's rlimits.
"""

import ctypes
import json
import os
import platform
import resource
import signal
import sys


def _load_beside(name: str):
    """A module from this file's directory (`python -I` leaves the script's directory off sys.path)."""
    import importlib.util  # lazy: kept in place (the sandbox's pid-1 script, python -I -S): only loading a module beside it needs it
    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(__file__), name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_sandbox_seccomp = _load_beside("_sandbox_seccomp")  # loaded before pivot_root hides the host

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
SIGNAL_FD = 3  # the prelude's marker descriptor (sandbox.SIGNAL_FD)
DONE_FD = 4  # the completion marker's descriptor (sandbox.DONE_FD)
CHANNEL_FDS = (5, 6)  # a checked run's pipes, read and write (sandbox.CHANNEL_FDS)
# mount flags a bind remount must keep (statvfs reports them with the same bit values)
KEPT_FLAGS = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096  # noatime, nodiratime, relatime
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom")
SANDBOX_DIR = "/sandbox"
TMP_INODES = 4096  # files a tmpfs may hold (the size caps bytes, this caps inodes)
EXIT_FAILED = 125

libc = ctypes.CDLL(None, use_errno=True)


def fail(step: str, error: object) -> None:
    sys.stderr.write(f"sandbox-init: {step}: {error}\n")
    sys.stderr.flush()
    os._exit(EXIT_FAILED)


def check(rc: int, step: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        fail(step, f"{os.strerror(err)} (errno {err})")


def mount(source, target, fstype, flags, data=None, step=None) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
          step or f"mount {target}")


def bind(source: str, target: str, *, read_only: bool) -> None:
    """Bind `source` at `target`, then remount it nosuid,nodev (and read-only), keeping the flags
    the source mount already has (a user namespace may not clear them)."""
    mount(source, target, None, MS_BIND | MS_REC, step=f"bind {source}")
    kept = os.statvfs(target).f_flag & KEPT_FLAGS
    flags = kept | MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | (MS_RDONLY if read_only else 0)
    mount(None, target, None, flags, step=f"remount {source}")


def place(root: str, path: str) -> str:
    """Create the mount point (or symlink) for host `path` under `root`; the target path, or None
    for a symlink (recreated, not mounted)."""
    target = root + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(path):
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
        return None
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        open(target, "w").close()
    return target


def copy_program(source: str, target: str, owner: int | None) -> None:
    """Copy the program's files from the host directory into the sandbox's tmpfs; as real root,
    hand the directory and the files to the sandbox uid (in a user namespace they belong to the
    namespace's root, which the nested namespace maps the sandbox uid to)."""
    for name in os.listdir(source):
        with open(os.path.join(source, name), "rb") as f:
            data = f.read()
        with open(os.path.join(target, name), "wb") as f:
            f.write(data)
        if owner is not None:
            os.chown(os.path.join(target, name), owner, owner)
    if owner is not None:
        os.chown(target, owner, owner)


def build_root(spec: dict) -> None:
    root = spec["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE, step="make mounts private")
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755", step="tmpfs root")
    for path in spec["ro"]:
        if os.path.lexists(path):
            target = place(root, path)
            if target is not None:
                bind(path, target, read_only=True)
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            target = place(root, f"/dev/{name}")
            mount(f"/dev/{name}", target, None, MS_BIND, step=f"bind /dev/{name}")
    os.symlink("/proc/self/fd", root + "/dev/fd")
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, step="mount a private /proc")
    os.makedirs(root + "/tmp")
    size = f"size={int(spec['disk_mb'])}m,nr_inodes={TMP_INODES}"
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=1777", step="tmpfs /tmp")
    os.makedirs(root + SANDBOX_DIR)
    mount("tmpfs", root + SANDBOX_DIR, "tmpfs", MS_NOSUID | MS_NODEV, f"{size},mode=0700", step="tmpfs /sandbox")
    copy_program(spec["work"], root + SANDBOX_DIR, owner=None if spec["userns"] else spec["uid"])
    mount(None, root, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, step="read-only root")
    os.chdir(root)
    number = PIVOT_ROOT.get(platform.machine())
    if number is None:
        fail("pivot_root", f"unknown syscall number on {platform.machine()}")
    check(libc.syscall(ctypes.c_long(number), b".", b"."), "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")


def drop_privileges(uid: int, in_user_namespace: bool) -> None:
    if in_user_namespace:  # root here is the evaluator's uid outside: map `uid` to it, alone
        check(libc.unshare(CLONE_NEWUSER), "nested user namespace")
        for name, text in (("uid_map", f"{uid} 0 1\n"), ("setgroups", "deny"), ("gid_map", f"{uid} 0 1\n")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    else:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # from root to a non-zero uid: every capability is gone
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if os.getuid() != uid or os.geteuid() != uid:
        fail("drop privileges", f"uid is {os.getuid()}/{os.geteuid()}, not {uid}")


def descriptors_to(wanted: dict[int, int]) -> None:
    """Move each host descriptor to the number the prelude knows ({target: fd}), inherited by the
    program. Each goes through a copy above 9 first, so that a descriptor already sitting on
    another's target is not overwritten before it moved."""
    import fcntl  # lazy: kept in place (the sandbox's pid-1 script, python -I -S): only moving descriptors needs fcntl

    copies = {target: fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for target, fd in wanted.items()}
    for fd in set(wanted.values()) - set(wanted):
        os.close(fd)
    for target, copy in copies.items():
        os.dup2(copy, target)
        os.close(copy)
        os.set_inheritable(target, True)


def main() -> None:
    try:
        spec = json.loads(sys.argv[1])
        channel = dict(zip(CHANNEL_FDS, spec.get("channel", ())))
        descriptors_to({SIGNAL_FD: spec["marker"], DONE_FD: spec["done"], **channel})
        build_root(spec)
        drop_privileges(spec["uid"], spec["userns"])
        resource.setrlimit(resource.RLIMIT_NPROC, (spec["nproc"], spec["nproc"]))
        os.chdir(SANDBOX_DIR)
        # the uid switch cleared --kill-child's parent-death signal: re-arm it (the filter below
        # keeps the program from clearing it), so the program dies with `unshare`
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "parent-death signal")
        _sandbox_seccomp.install(libc)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 -- any failure: one line, one exit status
        fail("set-up", f"{type(e).__name__}: {e}")
    try:
        os.execve(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as e:
        fail("exec", e)


if __name__ == "__main__":
    main()
