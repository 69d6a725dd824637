"""The OS-level name of the calling thread, so that `top -H`, `ps -L`, py-spy and /proc show
what each of the server's threads is (Python before 3.14 names threads for itself only).

Linux only (`prctl(PR_SET_NAME)`, at most 15 bytes); elsewhere, or if libc is not found, it does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_PR_SET_NAME = 15
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if sys.platform == "linux" else None


def name_this_thread(name: str) -> None:
    if _libc is not None:
        _libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
