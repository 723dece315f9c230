"""The learner's process: imports only the learner's file and serves what the grader asks of it.

Started by drills/grading/grader/learner_client.py as
`python -m drills.grading.learner.serve_calls FD FILE MODULE [--reference]` (or, for make mutants, forked by
drills/grading/grader/fork_server.py from a process that ran `prepare()`), it talks to the grader over the
socket FD (messages in drills/grading/shared/wire.py). The grader's oracle, comparisons, provenance decisions
and report live in the other process, out of this file's reach. Before the learner's file is imported: the
sandbox (sandbox.py), Triton's instrumentation (instrument.py) and poisoned empties. Each call runs through
run_call.run_call, which sends back, beside the result, the evidence the grader judges provenance from.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import sys
import traceback
import types

from drills.grading.learner.instrument import _relative, fresh_memory
from drills.grading.learner.run_call import run_call
from drills.grading.shared.bigmem import release_device_cache
from drills.grading.shared.env import STACK_SIGNAL
from drills.grading.shared.errors import RAISED_IN_KERNELS
from drills.grading.shared.launches import _kernel_classes

KERNEL_CLASSES = tuple(_kernel_classes())

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- The learner's line ----------------------------------------------------------------------------


def learner_frames(tb, graded_file: str) -> list[tuple[str, int, str]]:
    """(file, line number, source line) of every traceback frame in the learner's file."""
    graded = os.path.realpath(graded_file)
    found = []
    for frame, lineno in traceback.walk_tb(tb):
        name = frame.f_code.co_filename
        if name and os.path.realpath(name) == graded:
            found.append((name, lineno, linecache.getline(name, lineno).strip()))
    return found


def describe_error(exc: BaseException, graded_file: str) -> dict:
    """What the grader needs to re-raise and explain an exception from the learner's code."""
    chain, seen = [], set()
    e = exc
    while e is not None and id(e) not in seen:  # InterpreterError wraps the error raised in the kernel
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    root = next((c for c in chain if isinstance(c, RAISED_IN_KERNELS)), None)
    if root is None and type(exc).__name__ in ("InterpreterError",) and len(chain) > 1:
        root = chain[1]
    root = root or exc
    frames = []
    for c in chain:
        frames = learner_frames(c.__traceback__, graded_file) or frames
    where = getattr(root, "drills_where", None) or (frames[-1] if frames else None)
    kind = root.kind if isinstance(root, RAISED_IN_KERNELS) else "exception"
    message = str(root)
    if type(exc).__name__ == "CompilationError":
        kind, message = "compile_error", str(exc)
    from drills.grading.shared.wire import is_plain

    args = root.args if all(is_plain(a) for a in getattr(root, "args", ())) else (message,)
    return {
        "kind": kind,
        "args": args,
        "type": type(root).__name__,
        "builtin": type(root).__module__ == "builtins",
        "message": message,
        "where": f"{_relative(where[0])}:{where[1]}" if where else None,
        "code": where[2] if where else None,
    }


# --- The server ------------------------------------------------------------------------------------


class Server:
    def __init__(self, conn, graded_file: str, module_name: str):
        from drills.grading.shared import wire

        self.conn = conn
        self.wire = wire
        self.known = wire.Storages()
        self.objects: dict[int, object] = {}
        self.counts: dict[int, int] = {}
        self.lent: dict[int, LentObject] = {}  # the grader's lent objects, one proxy per key
        self.graded_file = graded_file
        self.module_name = module_name
        self.watch = None
        self.lines: set[int] | None = None  # lines of the graded file run since the last take, when traced

    # Encoding what goes back: plain values by value, the rest as handles kept here.
    def handle(self, obj):
        if self.wire.is_plain(obj) or (isinstance(obj, BaseException) and _by_value(type(obj))):
            return None
        if isinstance(obj, LentObject):
            return ("L", _LENT[id(obj)][1])
        bound_to = getattr(obj, "__self__", None)
        if (
            bound_to is not None
            and not isinstance(bound_to, type(sys))
            and callable(obj)
            and id(bound_to) in self.objects
            and getattr(obj, "__name__", None)
        ):
            # A method of an object the grader already holds: no handle of its own, called by name.
            return ("M", id(bound_to), obj.__name__)
        key = id(obj)
        self.objects[key] = obj
        self.counts[key] = self.counts.get(key, 0) + 1  # one per handle the grader holds
        kind = (
            "kernel"
            if isinstance(obj, KERNEL_CLASSES)  # Triton's own kernel classes, not anything with .fn and .run
            else "class"
            if isinstance(obj, type)
            else "callable"
            if callable(obj)
            else "object"
        )
        return ("R", key, kind, type(obj).__name__)

    def resolve(self, pid):
        if pid[0] == "R":
            return self.objects[pid[1]]
        if pid[0] == "M":
            return getattr(self.objects[pid[1]], pid[2])
        if pid[0] == "C":
            return _standing_function(Callback(self, pid[1]), *(pid[2] if len(pid) > 2 else ()))
        if pid[0] == "L":
            if pid[1] not in self.lent:
                proxy = object.__new__(_lent_class(self, pid[1], *pid[2:]))
                _LENT[id(proxy)] = (self, pid[1], {}, {})
                self.lent[pid[1]] = proxy  # kept: one proxy per key, for the process's life
            return self.lent[pid[1]]
        raise ValueError(f"unknown reference {pid!r}")

    def send(self, message):
        self.conn.send_bytes(self.wire.dumps(message, self.known, self.handle))

    def receive(self):
        return self.wire.loads(self.conn.recv_bytes(), self.known, self.resolve)

    def reply(self, value, evidence=None):
        updates = self.known.take_copies()
        self.send(("result", value, updates, evidence))

    def fail(self, exc):
        updates = self.known.take_copies()
        self.send(("error", describe_error(exc, self.graded_file), updates))

    def coverage(self, action: str):
        """ "start": trace the lines of the graded file that run from now on (kernels included: the
        interpreter runs them under the file's name and line numbers); "take": those lines since the
        last take, sorted. Only for references (make mutants' coverage map): tracing is slow."""
        if action == "start" and self.lines is None:
            self.lines = set()
            sys.settrace(_line_tracer(os.path.realpath(self.graded_file), self.lines))
            return None
        if action == "take":
            lines, self.lines = sorted(self.lines or ()), (set() if self.lines is not None else None)
            if self.lines is not None:
                sys.settrace(_line_tracer(os.path.realpath(self.graded_file), self.lines))
            return lines
        raise ValueError(f"unknown coverage action {action!r}")

    def serve(self, module):
        self.objects[0] = module
        while True:
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError):
                return
            releases = ()
            try:
                *request, releases = self.wire.loads(data, self.known, self.resolve)
                op = request[0]
                if op == "getattr":
                    _, target, name = request
                    self.reply(getattr(target, name))
                elif op == "call":
                    _, target, args, kwargs, options = request
                    with fresh_memory():  # poisoned through every run of the call (run_call.py)
                        answer = run_call(self.watch, target, args, kwargs, options)
                    self.reply(*answer)
                elif op == "method":
                    _, key, name, args, kwargs, options = request
                    method = getattr(self.objects[key], name)
                    with fresh_memory():
                        answer = run_call(self.watch, method, args, kwargs, options)
                    self.reply(*answer)
                elif op == "probe":
                    _, module_name, qualname, args, kwargs = request
                    self.reply(_probe(module_name, qualname)(*args, **kwargs))
                elif op == "op":
                    _, target, name, args = request
                    self.reply(_operate(target, name, args))
                elif op == "coverage":  # make mutants: which lines of the graded file the last check ran
                    _, action = request
                    self.reply(self.coverage(action))
                elif op == "loads":  # launches.record_loads: start afresh, or hand back what was seen
                    _, on = request
                    seen, self.watch.loads_seen = self.watch.loads_seen, []
                    self.reply(None if on else seen)
                elif op == "record":
                    _, on = request
                    if on:
                        self.watch.recording = []
                        self.reply(None)
                    else:
                        calls, self.watch.recording = self.watch.recording or [], None
                        self.reply([(c.module, c.name, c.grid, c.constexprs) for c in calls])
                else:
                    raise ValueError(f"unknown request {op!r}")
            except BaseException as exc:  # noqa: BLE001 - everything the learner's code raises goes back
                if isinstance(exc, KeyboardInterrupt) and _INTERRUPTED:
                    raise  # Ctrl-C: the whole grading stops, this process with it
                if isinstance(exc, SystemExit):
                    exc = RuntimeError(f"your code called sys.exit({exc.code!r}) while being graded")
                elif not isinstance(exc, Exception):  # a BaseException of the file's own, say
                    stop = RuntimeError(
                        f"your code raised {type(exc).__name__}, which is not an Exception (it stops "
                        "whatever runs it, as sys.exit does) while being graded"
                    )
                    stop.__cause__, exc = exc, stop  # where it was raised still names the learner's line
                self.fail(exc)
            finally:
                request = None
                for key in releases:
                    self.counts[key] = self.counts.get(key, 1) - 1
                    if key != 0 and self.counts[key] <= 0:
                        self.objects.pop(key, None)
                        self.counts.pop(key, None)
                releases = ()
                release_device_cache()  # what the call allocated on the GPU, once the grader let it go


_INTERRUPTED: list = []  # non-empty once a real SIGINT (Ctrl-C) reached this process


def _note_interrupt(signum, frame):
    """SIGINT's handler: Ctrl-C stops the grading as Python's default does, and is told apart from a
    KeyboardInterrupt the learner's code raises itself (which stops only its check)."""
    _INTERRUPTED.append(signum)
    raise KeyboardInterrupt


def _by_value(exc_type: type) -> bool:
    """An exception travels by value when the grader's process has its class (built-in, torch's, the
    harness's): unpickling one of the learner's classes there would call it, a handle of the learner's
    process, in the middle of reading the reply (its returned instance came back the same way, forever).
    Any other exception object the learner's code returns travels as a handle, like its other objects."""
    module = getattr(exc_type, "__module__", "") or ""
    return module == "builtins" or module.split(".")[0] == "torch" or module.startswith("drills.grading.")


def _line_tracer(graded: str, lines: set[int]):
    """A sys.settrace function that adds to `lines` every line of the file `graded` that runs."""
    mine: dict = {}  # code object -> whether it is the graded file's

    def local(frame, event, arg):
        if event == "line":
            lines.add(frame.f_lineno)
        return local

    def tracer(frame, event, arg):
        code = frame.f_code
        ours = mine.get(code)
        if ours is None:
            ours = mine[code] = bool(code.co_filename) and os.path.realpath(code.co_filename) == graded
        if not ours:
            return None
        lines.add(frame.f_lineno)
        return local

    return tracer


class Callback:
    """A callable of the grader's, called from the learner's code: the grader runs it."""

    def __init__(self, server: Server, key: int):
        self.server, self.key = server, key

    def __call__(self, *args, **kwargs):
        self.server.send(("callback", self.key, args, kwargs))
        return _callback_reply(*self.server.receive())


def _callback_reply(kind, value):
    if kind == "raise":  # a built-in exception of a lent object: the same class here
        import builtins

        name, args = value
        cls = getattr(builtins, name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            raise cls(*args)
        raise RuntimeError(f"the grader's object raised {name}: {args}")
    if kind == "error":
        raise RuntimeError(f"the grader's callback raised: {value}")
    return value


# The learner's code sees a lent object (wire.Lent) as the object it poses as: the proxy's class bears that
# class's name, module and members, its repr is object's, its methods are bound methods. What the proxy
# needs (the server, the key, the callbacks) is kept here, off the proxy, where no attribute reaches it.
_LENT: dict[int, tuple] = {}  # id(proxy) -> (server, key, {name: callback}, {name: container read})
_LENT_CLASSES: dict[tuple, type] = {}  # (module, qualname, members) -> the proxies' class
_CLASS_OF: dict[type, tuple] = {}  # the proxies' class -> (server, key of an object of it)


class LentObject:
    """An object the grader lent (wire.Lent): every attribute read asks the grader, which keeps the
    object; its methods are called there, other values come back by value. An attribute set here stays
    on the proxy (the grader's object is never written)."""

    def __new__(cls, *args, **kwargs):
        # Calling the class, as the real one builds a new object: the grader builds one and lends it
        server, key = _CLASS_OF[cls]
        server.send(("callback_new", key, args, kwargs))
        return _callback_reply(*server.receive())

    def __getattr__(self, name):
        if (name.startswith("__") and name.endswith("__")) or id(self) not in _LENT:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        server, key, _, _ = _LENT[id(self)]
        server.send(("callback_getattr", key, name))
        kind, value = server.receive()
        cls = type(self)
        if kind == "method":  # a callable of the object's own (not of its class): bound, as it would be
            return types.MethodType(
                _standing_function(value, cls.__module__, f"{cls.__qualname__}.{name}", name), self
            )
        if (
            kind == "function"
        ):  # a function it holds (a hash_fn): named as that function is, not as the attribute
            return value
        return _held(self, name, _callback_reply(kind, value))

    def __repr__(self):
        return f"<{type(self).__module__}.{type(self).__qualname__} object at {hex(id(self))}>"


def _held(proxy, name: str, value):
    """A container the lent object's attribute `name` holds (a list, a dict, a set) comes back by value,
    a new copy each read: the proxy hands out one object per name instead, refilled in place from each
    read and after each method call, so that it is the same object on every read, as the real object's
    own list is, and shows what the object holds now."""
    if not isinstance(value, (list, dict, set, bytearray)):
        return value
    held = _LENT[id(proxy)][3]
    old = held.get(name)
    if type(old) is not type(value):
        held[name] = value
        return value
    if isinstance(old, (dict, set)):
        old.clear()
        old.update(value)
    else:
        old[:] = value
    return old


def _lent_class(server: Server, key: int, view: tuple = ("builtins", "object", ())) -> type:
    """The class of the proxies of lent objects whose class has this (module, qualname, members)."""
    module, qualname, members = view
    known = (module, qualname, tuple((name, kind) for name, kind, _ in members))  # values may not hash
    if known not in _LENT_CLASSES:
        namespace = {"__module__": module, "__qualname__": qualname}
        for name, kind, value in members:
            if kind == "method":
                namespace[name] = _lent_method(module, qualname, name)
            elif kind == "property":
                namespace[name] = property(_lent_method(module, qualname, name, read=True))
            else:
                namespace[name] = value
        _LENT_CLASSES[known] = type(qualname.rsplit(".", 1)[-1], (LentObject,), namespace)
    cls = _LENT_CLASSES[known]
    _CLASS_OF.setdefault(cls, (server, key))
    return cls


def _lent_method(module: str, qualname: str, name: str, read: bool = False):
    """A method of the proxies' class: runs the lent object's method `name` in the grader (read: the
    getter of its property `name`)."""

    def method(self, *args, **kwargs):
        server, key, callbacks, held = _LENT[id(self)]
        if read or name not in callbacks:
            server.send(("callback_getattr", key, name))
            kind, value = server.receive()
            if read or kind not in ("method", "function"):
                return _held(self, name, _callback_reply(kind, value))
            callbacks[name] = value
        try:
            return callbacks[name](*args, **kwargs)
        finally:
            for attribute in list(held):  # the call may have changed them: as the real ones, in place
                server.send(("callback_getattr", key, attribute))
                kind, value = server.receive()
                if kind == "result":
                    _held(self, attribute, value)

    method.__name__, method.__qualname__, method.__module__ = name, f"{qualname}.{name}", module
    return method


def _standing_function(callback: Callback, module: str = "", qualname: str = "", name: str = ""):
    """A plain function that calls a callable of the grader's, named as that callable is."""

    def function(*args, **kwargs):
        return callback(*args, **kwargs)

    if name:
        function.__name__, function.__qualname__, function.__module__ = name, qualname, module
    return function


def _probe(module_name: str, qualname: str):
    """A grader function that runs here, next to the learner's objects (many calls, one round trip)."""
    import importlib

    if not module_name.startswith("drills.tests."):
        raise PermissionError(f"probes come from drills.tests only, not {module_name}")
    fn = importlib.import_module(module_name)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    return fn


def _operate(target, name, args):
    import operator

    if name == "iter":
        return list(target)
    if name == "repr":
        return repr(target)
    if name == "str":
        return str(target)
    if name == "len":
        return len(target)
    if name == "bool":
        return bool(target)
    if name == "hash":
        return hash(target)
    if name == "contains":
        return args[0] in target
    if name == "setattr":
        return setattr(target, *args)
    return getattr(operator, name)(target, *args)


def prepare() -> None:
    """Everything this process imports before the learner's file (drills/grading/grader/fork_server.py does it
    once and forks a process per file from there)."""
    import drills.runtime

    drills.runtime.select()
    import torch  # noqa: F401

    from drills import stubs  # noqa: F401
    from drills.grading.learner import run_call  # noqa: F401
    from drills.grading.shared import (
        bigmem,  # noqa: F401
        launches,  # noqa: F401
        wire,  # noqa: F401  (loaded before the learner's file can reach it)
    )

    _import_what_a_grading_would()
    from drills.grading.learner.sandbox import trust_loaded_code

    trust_loaded_code()


def _import_what_a_grading_would() -> None:
    """What every grading imports lazily on its first check, imported here: once in the warm process
    instead of once per forked learner (0.6-0.8 s each), and, for a single grading, no later than it
    would anyway. Entering a torch dispatch mode (the op watch of every call) imports torch._dynamo and
    sympy; the interpreter imports Triton's language helpers and gluon on its first launch."""
    import importlib

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    for name in (
        "torch._dynamo",
        "triton.runtime.interpreter",
        "triton.experimental.gluon",
        "drills.grading.learner.instrument",
        "drills.validate",
        "drills.device_errors",
    ):
        try:
            importlib.import_module(name)
        except ImportError:  # an older Triton without gluon, or a torch without dynamo
            pass

    class _Nothing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with _Nothing():
        torch.zeros(1).add_(1)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prepare()
    return run_file(int(argv[0]), argv[1], argv[2], reference="--reference" in argv)


def run_file(fd: int, graded_file: str, module_name: str, reference: bool) -> int:
    """Import the learner's file and serve the grader on the socket fd until it hangs up. Learner prints
    go to this process's stdout/stderr, which the grader keeps in a log."""
    from multiprocessing.connection import Connection

    from drills import stubs
    from drills.grading.learner.instrument import TritonWatch, poison_empty
    from drills.grading.learner.sandbox import (
        apply_landlock,
        import_from_source,
        learner_folders,
        limit_memory,
        load_from_source,
        protect,
    )

    # On SIGUSR1 the Python stack goes to stderr (the grader's log): a call that runs past its limit is
    # asked for it before the process is stopped, so the report can name the line that loops.
    faulthandler.register(STACK_SIGNAL, all_threads=False)
    import signal

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _note_interrupt)
    conn = Connection(fd)
    server = Server(conn, graded_file, module_name)
    server.watch = TritonWatch(graded_file)
    server.watch.module_name = module_name
    if server.watch.interpreter:
        poison_empty()
    if not reference:
        # The kernel's sandbox where it has one (Landlock), and the audit hook everywhere.
        apply_landlock(graded_file=graded_file)
        protect(graded_file)
        limit_memory()  # an allocation without bound fails at the learner's line, not the machine
        # The learner's modules run from the source the static check read, never from a .pyc.
        import_from_source(learner_folders(graded_file))
    try:
        load = stubs.load_from_file if reference else load_from_source
        module = load(graded_file, module_name)
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, SystemExit):
            exc = RuntimeError(f"your file called sys.exit({exc.code!r}) while being imported")
        server.send(("import_error", describe_error(exc, graded_file)))
        return 0
    server.send(("imported", None))  # a crash from here on is not an import problem
    try:
        not_started = stubs.not_started_message(module)
    except BaseException:  # noqa: BLE001
        not_started = None
    server.send(
        (
            "ready",
            {"not_started": not_started, "name": module.__name__, "interpreter": server.watch.interpreter},
        )
    )
    server.serve(module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
