"""Child processes die with their parent: `die_with_parent`, called first thing in a child.

A `kill -9` of llmctl runs no clean-up, so without this its pool workers (and a fastText
training child) would run on as orphans, holding cores and memory, until their work ran out.
Linux's PR_SET_PDEATHSIG asks the kernel to send the child a signal when its parent goes. Two
limits of that mechanism shape how it is used here:

- the signal fires when the *thread* that forked the child ends, not the whole process; llmctl's
  children are forked by a thread that waits for them (run_tasks' caller, subprocess.run), so
  that thread outlives them;
- a parent that died before the child made the call is missed, so the child then compares its
  parent with the one it was started by, and exits if it has already been reparented.

Elsewhere (macOS, Windows) there is no such call and this does nothing.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send `sig` to this process when its parent exits; exit at once if the
    parent is no longer `parent_pid` (it died before this call). Returns whether the kernel
    took the request. SIGKILL by default: a worker has nothing to save, and its half-written
    temporary files are cleared by the next run."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) == 0
    except (OSError, AttributeError):  # no libc with prctl (an unusual Python build)
        ok = False
    if os.getppid() != parent_pid:
        os._exit(1)
    return ok
