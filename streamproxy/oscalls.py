"""The operating-system calls the server makes itself, Linux's `prctl`, in one place.

`name_this_thread(name)`: the OS-level name of the calling thread
(PR_SET_NAME, at most 15 bytes), so that `top -H`, `ps -L`, py-spy and /proc
show what each of the server's threads is (Python before 3.14 names threads
for itself only). `die_with_parent(sig)`: the kernel sends `sig` to this
process when the thread that started it ends (PR_SET_PDEATHSIG): a worker of
`--api-server-count` and a gateway's `launch:` replica (called in the child
between fork and exec) go with their parent. Elsewhere than Linux, or
without a libc, both do nothing. The sans-IO layers make no OS call: this
module is the edge's (tests/unit/test_layers.py keeps `ctypes` here).
"""

from __future__ import annotations

import ctypes
import signal
import sys

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _libc() -> ctypes.CDLL | None:
    if sys.platform != "linux":
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def name_this_thread(name: str) -> None:
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def die_with_parent(sig: signal.Signals = signal.SIGTERM) -> None:
    """`sig` when the parent (the thread that forked this process) ends. The parent may already
    be gone: the caller compares `os.getppid()` after this."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
