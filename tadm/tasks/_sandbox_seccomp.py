"""The sandbox's seccomp filter: the kernel surface generated code has no business touching.

Installed by :mod:`tadm.tasks._sandbox_init` in the program's own process, after the uid switch
and ``no_new_privs`` and just before the exec, so it binds the program and anything it could
start. A classic-BPF program over ``struct seccomp_data`` (``nr`` at offset 0, ``arch`` at 4, the
low 32 bits of the first argument at 16 on these little-endian machines):

- a foreign ABI (another ``arch``, or x86-64's x32 calls) kills the process;
- ``unshare``, ``setns`` and ``clone`` with any ``CLONE_NEW*`` flag: no nested namespaces, a user
  namespace's capabilities included; ``clone3`` (its flags sit behind a pointer the filter cannot
  read) answers ENOSYS, so the C library falls back to ``clone``;
- a new process: ``clone`` without ``CLONE_THREAD``, ``fork`` and ``vfork`` (x86-64; aarch64 has
  only ``clone``): the program may start threads (bounded by ``RLIMIT_NPROC``), never a process;
- ``io_uring_setup`` / ``enter`` / ``register``; ``mount``, ``umount2``, ``pivot_root`` and the
  new mount API; ``bpf``, ``perf_event_open``, ``userfaultfd``, ``ptrace``, the keyring calls;
- memory the address-space limit does not count: System V shared memory, message queues and
  semaphores (``shmget`` ... ``semtimedop``), ``memfd_create`` and ``memfd_secret`` (POSIX shared
  memory needs ``/dev/shm``, which the sandbox does not show);
- ``socket`` and ``socketpair`` of any family but ``AF_UNIX``, ``AF_INET`` and ``AF_INET6`` (the
  last two reach only the empty network namespace): no ``AF_VSOCK`` to the hypervisor, no
  ``AF_NETLINK``, ``AF_PACKET``, ``AF_BLUETOOTH`` ...;
- ``inotify_*`` and ``fanotify_*``: no watching the read-only host directories for other
  processes' activity;
- ``prctl(PR_SET_PDEATHSIG, ...)``: the program cannot clear the signal that kills it with its
  ``unshare``;

each answers EPERM. Everything else is allowed: the rlimits, the uid and the namespaces bound it.
Stdlib only (it is loaded by path inside the sandbox's init); x86-64 and aarch64.
"""

import ctypes
import errno
import platform
import struct

# BPF instruction classes / modes (linux/filter.h, linux/bpf_common.h)
LD_W_ABS = 0x00 | 0x00 | 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K, JGE_K, JSET_K = 0x05 | 0x10, 0x05 | 0x30, 0x05 | 0x40  # BPF_JMP | BPF_JEQ/JGE/JSET | BPF_K
RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0 = 0, 4, 16
X32_SYSCALL_BIT = 0x40000000
PR_SET_PDEATHSIG = 1
SECCOMP_SET_MODE_FILTER = 1
# Kernels booted with spec_store_bypass_disable=seccomp would otherwise slow a filtered process
# down with that mitigation; it guards code sharing a process with its sandbox (a JIT), and here
# the code has its process to itself. (On this machine's default kernel: no difference measured.)
SECCOMP_FILTER_FLAG_SPEC_ALLOW = 1 << 2
CLONE_THREAD = 0x00010000
CLONE_NEW_FLAGS = (0x00000080 | 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000  # TIME NS CGROUP UTS IPC
                   | 0x10000000 | 0x20000000 | 0x40000000)  # USER PID NET

# Calls added since Linux 5.1 share one number on every architecture (asm-generic/unistd.h).
_UNIFIED_DENY = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
                 "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
                 "mount_setattr": 442, "memfd_secret": 447}
CLONE3 = 435
# The socket families a program may open (linux/socket.h): AF_UNIX, AF_INET, AF_INET6.
ALLOWED_FAMILIES = (1, 2, 10)

# Per machine: its audit arch, then the syscall numbers (asm/unistd.h) of each role.
SYSCALLS = {
    "x86_64": {
        "arch": 0xC000003E,
        "deny": {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "bpf": 321,
                 "perf_event_open": 298, "userfaultfd": 323, "ptrace": 101, "add_key": 248, "request_key": 249,
                 "keyctl": 250, "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65,
                 "semctl": 66, "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
                 "memfd_create": 319, "inotify_init": 253, "inotify_add_watch": 254, "inotify_rm_watch": 255,
                 "inotify_init1": 294, "fanotify_init": 300, "fanotify_mark": 301, "fork": 57, "vfork": 58,
                 **_UNIFIED_DENY},
        "clone": 56, "clone3": CLONE3, "prctl": 157, "seccomp": 317, "socket": 41, "socketpair": 53,
    },
    "aarch64": {
        "arch": 0xC00000B7,
        "deny": {"unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "bpf": 280,
                 "perf_event_open": 241, "userfaultfd": 282, "ptrace": 117, "add_key": 217, "request_key": 218,
                 "keyctl": 219, "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190,
                 "semctl": 191, "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195, "shmat": 196,
                 "shmdt": 197, "memfd_create": 279, "inotify_init1": 26, "inotify_add_watch": 27,
                 "inotify_rm_watch": 28, "fanotify_init": 262, "fanotify_mark": 263, **_UNIFIED_DENY},
        "clone": 220, "clone3": CLONE3, "prctl": 167, "seccomp": 277, "socket": 198, "socketpair": 199,
    },
}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> tuple[int, int, int, int]:
    return code, jt, jf, k


def _assemble(lines: list) -> list[tuple[int, int, int, int]]:
    """Instructions from `lines`: a str is a label (the next instruction's address); an
    instruction is (code, k) or (code, k, jt, jf) with jt / jf a label name (or 0: the next
    instruction). Classic BPF jumps forward only, by at most 255."""
    where, pc = {}, 0
    for line in lines:
        if isinstance(line, str):
            where[line] = pc
        else:
            pc += 1
    out = []
    for line in lines:
        if isinstance(line, str):
            continue
        code, k, *jumps = line
        offsets = []
        for target in jumps or (0, 0):
            offset = 0 if target == 0 else where[target] - len(out) - 1
            if not 0 <= offset <= 255:
                raise ValueError(f"seccomp filter: jump to {target!r} out of range ({offset})")
            offsets.append(offset)
        out.append(_insn(code, k, *offsets))
    return out


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for `machine` (``platform.machine()``) as (code, jt, jf, k) instructions."""
    table = SYSCALLS.get(machine)
    if table is None:
        raise OSError(f"no seccomp syscall table for {machine} (known: {', '.join(SYSCALLS)})")
    eperm, enosys = RET_ERRNO | errno.EPERM, RET_ERRNO | errno.ENOSYS
    lines = [(LD_W_ABS, OFFSET_ARCH), (JEQ_K, table["arch"], 0, "kill"), (LD_W_ABS, OFFSET_NR)]
    if machine == "x86_64":  # x32 calls share numbers with other meanings: refuse the ABI
        lines.append((JGE_K, X32_SYSCALL_BIT, "kill", 0))
    lines += [(JEQ_K, nr, "eperm", 0) for nr in sorted(set(table["deny"].values()))]
    lines += [(JEQ_K, table["clone3"], "enosys", 0), (JEQ_K, table["clone"], "clone", 0),
              (JEQ_K, table["prctl"], "prctl", 0), (JEQ_K, table["socket"], "socket", 0),
              (JEQ_K, table["socketpair"], "socket", 0), (RET_K, RET_ALLOW),
              # clone: refuse namespace flags in its first argument, and a new process (no CLONE_THREAD)
              "clone", (LD_W_ABS, OFFSET_ARG0), (JSET_K, CLONE_NEW_FLAGS, "eperm", 0),
              (JSET_K, CLONE_THREAD, "allow", "eperm"),
              # prctl: refuse PR_SET_PDEATHSIG
              "prctl", (LD_W_ABS, OFFSET_ARG0), (JEQ_K, PR_SET_PDEATHSIG, "eperm", "allow"),
              # socket, socketpair: the family (first argument) must be one of ALLOWED_FAMILIES
              "socket", (LD_W_ABS, OFFSET_ARG0),
              *((JEQ_K, family, "allow", 0) for family in ALLOWED_FAMILIES), (RET_K, eperm),
              "allow", (RET_K, RET_ALLOW), "eperm", (RET_K, eperm), "enosys", (RET_K, enosys),
              "kill", (RET_K, RET_KILL_PROCESS)]
    return _assemble(lines)


def install(libc) -> None:
    """Install the filter on the calling thread (no_new_privs must already be set); raises
    OSError naming the step on failure."""
    insns = program(platform.machine())
    raw = b"".join(struct.pack("HBBI", *i) for i in insns)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(insns), ctypes.addressof(buffer))
    seccomp = SYSCALLS[platform.machine()]["seccomp"]
    if libc.syscall(ctypes.c_long(seccomp), SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_SPEC_ALLOW,
                    ctypes.byref(fprog)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter: {errno.errorcode.get(err, err)}")
