"""Child side of llmctl.rl.sandbox: the harness that runs untrusted code against test cases.

It runs as ``python -I -S -c <this file's source> FD PARENT_PID`` in a fresh temp dir, so it may
import the standard library only. Steps: die with the parent (a ``kill -9`` of llmctl must not
leave untrusted code running; see llmctl/runtime/lifeline.py, which this cannot import); read and
delete ``.payload.json``; compile the tests (a test that
does not compile is the dataset's fault: ``badtest``); set the resource limits; install the
seccomp filter; report ``ready``; exec the code; exec each test in the code's namespace; report
``done``. Reports go to the inherited pipe FD as lines ``NONCE EVENT [DETAIL]`` — not to stdout,
which the code owns. Everything before ``ready`` is infrastructure: a failure there is a masked
sample, never a 0 reward.

The seccomp filter (Linux x86_64 / aarch64) is what makes the limits hold when the parent runs as
root, for whom the kernel ignores RLIMIT_NPROC and who could raise any rlimit back:
- fork / vfork / clone without CLONE_THREAD → EAGAIN (no child processes, threads allowed);
  clone3 → ENOSYS (glibc then falls back to clone for threads);
- socket / socketpair / io_uring_setup → EPERM (no network, whatever the environment);
- setrlimit, prlimit64 with a new limit → EPERM (limits cannot be raised back);
- kill / tgkill of any process but itself, tkill, ptrace, process_vm_writev, pidfd_open,
  pidfd_send_signal, unshare, setns, mount → EPERM;
- any other architecture's syscall ABI (i386 int 0x80, x32) → the process is killed.
Where seccomp is unavailable (another OS or architecture), the harness goes on with rlimits only
when not root (RLIMIT_NPROC then stops fork bombs), and refuses (``herror``) as root.
"""

import os
import sys

_ERRNO = {"EPERM": 1, "EAGAIN": 11, "ENOSYS": 38}
_ARCHES = {
    # machine: (AUDIT_ARCH_*, syscall numbers)
    "x86_64": (0xC000003E, {
        "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "socket": 41, "socketpair": 53,
        "io_uring_setup": 425, "setrlimit": 160, "prlimit64": 302, "kill": 62, "tkill": 200,
        "tgkill": 234, "ptrace": 101, "process_vm_writev": 311, "pidfd_open": 434,
        "pidfd_send_signal": 424, "unshare": 272, "setns": 308, "mount": 165,
    }),
    "aarch64": (0xC00000B7, {
        "clone": 220, "clone3": 435, "socket": 198, "socketpair": 199, "io_uring_setup": 425,
        "setrlimit": 164, "prlimit64": 261, "kill": 129, "tkill": 130, "tgkill": 131, "ptrace": 117,
        "process_vm_writev": 271, "pidfd_open": 434, "pidfd_send_signal": 424, "unshare": 97,
        "setns": 268, "mount": 40,
    }),
}
_CLONE_THREAD = 0x00010000


def _seccomp_program(machine, pid):
    """The BPF program as (code, jt, jf, k) tuples, or None for an unsupported machine."""
    if machine not in _ARCHES:
        return None
    audit_arch, nr = _ARCHES[machine]
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ/JGE/JSET|K, RET|K
    ALLOW, KILL = 0x7FFF0000, 0x80000000

    def deny(e):
        return (RET, 0, 0, 0x00050000 | _ERRNO[e])

    def arg(i, high=False):  # offset of args[i] (low or high 32 bits) in struct seccomp_data
        return (LD, 0, 0, 16 + 8 * i + (4 if high else 0))

    prog = [(LD, 0, 0, 4), (JEQ, 1, 0, audit_arch), (RET, 0, 0, KILL), (LD, 0, 0, 0)]
    if machine == "x86_64":  # x32 ABI syscall numbers
        prog += [(JGE, 0, 1, 0x40000000), (RET, 0, 0, KILL)]
    for name, e in (("fork", "EAGAIN"), ("vfork", "EAGAIN"), ("clone3", "ENOSYS"), ("socket", "EPERM"),
                    ("socketpair", "EPERM"), ("io_uring_setup", "ENOSYS"), ("setrlimit", "EPERM"),
                    ("tkill", "EPERM"), ("ptrace", "EPERM"), ("process_vm_writev", "EPERM"),
                    ("pidfd_open", "EPERM"), ("pidfd_send_signal", "EPERM"), ("unshare", "EPERM"),
                    ("setns", "EPERM"), ("mount", "EPERM")):
        if name in nr:
            prog += [(JEQ, 0, 1, nr[name]), deny(e)]
    # Blocks below load an argument; the syscall-number test skips the whole block otherwise, so
    # the accumulator still holds the number for the next block.
    prog += [(JEQ, 0, 4, nr["clone"]), arg(0), (JSET, 0, 1, _CLONE_THREAD), (RET, 0, 0, ALLOW), deny("EAGAIN")]
    for name in ("kill", "tgkill"):
        prog += [(JEQ, 0, 4, nr[name]), arg(0), (JEQ, 0, 1, pid), (RET, 0, 0, ALLOW), deny("EPERM")]
    prog += [(JEQ, 0, 6, nr["prlimit64"]), arg(2), (JEQ, 0, 3, 0), arg(2, high=True), (JEQ, 0, 1, 0),
             (RET, 0, 0, ALLOW), deny("EPERM")]
    prog.append((RET, 0, 0, ALLOW))
    return prog


def _install_seccomp():
    """Install the filter; returns None on success, else why not."""
    machine = os.uname().machine
    if sys.platform != "linux":
        return f"seccomp needs Linux, not {sys.platform}"
    prog = _seccomp_program(machine, os.getpid())
    if prog is None:
        return f"no seccomp filter for {machine}"
    import ctypes

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    ulong = ctypes.c_ulong
    if libc.prctl(38, ulong(1), ulong(0), ulong(0), ulong(0)) != 0:  # PR_SET_NO_NEW_PRIVS
        return f"prctl(NO_NEW_PRIVS) failed: errno {ctypes.get_errno()}"
    if libc.prctl(22, ulong(2), ctypes.byref(fprog), ulong(0), ulong(0)) != 0:  # PR_SET_SECCOMP, FILTER
        return f"prctl(SECCOMP) failed: errno {ctypes.get_errno()}"
    return None


def _die_with_parent(parent_pid):
    """PR_SET_PDEATHSIG(SIGKILL), then exit if the parent is already gone (it died before the call)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None).prctl(1, ctypes.c_ulong(9), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _set_limits(limits):
    import resource

    for name, (soft, hard) in limits.items():
        res = getattr(resource, name)
        _, cur_hard = resource.getrlimit(res)
        if cur_hard != resource.RLIM_INFINITY:  # never try to raise a hard limit we were given
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        resource.setrlimit(res, (soft, hard))


def _one_line(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc):
    try:
        return _one_line(f"{type(exc).__name__}: {exc}")
    except BaseException:  # a __str__ that raises
        return type(exc).__name__


def _main():
    _die_with_parent(int(sys.argv[2]))
    write, fd, exit_now = os.write, int(sys.argv[1]), os._exit
    nonce = "?"

    def emit(event, detail=""):
        write(fd, f"{nonce} {event} {_one_line(detail)}\n".encode("utf-8", "replace"))

    try:
        import json

        with open(".payload.json", encoding="utf-8") as f:
            payload = json.load(f)
        os.unlink(".payload.json")
        nonce = payload["nonce"]
        try:
            tests = [compile(t, f"<test {i + 1}>", "exec") for i, t in enumerate(payload["tests"])]
        except SyntaxError as e:
            emit("badtest", f"test {e.filename}: {_describe(e)}")
            exit_now(0)
        _set_limits(payload["limits"])
        why = _install_seccomp()
        isolation = "seccomp+rlimits" if why is None else "rlimits"
        if why is not None and os.geteuid() == 0:
            emit("herror", f"running as root without seccomp ({why}): processes and rlimits cannot be contained")
            exit_now(0)
        code = payload["code"]
        del payload
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    except BaseException as e:
        emit("herror", _describe(e))
        exit_now(0)

    _exec, _compile, _enumerate = exec, compile, enumerate
    emit("ready", isolation)
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        _exec(_compile(code, "<solution>", "exec"), namespace)
    except BaseException as e:
        emit("crash", _describe(e))
        _flush_and_exit(exit_now)
    for i, test in _enumerate(tests):
        try:
            _exec(test, namespace)
        except BaseException as e:
            emit("fail", f"{i} {_describe(e)}")
        else:
            emit("pass", str(i))
    emit("done")
    _flush_and_exit(exit_now)


def _flush_and_exit(exit_now):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    exit_now(0)


if __name__ == "__main__":
    _main()
