"""The grader's side of the learner's process: start it, call into it, survive it.

`LearnerProcess(path, module_name)` starts `python -m drills.grading.learner.serve_calls` on the
learner's file, in a session of its own (process_tree.py), and returns `module`, a RemoteModule
(remote_objects.py) that tests use exactly like the module itself. Every failure of the learner's code
arrives here as an exception of errors.py's table, and the result of a call made with `provenance` is
judged here (provenance.judge) from the evidence that comes with it.
"""

from __future__ import annotations

import builtins
import contextlib
import linecache
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from drills.grading.grader import fork_server, left_files, process_tree, provenance
from drills.grading.grader.remote_objects import RemoteMethod, RemoteModule, RemoteObject
from drills.grading.shared import bigmem, wire
from drills.grading.shared.env import (
    AFTER_TIMEOUT_S,
    MAX_TIMEOUTS,
    STACK_SIGNAL,
    START_TIMEOUT_S,
    call_timeout,
    child_env,
)
from drills.grading.shared.errors import (  # noqa: F401  (ImportFailed and LearnerFailure: the plugin's names)
    BY_KIND,
    ImportFailed,
    LearnerCrash,
    LearnerError,
    LearnerFailure,
    LearnerTimeout,
    NotFromKernel,
)
from drills.lessons import ROOT

LOG_TAIL_LINES = 6


_SIGNALS = {
    signal.SIGSEGV: "a segmentation fault",
    signal.SIGABRT: "an abort",
    signal.SIGBUS: "a bus error",
    signal.SIGKILL: "killed (out of memory?)",
    signal.SIGFPE: "a floating-point exception",
}


def _rebuild_error(info: dict) -> BaseException:
    kind, message = info.get("kind"), info.get("message", "")
    where, code = info.get("where"), info.get("code")
    cls = BY_KIND.get(kind)
    if cls is not None:
        exc = cls(message)
    elif (
        info.get("builtin")
        and isinstance(getattr(builtins, info.get("type", ""), None), type)
        and issubclass(getattr(builtins, info["type"]), Exception)
    ):
        exc_type = getattr(builtins, info["type"])
        try:
            exc = exc_type(*info.get("args", (message,)))
        except Exception:
            exc = LearnerError(f"{info['type']}: {message}")
    else:
        place = f" at {where} (`{code}`)" if where else ""
        exc = LearnerError(f"your code raised {info.get('type')}{place}: {message}")
    # Where it was raised travels as attributes, not in the message or a note: `pytest.raises(match=...)`
    # searches notes too, and the learner's line of code must not satisfy a check on the message.
    exc.drills_where, exc.drills_code = where, code
    return exc


def _names_of(fn) -> tuple[str, str, str]:
    """(module, qualname, name) of a callable of the grader's, for the function that stands for it."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    qualname = getattr(fn, "__qualname__", None) or name
    module = getattr(fn, "__module__", None) or type(fn).__module__
    return (str(module), str(qualname), str(name))


class LearnerProcess:
    """One learner file served by a child process, restarted after a crash or a timeout."""

    def __init__(self, path: str | Path, module_name: str, reference: bool = False):
        self.path = str(Path(path).resolve())
        self.module_name = module_name
        self.reference = reference
        self.proc: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.generation = 0  # bumped on every restart: handles from a dead process are invalid
        self.known = wire.Storages()
        self.callbacks: dict[int, object] = {}
        self.lent: set[int] = set()  # keys of callbacks that are wire.Lent objects or their methods
        self.lent_methods: dict[tuple[int, str], object] = {}  # (key, name) -> the bound method handed out
        self.lent_like: dict[int, object] = {}  # key -> the object a lent one poses as (wire.Lent's like)
        self.lent_module: dict[int, str | None] = {}  # key -> the module its class says (wire.Lent's module)
        self.pending_release: list[int] = []
        self.options: dict = {"orders": True, "provenance": False}
        self.loads_targets: list | None = None  # the tensors whose loads record_loads watches
        self.ready: dict = {}
        self.log = tempfile.NamedTemporaryFile(prefix="drills-learner-", suffix=".log", delete=False)
        self.timeouts: list[str] = []  # the messages of the calls that timed out, in order
        self.module = RemoteModule(self)
        # The learner's folder as it was before its first grading: what a grading adds there is removed
        # when its process stops (left_files.remove_new_files), the learner's own files never.
        # A folder other programs share (/tmp itself) is never swept: see left_files.sweepable.
        folder = os.path.dirname(self.path)
        self.folder = None if reference or not left_files.sweepable(folder) else folder
        self.folder_before = left_files.folder_files(self.folder) if self.folder else set()

    # --- the process ---------------------------------------------------------------------------
    def start(self) -> dict:
        """Start the process and wait until the file is imported. Raises ImportFailed or LearnerCrash."""
        self.stop()
        # The folder of the sparse files this process will lend (bigmem.py) exists before the learner's
        # process builds its sandbox: Landlock allows the entries of a folder on the way to the
        # repository as they are then, so with the repository under /tmp a folder made later in /tmp
        # could not be opened there.
        bigmem.sparse_folder()
        parent, child = socket.socketpair()
        env = child_env()
        cmd = [
            sys.executable,
            "-m",
            "drills.grading.learner.serve_calls",
            str(child.fileno()),
            self.path,
            self.module_name,
        ]
        if self.reference:
            cmd.append("--reference")
        self.log.seek(0)
        self.log.truncate()
        # Forked from a warm process when make mutants runs one (fork_server.py), else started.
        self.proc = fork_server.start_learner_process(
            child, self.log, self.path, self.module_name, self.reference, env
        ) or subprocess.Popen(
            cmd,
            pass_fds=(child.fileno(),),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # what it starts is ended with it (process_tree.end_tree)
        )
        child.close()
        self.conn = Connection(parent.detach())
        self.generation += 1
        self.known = wire.Storages()
        self.pending_release = []
        message = self._wait(START_TIMEOUT_S, during="while importing your file")
        if message[0] == "import_error":
            info = message[1]
            self.stop()
            raise ImportFailed(info)
        # Imported; the worker now calls the public functions with None arguments, as the stub contract
        # does, to see whether the lesson is started (an untouched stub raises NotImplementedError).
        message = self._wait(
            START_TIMEOUT_S,
            during="while your functions were called with None arguments "
            "to see whether the lesson is started",
        )
        self.ready = message[1]
        return self.ready

    def stop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
            self.conn = None
        if self.proc is not None:
            if self.proc.poll() is None:
                process_tree.end_tree(self.proc.pid)
                self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        if self.folder:
            left_files.remove_new_files(self.folder, self.folder_before)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.conn is not None

    def ensure(self) -> None:
        if not self.alive():
            self.start()

    def log_tail(self) -> str:
        try:
            lines = Path(self.log.name).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        keep = [line for line in lines if line.strip()][-LOG_TAIL_LINES:]
        return "\n".join(keep)

    def _stack_line(self) -> str:
        """Where the learner's file is stuck: asks the process for its Python stack (faulthandler, set up
        by the worker) and returns ', in FILE line N: `source`' for the innermost frame of the graded file,
        or '' when it cannot tell (the process is in C code that does not return to Python, or gone)."""
        if self.proc is None or self.proc.poll() is not None:
            return ""
        size = os.path.getsize(self.log.name) if os.path.exists(self.log.name) else 0
        try:
            os.kill(self.proc.pid, STACK_SIGNAL)
        except OSError:
            return ""
        pattern = re.compile(r'File "(.+)", line (\d+) in (\S+)')
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                with open(self.log.name, errors="replace") as f:
                    f.seek(size)
                    dump = f.read()
            except OSError:
                return ""
            frames = [m.groups() for m in pattern.finditer(dump)]
            if frames and "most recent call first" in dump:
                for name, line, func in frames:  # faulthandler lists the innermost frame first
                    if os.path.realpath(name) == os.path.realpath(self.path):
                        source = linecache.getline(name, int(line)).strip()
                        return f", in {os.path.relpath(name, ROOT)} line {line} ({func}): `{source}`"
                return ""
        return ""

    def _died(self, during: str) -> LearnerCrash:
        code = None
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        tail = self.log_tail()
        self.stop()
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            how = f"{name}, {_SIGNALS.get(-code, 'a fatal signal')}"
            likely = (
                "; an out-of-bounds load or store is the usual cause"
                if -code in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT)
                else ""
            )
        else:
            how = f"exit status {code}"
            likely = "; os._exit() or sys.exit() in your file?"
        text = f"your code ended the process that runs it {during} ({how}){likely}"
        if tail:
            text += "\nits last output:\n" + tail
        return LearnerCrash(text)

    def _wait(self, timeout: float, during: str):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                ready = self.conn.poll(max(0.0, left))
            except (OSError, EOFError):
                raise self._died(during) from None
            if not ready:
                where = self._stack_line()
                self.stop()
                self.timeouts.append(
                    f"your code did not return within {timeout:.0f} s {during} (an endless "
                    f"loop? a loop bound that never grows?){where}; the process was stopped"
                )
                raise LearnerTimeout(self.timeouts[-1])
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError):
                raise self._died(during) from None
            message = wire.loads(data, self.known, self._resolve)
            if message[0] == "callback":
                self._run_callback(message)
                continue
            if message[0] == "callback_getattr":
                self._run_getattr(message)
                continue
            if message[0] == "callback_new":
                self._run_new(message)
                continue
            return message

    def _run_callback(self, message) -> None:
        _, key, args, kwargs = message
        try:
            value = ("result", self.callbacks[key](*args, **kwargs))
        except Exception as exc:  # the grader's own callable failed: say so in the learner's process
            value = self._lent_error(exc) if key in self.lent else ("error", f"{type(exc).__name__}: {exc}")
        self.conn.send_bytes(wire.dumps(value, self.known, self._handle))

    def _run_getattr(self, message) -> None:
        """An attribute of a lent object, read by the learner's code: a method goes back as a callback
        (the same one for every read of that name), anything else by value."""
        _, key, name = message
        target = self.callbacks[key]
        like = self.lent_like.get(key, target)
        try:
            # Only the names the object it poses as has (a recording wrapper's own, `events`, raise that
            # object's AttributeError); the wrapper answers those it wraps, the object the rest.
            if not hasattr(like, name):
                getattr(like, name)
            value = getattr(target if hasattr(target, name) else like, name)
            if callable(value) and not isinstance(value, type) and not wire.is_plain(value):
                # A method or a function (never pickled: a reference's function would not import there)
                bound = getattr(value, "__self__", None) in (target, like)
                value = self.lent_methods.setdefault((key, name), value)
                self.callbacks[id(value)] = value
                self.lent.add(id(value))
                reply = ("method" if bound else "function", value)
            else:
                reply = ("result", value)
        except Exception as exc:
            reply = self._lent_error(exc)
        self.conn.send_bytes(wire.dumps(reply, self.known, self._handle))

    def _run_new(self, message) -> None:
        """The learner's code called a lent object's class: a new object of the real class, lent too."""
        _, key, args, kwargs = message
        try:
            reply = (
                "result",
                wire.Lent(
                    type(self.lent_like.get(key, self.callbacks[key]))(*args, **kwargs),
                    module=self.lent_module.get(key),
                ),
            )
        except Exception as exc:
            reply = self._lent_error(exc)
        self.conn.send_bytes(wire.dumps(reply, self.known, self._handle))

    @staticmethod
    def _lent_error(exc: Exception):
        """A lent object's exception as the learner's process re-raises it: a built-in class as itself."""
        if type(exc).__module__ == "builtins" and all(wire.is_plain(a) for a in exc.args):
            return ("raise", (type(exc).__name__, exc.args))
        return ("error", f"{type(exc).__name__}: {exc}")

    # --- requests ------------------------------------------------------------------------------
    def request(self, *message, during: str = "during this check"):
        if len(self.timeouts) >= MAX_TIMEOUTS:  # each would wait its limit: stop here, say why
            raise LearnerTimeout(
                f"not run: {len(self.timeouts)} calls timed out already; the first: {self.timeouts[0]}"
            )
        self.ensure()
        if self.loads_targets and message[0] in ("call", "method") and isinstance(message[-1], dict):
            # record_loads: which of this call's tensors hold the storages watched (by the storage, so that a
            # view of the tensor watched counts as it)
            tensors = wire.tensors_in([message[-3], message[-2]])
            ptrs = [t.untyped_storage().data_ptr() for t in tensors]
            watched = [t.untyped_storage().data_ptr() for t in self.loads_targets]
            message[-1]["loads_of"] = [ptrs.index(w) if w in ptrs else -1 for w in watched]
        keys, self.pending_release = self.pending_release, []  # handles dropped since the last request
        self._send((*message, keys), during)
        # A call made with provenance must come back with its evidence: a learner's process that drops it
        # (its call runner patched) has its result refused, not waved through.
        wants = (
            message[0] in ("call", "method")
            and isinstance(message[-1], dict)
            and message[-1].get("provenance")
        )
        return self._reply(during, wants_evidence=bool(wants))

    def _send(self, message, during):
        try:
            self.conn.send_bytes(wire.dumps(message, self.known, self._handle))
        except (OSError, EOFError):
            raise self._died(during) from None

    def _reply(self, during, wants_evidence: bool = False):
        # After an endless loop, the next calls get a shorter limit: the grading still reports what else
        # passes, without waiting the full limit once per check.
        limit = call_timeout() if not self.timeouts else min(call_timeout(), AFTER_TIMEOUT_S)
        reply = self._wait(limit, during)
        kind, value, updates, *evidence = reply
        self.known.write_back(updates)
        if kind == "error":
            raise _rebuild_error(value)
        if evidence and evidence[0] is not None:
            provenance.judge(wire.tensors_in(value), evidence[0])
        elif wants_evidence:
            raise NotFromKernel(
                "the output could not be traced to your kernel: the call came back without the record of "
                "its launches that the grader asked for (has your file changed the grader's code in its process?)"
            )
        return value

    def _handle(self, obj):
        if isinstance(obj, RemoteObject):
            if obj._generation != self.generation:
                raise LearnerCrash("this object came from a run of your file that crashed or was restarted")
            return ("R", obj._key)
        if isinstance(obj, wire.Lent):
            key = id(obj.obj)
            self.callbacks[key] = obj.obj  # kept alive (and its key unique) as long as this process
            self.lent_like[key] = obj.like
            self.lent_module[key] = obj.module
            self.lent.add(key)
            return ("L", key, wire.class_view(type(obj.like), obj.module))
        if callable(obj) and not wire.is_plain(obj) and not isinstance(obj, type):
            key = id(obj)
            self.callbacks[key] = obj
            # Its names travel, so that the learner's process holds a plain function named as it is
            return ("C", key, _names_of(obj))
        return None

    def _resolve(self, pid):
        if pid[0] == "R":
            _, key, kind, typename = pid
            return RemoteObject(self, key, kind, typename)
        if pid[0] == "M":
            _, key, name = pid
            return RemoteMethod(self, key, name)
        if pid[0] == "L":  # a lent object coming back: the grader's own object
            return self.callbacks[pid[1]]
        raise ValueError(f"unknown reference {pid!r}")

    @contextlib.contextmanager
    def calling(self, **options):
        """Options for the calls inside the block: orders=False, provenance=True."""
        saved = dict(self.options)
        self.options.update(options)
        try:
            yield
        finally:
            self.options = saved

    @contextlib.contextmanager
    def record_launches(self):
        from drills.grading.shared.launches import Launch, Launches

        launches = Launches()
        self.request("record", True)
        try:
            yield launches
        finally:
            if self.alive():
                for module, name, grid, constexprs in self.request("record", False):
                    launches.calls.append(Launch(module, name, tuple(grid), dict(constexprs)))

    @contextlib.contextmanager
    def record_loads(self, tensors):
        from drills.grading.shared.launches import Load, Loads

        loads = Loads(list(tensors))
        self.loads_targets = list(tensors)
        self.request("loads", True)
        try:
            yield loads
        finally:
            self.loads_targets = None
            if self.alive():
                for launch, target, program, offsets, active in self.request("loads", False):
                    loads.loads.append(Load(launch, target, tuple(program), offsets, active))

    def probe(self, fn, *args, **kwargs):
        """Run fn (a module-level function of a drills.tests module) in the learner's process, where the
        learner's objects live, and return its (plain) result: for checks that make thousands of calls.
        The grader must still judge the result: the learner's process could fake a probe's answer only by
        computing the right one."""
        module = fn.__module__
        if not module.startswith("drills.tests."):
            raise ValueError(f"a probe must be defined in a drills.tests module, not {module}")
        return self.request("probe", module, fn.__qualname__, args, kwargs)

    def close(self) -> None:
        self.stop()
        try:
            self.log.close()
            os.unlink(self.log.name)
        except OSError:
            pass
