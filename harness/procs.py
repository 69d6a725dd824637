"""Which processes a test's server started, and which of them are still there.

    seen = Descendants(proc.pid)      # record(): every descendant now, kept once seen (new_only: not those there now)
    seen.record(); ...; seen.alive()  # those still running (a zombie has exited: not counted)
    in_session(proc.pid)              # every running process in the session `proc` leads
    end_session(proc.pid)             # kill them (the resource tracker last: it removes leaked shared memory)
    listens(proc.pid, port)           # it, or a process it started, listens on 127.0.0.1:port

A process whose parent died is re-parented to init and leaves the tree, so
the tree alone cannot show an orphan: start the server as the leader of a
session of its own (`ServerProcess(..., new_session=True)`); the processes
it starts stay in that session (vLLM's do not call setsid), orphaned or not.
(Not a tag in the environment: vLLM's processes set their title with
setproctitle, which overwrites what /proc/PID/environ shows.)
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def listens(pid: int, port: int) -> bool:
    """The process `pid`, or one it started, listens on TCP `port`: an answer on a port picked free
    before the server bound it is this server's, not another's that took the same port first."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for proc in family:
        try:
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in proc.net_connections("tcp")):
                return True
        except psutil.Error:
            continue
    return False


def describe(procs: Iterable[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid} {proc.name()} (parent {proc.ppid()}): {' '.join(proc.cmdline())[:100]}")
        except psutil.Error:
            out.append(f"{proc.pid} (gone)")
    return out


class Descendants:
    def __init__(self, pid: int, *, new_only: bool = False) -> None:
        """`new_only`: not the descendants there already (the test process's own servers)."""
        self.root = psutil.Process(pid)
        self.seen: dict[int, psutil.Process] = {}
        self.names: dict[int, str] = {}  # pid -> its command line when last seen
        self.old = {proc.pid for proc in self.root.children(recursive=True)} if new_only else set()

    def record(self) -> list[psutil.Process]:
        """Every descendant of the root now (also kept in `seen`)."""
        try:
            now = self.root.children(recursive=True)
        except psutil.Error:
            return []
        now = [proc for proc in now if proc.pid not in self.old]
        for proc in now:
            self.seen.setdefault(proc.pid, proc)
            try:
                name = " ".join(proc.cmdline())[:60]
            except psutil.Error:
                continue
            if name:  # (a zombie's is empty)
                self.names[proc.pid] = name
        return now

    def cmdlines(self) -> list[str]:
        """The command lines of every descendant now."""
        return [self.names.get(proc.pid, "") for proc in self.record()]

    def summary(self) -> str:
        return "; ".join(f"{pid} {name}" for pid, name in self.names.items())

    def alive(self) -> list[psutil.Process]:
        return [proc for proc in self.seen.values() if running(proc)]


def in_session(sid: int) -> list[psutil.Process]:
    """Every running process of session `sid` (its leader's pid)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and running(proc):
                found.append(proc)
        except (OSError, psutil.Error):
            pass
    return found


def end_session(sid: int) -> None:
    """Kill what is left of session `sid`: multiprocessing's resource tracker last, once the others
    are gone, so that it first removes the shared memory they leaked."""
    def tracker(proc: psutil.Process) -> bool:
        try:
            return "resource_tracker" in " ".join(proc.cmdline())
        except psutil.Error:
            return False

    for proc in in_session(sid):
        if not tracker(proc):
            proc.kill()
    psutil.wait_procs(in_session(sid), timeout=10)
    for proc in in_session(sid):
        proc.kill()
