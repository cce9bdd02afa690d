"""The local sandbox's syscall filter: a classic-BPF seccomp program, built here in pure Python and
installed by the child (:mod:`rlcore.sandbox._child`) as the last step before the code runs.

It answers ``EPERM`` to the kernel's attack surface that model-written code has no use for:
namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag), mounts and ``pivot_root``,
``ptrace`` and cross-process memory access, ``bpf``, the key store (``keyctl``, ``add_key``), kernel
modules and ``kexec``, ``perf_event_open``, ``userfaultfd``, ``io_uring`` (file I/O that seccomp cannot
see), file handles (``open_by_handle_at``: the classic container escape), and clock, host name,
swap and reboot controls, inotify and fanotify (watching the shared read-only trees shows other
processes' opens). ``clone3`` gets ``ENOSYS``: its flags sit in memory a filter cannot read, and the
C library then falls back to ``clone``, whose flags it can. Syscalls of another ABI (32-bit
``int 0x80``, x32) are refused as a whole.

``socket`` is an allowlist of families: ``AF_UNIX`` and ``AF_INET``/``AF_INET6`` (TCP apart from the
rest), every other family (netlink, packet, vsock, alg ...) refused; ``socketpair`` only for
``AF_UNIX``. What of those, of SysV IPC and of ``memfd_create`` is allowed depends on the layers that
held for the call (:data:`SLOTS`): the program has a ``RET`` instruction per switch, which the child sets
before installing it. Everything else is allowed: the filter is a deny list over a program that
already runs unprivileged, not a profile of what Python needs.

>>> program = build_filter("x86_64")
>>> len(program) % 8, len(program) // 8 < 4096
(0, True)
"""

from __future__ import annotations

import errno
import platform
import struct

#: Syscalls refused with ``EPERM``, by name (``clone`` is refused only with namespace flags).
DENIED = (
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr", "ptrace", "process_vm_readv", "process_vm_writev",
    "process_madvise", "pidfd_getfd", "kcmp", "bpf", "keyctl", "add_key", "request_key",
    "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "open_by_handle_at", "name_to_handle_at", "fanotify_init", "lookup_dcookie", "syslog", "acct",
    "quotactl", "quotactl_fd", "swapon", "swapoff", "reboot", "vhangup", "sethostname", "setdomainname",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
    "inotify_init", "inotify_init1", "fanotify_mark",
)  # fmt: skip
#: SysV IPC and POSIX message queues: allowed only inside the call's own IPC namespace (switch ``sysv``).
SYSV = ("shmget", "shmat", "shmctl", "semget", "semop", "semctl", "semtimedop", "msgget", "msgsnd",
        "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
        "mq_getsetattr")  # fmt: skip
#: Memory no address-space limit sees: allowed only where a memory cgroup counts it (switch ``memfd``).
MEMFD = ("memfd_create", "memfd_secret")

# Syscall numbers (linux/arch/x86/entry/syscalls/syscall_64.tbl, include/uapi/asm-generic/unistd.h).
_X86_64 = {
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "process_madvise": 440, "pidfd_getfd": 438, "kcmp": 312, "bpf": 321, "keyctl": 250, "add_key": 248,
    "request_key": 249, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "open_by_handle_at": 304,
    "name_to_handle_at": 303, "fanotify_init": 300, "lookup_dcookie": 212, "syslog": 103, "acct": 163,
    "quotactl": 179, "quotactl_fd": 443, "swapon": 167, "swapoff": 168, "reboot": 169, "vhangup": 153,
    "sethostname": 170, "setdomainname": 171, "settimeofday": 164, "clock_settime": 227,
    "clock_adjtime": 305, "adjtimex": 159, "iopl": 172, "ioperm": 173, "clone": 56, "clone3": 435,
    "inotify_init": 253, "inotify_init1": 294, "fanotify_mark": 301,
    "shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64, "semop": 65, "semctl": 66, "semtimedop": 220,
    "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "mq_open": 240, "mq_unlink": 241,
    "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
    "memfd_create": 319, "memfd_secret": 447, "socket": 41, "socketpair": 53,
}  # fmt: skip
_AARCH64 = {
    "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
    "process_madvise": 440, "pidfd_getfd": 438, "kcmp": 272, "bpf": 280, "keyctl": 219, "add_key": 217,
    "request_key": 218, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "init_module": 105, "finit_module": 273,
    "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "open_by_handle_at": 265,
    "name_to_handle_at": 264, "fanotify_init": 262, "lookup_dcookie": 18, "syslog": 116, "acct": 89,
    "quotactl": 60, "quotactl_fd": 443, "swapon": 224, "swapoff": 225, "reboot": 142, "vhangup": 58,
    "sethostname": 161, "setdomainname": 162, "settimeofday": 170, "clock_settime": 112,
    "clock_adjtime": 266, "adjtimex": 171, "clone": 220, "clone3": 435,
    "inotify_init1": 26, "fanotify_mark": 263,
    "shmget": 194, "shmat": 196, "shmctl": 195, "semget": 190, "semop": 193, "semctl": 191,
    "semtimedop": 192, "msgget": 186, "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "mq_open": 180,
    "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184,
    "mq_getsetattr": 185, "memfd_create": 279, "memfd_secret": 447, "socket": 198, "socketpair": 199,
}  # fmt: skip
#: ``uname -m`` -> (``AUDIT_ARCH_*``, syscall numbers, whether x32 numbers must be refused).
ARCHES = {
    "x86_64": (0xC000003E, _X86_64, True),
    "aarch64": (0xC00000B7, _AARCH64, False),
}

#: ``CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET`` (``CLONE_NEWTIME`` shares
#: its bit with ``clone``'s exit signal, and only ``clone3``/``unshare`` take it: both are refused).
CLONE_NAMESPACE_FLAGS = 0x7E020000
_X32_SYSCALL_BIT = 0x40000000

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
RET_EPERM = _RET_ERRNO | errno.EPERM
RET_ALLOW = _RET_ALLOW
_LD_ABS_W, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_NR, _ARCH, _ARG0_LOW, _ARG1_LOW, _ARG2_LOW = 0, 4, 16, 24, 32
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
SOCK_STREAM, _SOCK_TYPE_MASK = 1, 0xF
_IPPROTO_TCP = 6

#: The filter's switches: each is a ``RET`` instruction whose verdict the child sets once it knows
#: which layers hold (:func:`set_slots`), so the parent builds one program per machine.
#: ``sysv``: SysV IPC and POSIX message queues (allowed only inside the call's own IPC namespace);
#: ``memfd``: ``memfd_create``/``memfd_secret`` (allowed only where a memory cgroup counts them);
#: ``unix``: ``socket(AF_UNIX)`` (only inside the network and mount namespaces: outside them it
#: reaches the caller's abstract and path sockets; ``socketpair`` is always allowed);
#: ``inet_tcp``: plain TCP sockets (``AF_INET``/``AF_INET6``, ``SOCK_STREAM``, protocol 0 or TCP),
#: allowed where the network namespace or Landlock's TCP rules hold; ``inet_other``: UDP, raw, SCTP ...,
#: allowed only inside the network namespace. Every other family (netlink, packet, vsock, alg,
#: bluetooth ...) is refused always.
SLOTS = ("sysv", "memfd", "unix", "inet_tcp", "inet_other")


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _assemble(items: list) -> tuple[bytes, dict[str, int]]:
    """``items``: ``(code, k, jt, jf)`` tuples whose jumps are labels (str) or 0, and label names
    (str) marking the next instruction -> (program, {label: instruction index})."""
    labels: dict[str, int] = {}
    insns: list[tuple] = []
    for item in items:
        if isinstance(item, str):
            labels[item] = len(insns)
        else:
            insns.append(item)

    def offset(target: int | str, at: int) -> int:
        if isinstance(target, int):
            return target
        rel = labels[target] - at - 1
        if not 0 <= rel <= 255:
            raise ValueError(f"seccomp: jump to {target} out of range ({rel})")
        return rel

    out = [_insn(code, k, offset(jt, i), offset(jf, i)) for i, (code, k, jt, jf) in enumerate(insns)]
    return b"".join(out), labels


def build_program(machine: str | None = None) -> tuple[bytes, dict[str, int]]:
    """The filter for ``machine`` (default: this one) as packed ``struct sock_filter`` instructions,
    with the instruction index of each switch of :data:`SLOTS` (set to refuse); ``KeyError`` for an
    architecture without a table here."""
    arch, numbers, x32 = ARCHES[machine or platform.machine()]
    items: list = [
        (_LD_ABS_W, _ARCH, 0, 0),
        (_JEQ, arch, 1, 0),
        (_RET, RET_EPERM, 0, 0),
        (_LD_ABS_W, _NR, 0, 0),
    ]
    if x32:
        items.append((_JGE, _X32_SYSCALL_BIT, "eperm", 0))
    for name in DENIED:
        if name in numbers:
            items.append((_JEQ, numbers[name], "eperm", 0))
    for name in SYSV:
        items.append((_JEQ, numbers[name], "sysv", 0))
    for name in MEMFD:
        items.append((_JEQ, numbers[name], "memfd", 0))
    items += [
        (_JEQ, numbers["clone3"], "enosys", 0),
        (_JEQ, numbers["clone"], "clone", 0),
        (_JEQ, numbers["socket"], "socket", 0),
        (_JEQ, numbers["socketpair"], "socketpair", 0),
        (_RET, RET_ALLOW, 0, 0),
        # clone's flags (a little-endian machine: the low word first)
        "clone", (_LD_ABS_W, _ARG0_LOW, 0, 0), (_JSET, CLONE_NAMESPACE_FLAGS, "eperm", "allow"),
        "socketpair", (_LD_ABS_W, _ARG0_LOW, 0, 0), (_JEQ, AF_UNIX, "allow", "eperm"),
        "socket", (_LD_ABS_W, _ARG0_LOW, 0, 0),
        (_JEQ, AF_UNIX, "unix", 0), (_JEQ, AF_INET, "inet", 0), (_JEQ, AF_INET6, "inet", "eperm"),
        "inet", (_LD_ABS_W, _ARG1_LOW, 0, 0), (_AND, _SOCK_TYPE_MASK, 0, 0),
        (_JEQ, SOCK_STREAM, 0, "inet_other"), (_LD_ABS_W, _ARG2_LOW, 0, 0),
        (_JEQ, 0, "inet_tcp", 0), (_JEQ, _IPPROTO_TCP, "inet_tcp", "inet_other"),
        # Jumps go forward only: the shared verdicts come last.
        "allow", (_RET, RET_ALLOW, 0, 0),
        "eperm", (_RET, RET_EPERM, 0, 0),
        "enosys", (_RET, _RET_ERRNO | errno.ENOSYS, 0, 0),
    ]  # fmt: skip
    for slot in SLOTS:
        items += [slot, (_RET, RET_EPERM, 0, 0)]
    program, labels = _assemble(items)
    return program, {slot: labels[slot] for slot in SLOTS}


def set_slots(program: bytes, slots: dict[str, int], allow: dict[str, bool]) -> bytes:
    """``program`` with each switch of ``allow`` set to allow (``True``) or refuse with ``EPERM``.
    (The child does the same on its hex copy: it imports nothing of rlcore.)"""
    out = bytearray(program)
    for name, index in slots.items():
        struct.pack_into("=I", out, index * 8 + 4, RET_ALLOW if allow.get(name) else RET_EPERM)
    return bytes(out)


def build_filter(machine: str | None = None, **allow: bool) -> bytes:
    """:func:`build_program` with its switches set by ``allow`` (each of :data:`SLOTS`; default: refused)."""
    program, slots = build_program(machine)
    return set_slots(program, slots, allow)


def filter_hex() -> tuple[str | None, dict[str, int], str]:
    """``(program as hex, its switches, "")`` for this machine, or ``(None, {}, why)`` where there is
    no table."""
    try:
        program, slots = build_program()
        return program.hex(), slots, ""
    except KeyError:
        return None, {}, f"no syscall table for this architecture ({platform.machine()}): x86_64, aarch64"
