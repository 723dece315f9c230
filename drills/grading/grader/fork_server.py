"""Warm processes for grading many files of one lesson in a row: `make mutants` on the CPU.

A grading starts two Python processes, the grader's pytest and the learner's process, and each spends
about a second importing torch and Triton before it does anything: most of the time of a small lesson's
mutant. `GradingPool` starts one process (`python -m drills.grading.grader.fork_server`) that imports them
once and forks, per grading, a child that runs `pytest.main` with the arguments
`drills.grading.grader.pytest_run.grade` gives a fresh `python -m pytest`. Before importing pytest it forks a
second warm process, from the exact point where `python -m drills.grading.learner.serve_calls` would import
the learner's file; the learner's processes of those gradings are forked from it (`start_learner_process`,
which drills/grading/grader/learner_client.py asks first). Each learner file is still imported in a process of
its own, its kernels seen by no other grading; what a grading checks and reports is unchanged, only the start
is shorter.

Forking is safe here because neither warm process has run a kernel or started a thread (one thread per
math library, learner_client.child_env), and it is used only under Triton's interpreter on Linux
(`unavailable`): a process that has touched CUDA cannot be forked, nor one that loaded macOS's frameworks.
`make test` (one grading) starts the warm learner process alone (`start_warm_learner`), beside pytest, so
that the two processes' imports overlap.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from drills.grading.grader import process_tree
from drills.lessons import ROOT

ZYGOTE_ENV = "DRILLS_LEARNER_ZYGOTE"  # the socket of the warm learner process, in the gradings' environment
TICK_S = 0.02  # how often a warm process looks for children that ended


def unavailable() -> str | None:
    """None when gradings can be forked here, else why not (the caller starts fresh processes)."""
    import drills.runtime

    if not drills.runtime.current().interpreter:
        return "on a GPU each grading starts afresh: a process that has touched CUDA cannot be forked"
    if not sys.platform.startswith("linux"):
        return "forking a process that imported torch is safe on Linux only (macOS's frameworks are not)"
    return None


def _reap(on_exit) -> None:
    """Collect every child that ended, calling on_exit(pid, returncode) as subprocess.Popen numbers it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        on_exit(pid, os.waitstatus_to_exitcode(status))


def _quiet_stdio(out_fd: int) -> None:
    """stdin from /dev/null, stdout and stderr to out_fd (the child's log, or its output file)."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)


def _child_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


# --- Learner processes, forked from a warm one ---------------------------------------------------


def serve_learner_processes(listener: socket.socket, parent_gone: int) -> None:
    """The warm learner process: for each request on listener (the file, its module name, whether it is
    a reference, the environment, and two descriptors: the grader's socket and the log), fork a child
    that runs drills.grading.learner.serve_calls.run_file on it. Replies the child's pid, then its returncode
    when it ends. Returns (its children killed) when parent_gone reads end of file."""
    from drills.grading.learner import serve_calls as worker

    clients: dict[int, socket.socket | None] = {}  # pid -> the connection that asked (None: hung up)
    pending: list[socket.socket] = []  # connections whose request has not arrived whole
    buffers: dict[int, tuple[bytes, list[int]]] = {}

    def ended(pid, returncode):
        conn = clients.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{returncode}\n".encode())
            except OSError:
                pass
            conn.close()

    def fork(conn, request: dict, fds: list[int]) -> None:
        fd, log = fds
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                listener.close()
                os.close(parent_gone)
                for other in [*clients.values(), *pending, conn]:
                    if other is not None:
                        other.close()
                for _, others in buffers.values():  # descriptors of requests not yet whole
                    for other in others:
                        os.close(other)
                _quiet_stdio(log)
                os.close(log)
                os.environ.clear()
                os.environ.update(request["env"])
                os.chdir(ROOT)
                code = worker.run_file(fd, request["file"], request["module"], request["reference"])
            except BaseException:  # noqa: BLE001 - as an uncaught exception ends `python -m ...`
                traceback.print_exc()
            _child_exit(code)
        os.close(fd)  # the grader must see end of file on its socket when the child dies
        os.close(log)
        clients[pid] = conn
        conn.sendall(f"{pid}\n".encode())

    while True:
        running = {pid: c for pid, c in clients.items() if c is not None}
        readable, _, _ = select.select([listener, parent_gone, *pending, *running.values()], [], [], TICK_S)
        _reap(ended)
        if parent_gone in readable and not os.read(parent_gone, 1):
            break
        if listener in readable:
            conn, _ = listener.accept()
            pending.append(conn)
        for conn in [c for c in pending if c in readable]:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
            got, held = buffers.get(conn.fileno(), (b"", []))
            got, held = got + data, held + list(fds)
            if not data or (b"\n" in got and len(held) != 2):  # a client gone, or a malformed request
                pending.remove(conn)
                buffers.pop(conn.fileno(), None)
                for fd in held:
                    os.close(fd)
                conn.close()
            elif b"\n" in got:
                pending.remove(conn)
                buffers.pop(conn.fileno(), None)
                fork(conn, json.loads(got), held)
            else:
                buffers[conn.fileno()] = (got, held)
        for pid, conn in running.items():
            if conn in readable and clients.get(pid) is conn and not conn.recv(1):  # the grader hung up
                conn.close()
                clients[pid] = None
    for pid in list(clients):
        _kill(pid)
    _reap(lambda pid, code: None)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class ForkedProcess:
    """A learner process forked by the warm one, with what LearnerProcess uses of subprocess.Popen."""

    def __init__(self, conn: socket.socket, pid: int):
        self.conn, self.pid, self.returncode = conn, pid, None

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.conn], [], [], 0)[0]:
            self._read()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"learner process {self.pid}", timeout)
            self._read()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            _kill(self.pid)

    def _read(self) -> None:
        data = b""
        while not data.endswith(b"\n"):
            chunk = self.conn.recv(64)
            if not chunk:
                break
            data += chunk
        self.conn.close()
        # No returncode: the warm process itself is gone; the child was killed with it or will be.
        self.returncode = int(data) if data.strip() else -signal.SIGKILL


def start_learner_process(
    sock: socket.socket, log, file: str, module: str, reference: bool, env: dict
) -> ForkedProcess | None:
    """The learner's process for file, forked by the warm learner process when this grading has one
    (ZYGOTE_ENV); None otherwise, and the caller starts `python -m drills.grading.learner.serve_calls`
    itself."""
    path = os.environ.get(ZYGOTE_ENV)
    if not path:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        env = {k: v for k, v in env.items() if k != ZYGOTE_ENV}
        request = {"file": file, "module": module, "reference": reference, "env": env}
        socket.send_fds(conn, [json.dumps(request).encode() + b"\n"], [sock.fileno(), log.fileno()])
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(64)
            if not chunk:
                raise OSError("the warm learner process hung up")
            data += chunk
    except OSError:
        conn.close()
        return None  # start it the usual way
    return ForkedProcess(conn, int(data))


def serve_learners_alone(path: str) -> int:
    """`python -m drills.grading.grader.fork_server --learners PATH`: the warm learner process on its own,
    for one `make test` (start_warm_learner). The socket is bound before the imports, so a grader that asks
    early waits for them instead of starting a process of its own; ends (its children killed) at end of
    file on stdin, when the grading that started it ends."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    from drills.grading.learner import serve_calls as worker

    worker.prepare()
    gc.freeze()
    serve_learner_processes(listener, 0)
    return 0


def start_warm_learner() -> tuple[subprocess.Popen, dict] | None:
    """For one grading in a fresh pytest (`make test`): the warm learner process, started now so that its
    imports (torch, Triton, the interpreter's patches: about 3 s) run while pytest starts and collects,
    instead of after. Returns (the process, the environment that points the grading at it), or None where
    gradings are not forked (`unavailable`). The learner's process is then forked from it, exactly as in
    `make mutants`; the caller closes its stdin when the grading ends."""
    from drills.grading.shared.env import child_env

    if unavailable() is not None:
        return None
    folder = tempfile.mkdtemp(prefix="drills-warm-")
    path = os.path.join(folder, "learner.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "drills.grading.grader.fork_server", "--learners", path],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    process_tree.OWN.add(proc.pid)  # not a stray of the grading (process_tree.end_strays)
    return proc, {**child_env(), ZYGOTE_ENV: path}


def end_warm_process(proc: subprocess.Popen, timeout: float) -> None:
    """End a warm process this module started: closing its stdin asks it to stop (its children end with
    it); killed if it has not within timeout seconds."""
    try:
        proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    process_tree.OWN.discard(proc.pid)


def stop_warm_learner(proc: subprocess.Popen, env: dict) -> None:
    """End the process start_warm_learner started (its children with it) and remove its socket."""
    end_warm_process(proc, 10)
    path = env[ZYGOTE_ENV]
    for leftover in (path, os.path.dirname(path)):
        try:
            (os.unlink if leftover == path else os.rmdir)(leftover)
        except OSError:
            pass


# --- Gradings, forked from a warm pytest process ------------------------------------------------


def serve_gradings() -> int:
    """`python -m drills.grading.grader.fork_server`: fork the warm learner process, import pytest, then for
    each line {"id", "args", "env", "output"} on stdin fork a child running pytest.main(args) in that
    environment, with its output in the file output. Writes {"id", "pid"} when a child starts and {"id",
    "returncode"} when it ends. Ends (its children killed) at end of file on stdin."""
    from drills.grading.learner import serve_calls as worker

    worker.prepare()
    folder = tempfile.mkdtemp(prefix="drills-warm-")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, "learner.sock"))
    listener.listen(16)
    gone_read, gone_write = os.pipe()
    zygote = os.fork()
    if zygote == 0:
        code = 1
        try:
            os.close(gone_write)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)  # stdout is the channel to the pool: nothing of this process goes there
            os.close(devnull)
            gc.freeze()
            serve_learner_processes(listener, gone_read)
            code = 0
        except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: every process ends
            pass
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        _child_exit(code)
    os.close(gone_read)
    listener.close()
    os.environ[ZYGOTE_ENV] = os.path.join(folder, "learner.sock")

    # What every grading imports before its test file, once, here; not pytest's plugins from other
    # packages nor the grader's test files, which pytest imports itself to rewrite their asserts.
    import asyncio  # noqa: F401  (for anyio's pytest plugin)
    import importlib

    import _pytest.config
    import pytest  # noqa: F401

    # What the graders' shared helpers (drills/tests) import; the helpers themselves are the graders'
    # side, which grading never imports.
    import drills.compare  # noqa: F401
    import drills.grading.shared.bigmem  # noqa: F401
    import drills.grading.shared.seed_streams  # noqa: F401

    for name in _pytest.config.default_plugins:
        importlib.import_module(f"_pytest.{name}")
    gc.freeze()  # what is here now is never garbage: a child's collections skip it

    children: dict[int, int] = {}  # pid -> request id
    out = sys.stdout

    def say(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    def ended(pid, returncode):
        if pid in children:
            say({"id": children.pop(pid), "returncode": returncode})

    buffer = b""
    while True:
        readable, _, _ = select.select([0], [], [], TICK_S)
        _reap(ended)
        if not readable:
            continue
        data = os.read(0, 1 << 16)
        if not data:
            break
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    fd = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    _quiet_stdio(fd)
                    os.close(fd)
                    os.close(gone_write)
                    os.environ.clear()
                    os.environ.update(request["env"], **{ZYGOTE_ENV: os.path.join(folder, "learner.sock")})
                    import pytest

                    code = int(pytest.main(request["args"]))
                except BaseException:  # noqa: BLE001
                    traceback.print_exc()
                _child_exit(code)
            children[pid] = request["id"]
            say({"id": request["id"], "pid": pid})
    for pid in list(children):
        _kill(pid)
    _reap(lambda pid, code: None)
    os.close(gone_write)  # the warm learner process ends, and kills what it still runs
    try:
        os.waitpid(zygote, 0)
    except ChildProcessError:
        pass
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)
    return 0


class GradingPool:
    """Runs `python -m pytest ARGS` for drills.grading.grader.pytest_run.grade as forks of one warm process.
    Safe to call from several threads: each call waits for its own grading."""

    def __init__(self):
        from drills.grading.shared.env import child_env

        self.folder = tempfile.TemporaryDirectory(prefix="drills-pool-")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "drills.grading.grader.fork_server"],
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        process_tree.OWN.add(self.proc.pid)  # not a stray of some grading (process_tree.end_strays)
        self.lock = threading.Lock()
        self.gone = False  # the warm process ended: every grading asked of it fails at once
        self.next_id = 0
        self.waiting: dict[int, dict] = {}  # id -> {"done": Event, "pid": ..., "returncode": ...}
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.lock:
                entry = self.waiting.get(message["id"])
            if entry is None:
                continue
            entry.update(message)
            if "returncode" in message:
                entry["done"].set()
        with self.lock:  # the warm process is gone: nothing more will end
            self.gone = True
            for entry in self.waiting.values():
                entry["done"].set()

    def run(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        """pytest.main(args) in a fresh fork, in the environment a fresh `python -m pytest` would get
        now; its output (stdout and stderr) comes back as stdout. Raises subprocess.TimeoutExpired past
        timeout, as subprocess.run does, the child killed."""
        from drills.grading.shared.env import child_env

        with self.lock:
            n = self.next_id = self.next_id + 1
            output = Path(self.folder.name) / f"{n}.out"
            entry = self.waiting[n] = {"done": threading.Event()}
            request = {"id": n, "args": args, "env": child_env(), "output": str(output)}
            try:
                self.proc.stdin.write(json.dumps(request).encode() + b"\n")
                self.proc.stdin.flush()
            except OSError:  # the warm process is gone
                self.gone = True
            if self.gone:
                entry["done"].set()
        try:
            if not entry["done"].wait(timeout):
                if "pid" in entry:
                    _kill(entry["pid"])
                raise subprocess.TimeoutExpired(args, timeout)
            text = output.read_text(errors="replace") if output.exists() else ""
            if "returncode" not in entry:
                text += "\nthe warm grading process (drills.grading.grader.fork_server) ended before this grading did"
            return subprocess.CompletedProcess(args, entry.get("returncode", 1), text, "")
        finally:
            with self.lock:
                self.waiting.pop(n, None)
            output.unlink(missing_ok=True)

    def close(self) -> None:
        end_warm_process(self.proc, 30)
        self.folder.cleanup()

    def __enter__(self) -> GradingPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    try:
        if sys.argv[1:2] == ["--learners"]:
            sys.exit(serve_learners_alone(sys.argv[2]))
        sys.exit(serve_gradings())
    except KeyboardInterrupt:  # Ctrl-C during make mutants: the pool and the gradings end too
        sys.exit(130)
