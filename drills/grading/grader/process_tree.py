"""Starting and ending the processes of a grading, so that nothing the learner's file starts outlives it.

- The learner's process runs in a session of its own (`start_new_session`), so a signal meant for the
  terminal's process group (Ctrl-C) or for it never reaches the grader by mistake.
- The grader (the pytest process) and the command that reads its result (`drills.grading.grader.pytest_run`)
  make themselves child subreapers (Linux's PR_SET_CHILD_SUBREAPER): a process the learner's file starts
  and detaches (a double fork, setsid) is adopted by them instead of by init when its parent ends.
- `end_strays(keep)` kills every child of this process except `keep`, again and again until none is
  left: killing one hands its own children to us, so a whole detached tree ends. The grader calls it
  before it writes the report, and the command calls it before it reads the report, so no descendant
  of the learner's file can rewrite the report or the terminal after the real screen.
- `harden()` makes this process non-dumpable: another process of the same user can then no longer read
  its memory or open its file descriptors through /proc (the result channel among them).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

# The pids of the children this process started on purpose (a grading's pytest, the warm pool): the
# ones end_strays spares. Every other child is an orphan adopted from a learner's process.
OWN: set[int] = set()

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Orphaned descendants of this process are adopted by it (Linux 3.4+); False where not possible."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def harden() -> bool:
    """No same-user process may read this one's memory or descriptors through /proc or ptrace."""
    return _prctl(PR_SET_DUMPABLE, 0)


def children() -> list[int]:
    """The pids whose parent is this process (from /proc; empty where there is no /proc)."""
    me, found = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ")".
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(entry))
    return found


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def end_strays(keep=(), rounds: int = 50) -> int:
    """Kill every child of this process but those in keep, until none is left; how many were killed."""
    keep, killed = set(keep), 0
    for _ in range(rounds):
        strays = [pid for pid in children() if pid not in keep]
        if not strays:
            return killed
        for pid in strays:
            try:
                os.killpg(pid, signal.SIGKILL)  # its process group too, where it leads one
            except OSError:
                pass
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.01)
        for pid in strays:
            _reap(pid)
    return killed


def end_tree(pid: int) -> None:
    """Kill a child we started and the session it leads (the learner's process and what it started)."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass
