"""Landlock through ctypes: confine this process's file access to a few paths, for good.

Landlock (Linux >= 5.13) lets an unprivileged process give up file access: once a ruleset is
enforced, opening, listing, creating, removing, renaming, truncating or executing a file is
refused (EACCES; EXDEV for a link or rename between rules) unless a rule allows that right
beneath one of the listed paths. It holds for
root as for anyone, for the process and every thread it starts, and it cannot be undone.

Standard library only, no llmctl import: ``llmctl.rl.sandbox`` imports it to ask the kernel's ABI
at start-up, and passes this file's source to the sandbox harness (``_sandbox_child.py``, run as
``python -I -S``), which runs it to confine itself.

Constants: include/uapi/linux/landlock.h and the kernel documentation "Landlock: unprivileged
access control" (Documentation/userspace-api/landlock.rst). ``handled_fs`` and the size of the
ruleset attribute follow its "Backward and forward compatibility" section: a right is only
handled (denied unless allowed) when the running kernel's ABI knows it.

What Landlock does not control (same documentation, "Current limitations"): path lookup and
``stat`` (code can learn that a path exists, its size and mode, but not read it), ``chdir``, and
file descriptors opened before the ruleset was enforced.
"""

import os
import stat
import sys

# Syscall numbers: Landlock's three calls came after the table was unified (asm-generic), so they
# are the same on x86_64, aarch64 and the other architectures.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0  # landlock_create_ruleset(NULL, 0, this) returns the ABI version
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38  # landlock_restrict_self needs it (or CAP_SYS_ADMIN)

# LANDLOCK_ACCESS_FS_* (the ABI that introduced each right)
EXECUTE = 1 << 0  # ABI 1
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2: link or rename a file into another directory
TRUNCATE = 1 << 14  # ABI 3: truncate(2), ftruncate(2), creat(2), open(2) with O_TRUNC
IOCTL_DEV = 1 << 15  # ABI 5: ioctl(2) on a device file
# LANDLOCK_ACCESS_NET_* (ABI 4) and LANDLOCK_SCOPE_* (ABI 6)
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

# The only rights a rule on a file (not a directory) may carry; the others concern directory entries.
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
READ = READ_FILE | READ_DIR
# Everything but running programs, making device nodes and device ioctls: what a scratch dir needs.
WRITE = ((1 << 16) - 1) & ~(EXECUTE | MAKE_CHAR | MAKE_BLOCK | IOCTL_DEV)


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def abi_version():
    """The kernel's Landlock ABI (1, 2, ...); 0 when there is none (not Linux, a kernel built
    without it, or Landlock left out of the ``lsm=`` boot list)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        ctypes, libc = _libc()
    except (OSError, ImportError):
        return 0
    v = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                     ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(v))


def handled_fs(abi):
    """The filesystem rights ABI ``abi`` knows: every one of them is denied unless a rule allows it."""
    rights = (1 << 13) - 1  # ABI 1: EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def restrict(read=(), write=()):
    """Enforce on this process (and its future threads) a ruleset that allows reading (files and
    directory listings) beneath each path in ``read`` and ``WRITE`` beneath each path in
    ``write``; every other file access is refused. A path may be a file (its rights are cut to
    those a file takes); paths that do not exist are skipped. From ABI 4 TCP bind/connect are
    refused too, from ABI 6 signals and abstract unix sockets to processes outside the ruleset.

    Also sets no_new_privs (the kernel requires it). Returns the ABI; raises OSError naming the
    path or step when Landlock is missing or a step fails, and then nothing is enforced."""
    abi = abi_version()
    if abi < 1:
        raise OSError(38, "Landlock is not available (kernel without it, or not in the lsm= boot list)")
    ctypes, libc = _libc()

    class RulesetAttr(ctypes.Structure):  # struct landlock_ruleset_attr
        _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                    ("scoped", ctypes.c_uint64)]

    class PathBeneathAttr(ctypes.Structure):  # struct landlock_path_beneath_attr, __attribute__((packed))
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    handled = handled_fs(abi)
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    # The struct grew with the ABI (8 bytes, 16 from ABI 4, 24 from ABI 6): pass the size this
    # kernel knows, so an older kernel never sees fields it would reject.
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    attr = RulesetAttr(handled, net, scoped)
    ruleset = libc.syscall(ctypes.c_long(_SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"landlock_create_ruleset: {os.strerror(e)}")
    try:
        for paths, rights in ((read, READ), (write, WRITE)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                try:
                    allowed = rights & handled
                    if not stat.S_ISDIR(os.fstat(fd).st_mode):
                        allowed &= FILE_RIGHTS
                    rule = PathBeneathAttr(allowed, fd)
                    if libc.syscall(ctypes.c_long(_SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                    ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                        e = ctypes.get_errno()
                        raise OSError(e, f"landlock_add_rule {path}: {os.strerror(e)}")
                finally:
                    os.close(fd)
        ulong = ctypes.c_ulong
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, ulong(1), ulong(0), ulong(0), ulong(0)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"prctl(NO_NEW_PRIVS): {os.strerror(e)}")
        if libc.syscall(ctypes.c_long(_SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"landlock_restrict_self: {os.strerror(e)}")
    finally:
        os.close(ruleset)
    return abi
