"""The grader's side of the learner's process: start it, call into it, survive it.

`LearnerProcess(path, module_name)` starts `python -m drills.grading.worker` on the learner's file and
returns `module`, a RemoteObject that tests use exactly like the module itself (impl.paged_decode(...),
impl.Kernel[grid](...), impl.BlockManager(...).allocate(...)). Every failure of the learner's code
arrives here as an exception the grader can report:

  the learner's own exception   re-raised as the same built-in class (ValueError, TypeError, ...),
                                with `drills_where` = "file:line" and `drills_code` = that line
  OutOfBoundsAccess             a kernel load or store outside its tensors (interpreter)
  WriteRace                     programs visited in reverse gave another result (interpreter)
  NotFromKernel                 with every launch disabled the result did not change
  LearnerCrash                  the process died (a segfault, os._exit, a CUDA fault); restarted
  LearnerTimeout                a call ran past its time limit; the process is killed and restarted
  LearnerError                  any other exception (a Triton compile error, a class of the learner's)
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

from drills.grading import warm, wire
from drills.grading.worker import STACK_SIGNAL
from drills.lessons import ROOT

CALL_TIMEOUT_ENV = "DRILLS_CALL_TIMEOUT"  # seconds one call may run (default below)
DEFAULT_CALL_TIMEOUT_S = 120.0
START_TIMEOUT_S = 120.0
AFTER_TIMEOUT_S = 15.0  # the limit of each call once one has timed out (a CPU check takes a few seconds)
MAX_TIMEOUTS = 3  # after this many, the remaining calls fail at once
LOG_TAIL_LINES = 6


class LearnerFailure(AssertionError):
    """A failure of the learner's code that is not an exception it raised itself."""

    kind = "failure"


class OutOfBoundsAccess(LearnerFailure):
    kind = "out_of_bounds"


class WriteRace(LearnerFailure):
    kind = "write_race"


class NotFromKernel(LearnerFailure):
    kind = "not_from_kernel"


class LearnerCrash(LearnerFailure):
    kind = "crash"


class LearnerTimeout(LearnerFailure):
    kind = "timeout"


class LearnerError(Exception):
    """An exception of a class that is not built in (a Triton compile error, the learner's own class)."""

    kind = "exception"


class ImportFailed(Exception):
    """The learner's file does not import; `info` says how."""

    def __init__(self, info: dict):
        super().__init__(info.get("message", ""))
        self.info = info


def child_env() -> dict:
    """The environment of a process the grader starts: the repository importable, and one thread per
    math library (OpenMP, OpenBLAS, MKL). The grader and the learner's process take turns, and the
    tensors of a check are small: a second thread per library gains nothing, while idle OpenMP threads
    spin on the cores the other process needs (a T5 grading took 3.5x the CPU time on 2 cores)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def call_timeout() -> float:
    try:
        return float(os.environ.get(CALL_TIMEOUT_ENV, "") or DEFAULT_CALL_TIMEOUT_S)
    except ValueError:
        return DEFAULT_CALL_TIMEOUT_S


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
    cls = {"out_of_bounds": OutOfBoundsAccess, "write_race": WriteRace, "not_from_kernel": NotFromKernel}.get(
        kind
    )
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
    exc.drills_where, exc.drills_code, exc.drills_type = where, code, info.get("type")
    return exc


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
        self.pending_release: list[int] = []
        self.options: dict = {"orders": True, "provenance": False}
        self.ready: dict = {}
        self.log = tempfile.NamedTemporaryFile(prefix="drills-learner-", suffix=".log", delete=False)
        self.timeouts: list[str] = []  # the messages of the calls that timed out, in order
        self.module = RemoteModule(self)

    # --- the process ---------------------------------------------------------------------------
    def start(self) -> dict:
        """Start the process and wait until the file is imported. Raises ImportFailed or LearnerCrash."""
        self.stop()
        parent, child = socket.socketpair()
        env = child_env()
        cmd = [
            sys.executable,
            "-m",
            "drills.grading.worker",
            str(child.fileno()),
            self.path,
            self.module_name,
        ]
        if self.reference:
            cmd.append("--reference")
        self.log.seek(0)
        self.log.truncate()
        # Forked from a warm process when make mutants runs one (drills/grading/warm.py), else started.
        self.proc = warm.start_learner_process(
            child, self.log, self.path, self.module_name, self.reference, env
        ) or subprocess.Popen(
            cmd,
            pass_fds=(child.fileno(),),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
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
                self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None

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
        try:
            value = getattr(target, name)
            if callable(value) and getattr(value, "__self__", None) is target:
                value = self.lent_methods.setdefault((key, name), value)
                self.callbacks[id(value)] = value
                self.lent.add(id(value))
                reply = ("method", value)
            else:
                reply = ("result", value)
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
        keys, self.pending_release = self.pending_release, []  # handles dropped since the last request
        self._send((*message, keys), during)
        return self._reply(during)

    def _send(self, message, during):
        try:
            self.conn.send_bytes(wire.dumps(message, self.known, self._handle))
        except (OSError, EOFError):
            raise self._died(during) from None

    def _reply(self, during):
        # After an endless loop, the next calls get a shorter limit: the grading still reports what else
        # passes, without waiting the full limit once per check.
        limit = call_timeout() if not self.timeouts else min(call_timeout(), AFTER_TIMEOUT_S)
        reply = self._wait(limit, during)
        kind, value, updates = reply
        self.known.write_back(updates)
        if kind == "error":
            raise _rebuild_error(value)
        return value

    def _handle(self, obj):
        if isinstance(obj, RemoteObject):
            if obj._generation != self.generation:
                raise LearnerCrash("this object came from a run of your file that crashed or was restarted")
            return ("R", obj._key)
        if isinstance(obj, wire.Lent):
            key = id(obj.obj)
            self.callbacks[key] = obj.obj  # kept alive (and its key unique) as long as this process
            self.lent.add(key)
            return ("L", key)
        if callable(obj) and not wire.is_plain(obj) and not isinstance(obj, type):
            key = id(obj)
            self.callbacks[key] = obj
            return ("C", key)
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
        from drills.grading.launches import Launch, Launches

        launches = Launches()
        self.request("record", True)
        try:
            yield launches
        finally:
            if self.alive():
                for module, name, grid, constexprs in self.request("record", False):
                    launches.calls.append(Launch(module, name, tuple(grid), dict(constexprs)))

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


class RemoteObject:
    """Something that lives in the learner's process: a function, a kernel, a class, an instance."""

    __slots__ = ("_proc", "_key", "_kind", "_typename", "_generation", "__weakref__")

    def __init__(self, proc: LearnerProcess, key: int, kind: str, typename: str):
        object.__setattr__(self, "_proc", proc)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_typename", typename)
        object.__setattr__(self, "_generation", proc.generation)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._proc.request("getattr", self, name)

    def __setattr__(self, name, value):
        self._proc.request("op", self, "setattr", (name, value))

    def __call__(self, *args, **kwargs):
        return self._proc.request("call", self, args, kwargs, dict(self._proc.options))

    def _op(self, name, *args):
        return self._proc.request("op", self, name, args)

    def __getitem__(self, key):
        return self._op("getitem", key)

    def __setitem__(self, key, value):
        return self._op("setitem", key, value)

    def __len__(self):
        return self._op("len")

    def __iter__(self):
        return iter(self._op("iter"))

    def __contains__(self, item):
        return self._op("contains", item)

    def __bool__(self):
        return self._op("bool")

    def __eq__(self, other):
        return self._op("eq", other)

    def __ne__(self, other):
        return self._op("ne", other)

    def __lt__(self, other):
        return self._op("lt", other)

    def __le__(self, other):
        return self._op("le", other)

    def __gt__(self, other):
        return self._op("gt", other)

    def __ge__(self, other):
        return self._op("ge", other)

    def __hash__(self):
        return self._op("hash")

    def __repr__(self):
        try:
            return self._op("repr")
        except Exception:
            return f"<{self._typename} in the learner's process>"

    def __str__(self):
        return self._op("str")

    def __del__(self):
        try:
            if self._key != 0 and self._generation == self._proc.generation:
                self._proc.pending_release.append(self._key)
        except Exception:
            pass


class RemoteMethod:
    """A method of an object in the learner's process, called by name (no handle of its own)."""

    def __init__(self, proc: LearnerProcess, key: int, name: str):
        self._proc, self._key, self._name, self._generation = proc, key, name, proc.generation

    def __call__(self, *args, **kwargs):
        proc = self._proc
        if self._generation != proc.generation:
            raise LearnerCrash("this method belongs to a run of your file that crashed or was restarted")
        return proc.request("method", self._key, self._name, args, kwargs, dict(proc.options))

    def __repr__(self):
        return f"<method {self._name} in the learner's process>"


class RemoteModule(RemoteObject):
    """The learner's module (handle 0 in its process)."""

    __slots__ = ()

    def __init__(self, proc: LearnerProcess):
        super().__init__(proc, 0, "module", "module")

    @property
    def __name__(self):
        return self._proc.module_name

    def _drills_record_launches(self):
        return self._proc.record_launches()

    def _drills_probe(self, fn, *args, **kwargs):
        self._current()  # a probe may be the first request of a check (the module is sent as its argument)
        return self._proc.probe(fn, self, *args, **kwargs)

    def _drills_calling(self, **options):
        return self._proc.calling(**options)

    def _current(self):
        """The module handle stays valid across restarts of the process (it is handle 0 in every run)."""
        proc = self._proc
        proc.ensure()
        object.__setattr__(self, "_generation", proc.generation)
        return proc

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._current().request("getattr", self, name)

    def __repr__(self):
        return f"<learner module {self._proc.module_name} from {self._proc.path}>"
