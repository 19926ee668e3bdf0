"""The first process inside the sandbox's namespaces: build its file-system view, drop to an
unprivileged uid, then exec the program.

Started by :mod:`tadm.tasks.sandbox` as ``unshare [--user --map-root-user] --mount --pid --net
--ipc --uts --fork --kill-child -- python -I -S _sandbox_init.py SPEC``, so it runs as pid 1 of
fresh PID, mount, network, IPC and UTS namespaces, with root's capabilities over them (real
root, or root of a fresh user namespace). ``SPEC`` is JSON:

``root``     an empty host directory to build the new root in (a tmpfs is mounted on it);
``work``     the host directory mounted read-write at ``/sandbox`` (the program's cwd);
``ro``       host paths shown read-only at the same place (the interpreter, /usr, /lib...);
``userns``   whether ``unshare`` made a user namespace (the evaluator is not root);
``uid``      the uid/gid the program runs as: as real root, setresuid to it (caps are lost);
             in a user namespace, a nested one maps it to the namespace's root and nothing else;
``nproc``    RLIMIT_NPROC applied after the switch (the kernel refuses the exec if it is applied
             before, as the process itself would exceed it);
``argv``, ``env``  what to exec, inside the new root, in ``/sandbox``.

Any failure ends it with exit status 125 and one line on stderr that starts with
``sandbox-init:``. Stdlib only; it runs under the run's rlimits.
"""

import ctypes
import json
import os
import platform
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS = 38
# mount flags a bind remount must keep (statvfs reports them with the same bit values)
KEPT_FLAGS = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096  # noatime, nodiratime, relatime
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
DEVICES = ("null", "zero", "full", "random", "urandom")
SANDBOX_DIR = "/sandbox"
TMP_SIZE = "64m"
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
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={TMP_SIZE},mode=1777", step="tmpfs /tmp")
    os.makedirs(root + SANDBOX_DIR)
    bind(spec["work"], root + SANDBOX_DIR, read_only=False)
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


def main() -> None:
    try:
        spec = json.loads(sys.argv[1])
        build_root(spec)
        drop_privileges(spec["uid"], spec["userns"])
        resource.setrlimit(resource.RLIMIT_NPROC, (spec["nproc"], spec["nproc"]))
        os.chdir(SANDBOX_DIR)
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
