"""The result channel: how the grader's report reaches the command that prints it.

`make test`, `watch`, `progress` and `hint` start the grader (pytest) with the write end of a pipe
(`--drills-report-fd=N`) and read the report from the read end; there is no file anyone could rewrite
after the grader wrote it. The learner's process never holds that descriptor (it is started with only
its own socket), cannot open it through /proc (the grader is non-dumpable, and Landlock keeps a
sandboxed process from another's descriptors), and every process it started is ended before the report
is read (process.end_strays). Anything else written into the pipe makes the report unreadable, a
"grader error", never a pass. `make mutants`, whose gradings are forked from a warm process
(fork_server.GradingPool), passes a private file instead: the files it grades are the course's own mutants.
"""

from __future__ import annotations

import os
import threading


class ResultPipe:
    """A pipe whose write end a child inherits (`fd` for its command line) and whose read end is read
    in a thread while the child runs, so a large report never blocks the child's write."""

    def __init__(self):
        self._read, self.fd = os.pipe()
        os.set_inheritable(self.fd, True)
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            chunk = os.read(self._read, 1 << 16)
            if not chunk:
                break
            self._chunks.append(chunk)
        os.close(self._read)

    def started(self) -> None:
        """The child has its copy: close ours, so that the pipe ends when the child's does."""
        os.close(self.fd)
        self.fd = -1

    def text(self, timeout: float = 10.0) -> str | None:
        """What the child wrote, once every holder of the write end has closed it (None: still open)."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return None
        return b"".join(self._chunks).decode(errors="replace")


def write_to_fd(fd: int, text: str) -> None:
    data = text.encode()
    while data:
        n = os.write(fd, data)
        data = data[n:]
    os.close(fd)
