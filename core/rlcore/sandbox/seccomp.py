"""The local sandbox's syscall filter: a classic-BPF seccomp program, built here in pure Python and
installed by the child (:mod:`rlcore.sandbox._child`) as the last step before the code runs.

It answers ``EPERM`` to the kernel's attack surface that model-written code has no use for:
namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag), mounts and ``pivot_root``,
``ptrace`` and cross-process memory access, ``bpf``, the key store (``keyctl``, ``add_key``), kernel
modules and ``kexec``, ``perf_event_open``, ``userfaultfd``, ``io_uring`` (file I/O that seccomp cannot
see), file handles (``open_by_handle_at``: the classic container escape), and clock, host name,
swap and reboot controls. ``clone3`` gets ``ENOSYS``: its flags sit in memory a filter cannot read,
and the C library then falls back to ``clone``, whose flags it can. Syscalls of another ABI (32-bit
``int 0x80``, x32) are refused as a whole. Everything else is allowed: the filter is a deny list
over a program that already runs unprivileged, not a profile of what Python needs.

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
)  # fmt: skip

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
_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_NR, _ARCH, _ARG0_LOW = 0, 4, 16


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this one) as packed ``struct sock_filter`` instructions;
    ``KeyError`` for an architecture without a table here."""
    arch, numbers, x32 = ARCHES[machine or platform.machine()]
    eperm = _RET_ERRNO | errno.EPERM
    out = [_insn(_LD_ABS_W, _ARCH), _insn(_JEQ, arch, jt=1), _insn(_RET, eperm), _insn(_LD_ABS_W, _NR)]
    if x32:
        out += [_insn(_JGE, _X32_SYSCALL_BIT, jf=1), _insn(_RET, eperm)]
    for name in DENIED:
        if name in numbers:
            out += [_insn(_JEQ, numbers[name], jf=1), _insn(_RET, eperm)]
    out += [_insn(_JEQ, numbers["clone3"], jf=1), _insn(_RET, _RET_ERRNO | errno.ENOSYS)]
    out += [
        _insn(_JEQ, numbers["clone"], jf=3),
        _insn(_LD_ABS_W, _ARG0_LOW),  # clone's flags (a little-endian machine: the low word first)
        _insn(_JSET, CLONE_NAMESPACE_FLAGS, jf=1),
        _insn(_RET, eperm),
        _insn(_RET, _RET_ALLOW),
    ]
    return b"".join(out)


def filter_hex() -> tuple[str | None, str]:
    """``(program as hex, "")`` for this machine, or ``(None, why)`` where there is no table."""
    try:
        return build_filter().hex(), ""
    except KeyError:
        return None, f"no syscall table for this architecture ({platform.machine()}): x86_64, aarch64"
