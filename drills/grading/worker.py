"""The learner's process: imports only the learner's file and runs what the grader asks of it.

Started by drills/grading/remote.py as `python -m drills.grading.worker FD FILE MODULE [--reference]`
(or, for make mutants, forked by drills/grading/warm.py from a process that ran `prepare()`), it talks
to the grader over the socket FD (messages in drills/grading/wire.py). The grader's oracle,
comparisons and report live in the other process, out of this file's reach. Here:

- reading the reference solutions (or git's copies of them), importing them, or starting programs is
  refused (an audit hook, which cannot be removed once added), unless the file graded is a reference;
- under Triton's interpreter, every load and store lane is checked against the memory of the kernel's
  tensor arguments (an out-of-bounds access becomes an error naming the learner's line instead of a
  segfault), masked-off lanes of a load without `other=` read NaN (undefined on a GPU), and programs
  can be visited in reverse, so a call that launches a kernel runs twice and a result that depends on
  the order programs run in is reported as a write race;
- torch.empty and friends return NaN-filled memory, so output never written shows;
- with `provenance`, the call is run once more with every Triton launch turned into a no-op: if the
  result does not change, it did not come from the learner's kernel.
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import signal
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STACK_SIGNAL = signal.SIGUSR1  # asks this process for its Python stack (remote.py, on a timeout)


class OutOfBounds(Exception):
    """A load or store lane outside every tensor argument of the kernel."""


class WriteRace(Exception):
    """The same call gave different results with programs visited in another order."""


class NotFromKernel(Exception):
    """With every Triton launch disabled the call still produced the same result."""


# --- Refusing the reference ------------------------------------------------------------------------


def _protect(graded_file: str) -> None:
    solutions = os.path.join(ROOT, "drills", "solutions") + os.sep
    mutants = os.path.join(ROOT, "drills", "mutants") + os.sep
    graded = os.path.realpath(graded_file)

    def forbidden_path(path) -> bool:
        try:
            real = os.path.realpath(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
        except Exception:
            return False
        if not real or real == graded:
            return False
        parts = real.split(os.sep)
        return (
            real.startswith((solutions, mutants))
            or ".git" in parts
            or (os.sep + os.path.join("drills", "solutions") + os.sep) in real
        )

    # Files are also known by inode, so a hard link to a reference file is refused like the file itself.
    inodes = set()
    for folder in (solutions, mutants):
        for dirpath, _, files in os.walk(folder):
            for name in files:
                try:
                    st = os.stat(os.path.join(dirpath, name))
                    inodes.add((st.st_dev, st.st_ino))
                except OSError:
                    pass

    def same_file(path) -> bool:
        try:
            st = os.stat(path) if isinstance(path, (str, bytes, os.PathLike)) else None
        except (OSError, ValueError):
            return False
        return st is not None and (st.st_dev, st.st_ino) in inodes

    def hook(event, args):
        if (
            event in ("os.link", "os.symlink", "shutil.copyfile", "shutil.copymode", "shutil.copystat")
            and args
            and (forbidden_path(args[0]) or same_file(args[0]))
        ):
            raise PermissionError(
                f"grading: your file may not copy or link {args[0]} (the reference solutions "
                "are off limits while your file is graded)"
            )
        if event == "open" and args and (forbidden_path(args[0]) or same_file(args[0])):
            raise PermissionError(
                f"grading: your file may not read {args[0]} (the reference solutions "
                "and the repository's history are off limits while your file is graded)"
            )
        if (
            event == "import"
            and args
            and isinstance(args[0], str)
            and args[0].startswith(("drills.solutions", "drills.mutants"))
        ):
            raise ImportError(
                f"grading: your file may not import {args[0]}: the reference solutions are "
                "off limits while your file is graded"
            )
        if (
            event
            in (
                "subprocess.Popen",
                "os.system",
                "os.exec",
                "os.posix_spawn",
                "os.spawn",
                "os.fork",
                "os.forkpty",
            )
            and not _started_by_triton()
        ):
            raise PermissionError(f"grading: your file may not start programs ({event})")

    sys.addaudithook(hook)


def _started_by_triton() -> bool:
    """True when Triton's compiler (or torch's) is the one starting a program: compiled Triton runs
    ptxas and builds its launcher with a C compiler on a GPU."""
    import torch
    import triton

    trusted = tuple(os.path.dirname(m.__file__) + os.sep for m in (triton, torch))
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(trusted):
            return True
        frame = frame.f_back
    return False


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


def _where_now(graded_file: str) -> tuple[str, int, str] | None:
    graded = os.path.realpath(graded_file)
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name and os.path.realpath(name) == graded:
            return name, frame.f_lineno, linecache.getline(name, frame.f_lineno).strip()
        frame = frame.f_back
    return None


def _relative(path: str) -> str:
    try:
        return os.path.relpath(path, ROOT) if os.path.realpath(path).startswith(ROOT + os.sep) else path
    except ValueError:
        return path


def describe_error(exc: BaseException, graded_file: str) -> dict:
    """What the grader needs to re-raise and explain an exception from the learner's code."""
    chain, seen = [], set()
    e = exc
    while e is not None and id(e) not in seen:  # InterpreterError wraps the error raised in the kernel
        seen.add(id(e))
        chain.append(e)
        e = e.__cause__ or e.__context__
    root = next((c for c in chain if isinstance(c, (OutOfBounds, WriteRace, NotFromKernel))), None)
    if root is None and type(exc).__name__ in ("InterpreterError",) and len(chain) > 1:
        root = chain[1]
    root = root or exc
    frames = []
    for c in chain:
        frames = learner_frames(c.__traceback__, graded_file) or frames
    where = getattr(root, "drills_where", None) or (frames[-1] if frames else None)
    kind = {OutOfBounds: "out_of_bounds", WriteRace: "write_race", NotFromKernel: "not_from_kernel"}.get(
        type(root), "exception"
    )
    message = str(root)
    if type(exc).__name__ == "CompilationError":
        kind, message = "compile_error", str(exc)
    from drills.grading.wire import is_plain

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


# --- Triton: launches, order, bounds ---------------------------------------------------------------


class TritonWatch:
    """Patches Triton in this process once; per call, the grader's options switch its behaviour."""

    def __init__(self, graded_file: str):
        self.graded_file = graded_file
        self.reverse = False  # visit programs in reverse order (interpreter only)
        self.disabled = False  # turn every launch into a no-op
        self.recording: list | None = None  # Launch records, when asked
        self.launched = 0  # launches during the current call
        self.stored: dict | None = None  # storage address -> its bytes after the last launch given it
        self.ranges: list[tuple[str, int, int]] = []  # (argument name, first byte, end) of the running kernel
        self.interpreter = os.environ.get("TRITON_INTERPRET", "0") == "1"
        self._patch_launch()
        if self.interpreter:
            self._patch_interpreter()

    def _patch_launch(self):
        from drills.grading.launches import _kernel_classes, describe

        watch = self
        for cls in _kernel_classes():
            original = cls.run

            def run(self, *args, _original=original, **kwargs):
                if kwargs.get("warmup", False):
                    return _original(self, *args, **kwargs)
                watch.launched += 1
                if watch.recording is not None:
                    launch = describe(self, args, kwargs)
                    fn = getattr(self, "fn", None)
                    code = getattr(fn, "__code__", None)
                    if code is not None and os.path.realpath(code.co_filename) == os.path.realpath(
                        watch.graded_file
                    ):
                        launch = type(launch)(watch.module_name, launch.name, launch.grid, launch.constexprs)
                    else:
                        launch = type(launch)(
                            f"(not your file) {launch.module}", launch.name, launch.grid, launch.constexprs
                        )
                    watch.recording.append(launch)
                if watch.disabled:
                    return None
                if watch.interpreter:
                    names = list(getattr(self, "arg_names", []) or [])
                    watch.ranges = _tensor_ranges(names, args, kwargs)
                value = _original(self, *args, **kwargs)
                if watch.stored is not None:  # what this launch left in each tensor it was given
                    for storage in _storages(_tensors_in(list(args) + list(kwargs.values()))).values():
                        watch.stored[storage[0].data_ptr()] = _u8(storage[0]).clone()
                return value

            cls.run = run

    def _patch_interpreter(self):
        import numpy as np
        from triton.runtime import interpreter as interp

        watch = self
        grid_code = interp.GridExecutor.__call__.__code__

        def grid_range(*args):
            r = range(*args)
            if watch.reverse and sys._getframe(1).f_code is grid_code:
                return r[::-1]
            return r

        interp.range = grid_range  # the module's own `range`: GridExecutor's program loops read it
        _patch_language_once(interp)

        builder = type(interp.interpreter_builder)
        load, store = builder.create_masked_load, builder.create_masked_store

        def check(ptrs, mask, what):
            if not watch.ranges:
                return
            data = np.asarray(ptrs.data, dtype=np.uint64)
            active = np.broadcast_to(np.asarray(mask.data, dtype=bool), data.shape)
            if not active.any():
                return
            size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
            p = data[active]
            inside = np.zeros(p.shape, dtype=bool)
            for _, start, end in watch.ranges:
                inside |= (p >= np.uint64(start)) & (p + np.uint64(size) <= np.uint64(end))
            if inside.all():
                return
            bad = p[~inside]
            first = int(bad[0])
            name, distance = _nearest(watch.ranges, first, size)
            where = _where_now(watch.graded_file)
            err = OutOfBounds(
                f"out of bounds {what} of {name} ({distance}): {bad.size} of {p.size} active lanes point "
                f"outside every tensor the kernel was given"
                + (f", at {_relative(where[0])}:{where[1]}: {where[2]}" if where else "")
            )
            err.drills_where = where
            raise err

        def create_masked_load(self, ptrs, mask, other, *rest):
            check(ptrs, mask, "load")
            if other is None:
                dtype_tt = ptrs.get_element_ty()
                if dtype_tt.is_floating():
                    dtype_np = interp._get_np_dtype(dtype_tt)
                    other = interp.TensorHandle(
                        np.full(np.shape(ptrs.data), np.nan, dtype=dtype_np), dtype_tt
                    )
            return load(self, ptrs, mask, other, *rest)

        def create_masked_store(self, ptrs, value, mask, *rest):
            check(ptrs, mask, "store")
            return store(self, ptrs, value, mask, *rest)

        builder.create_masked_load = create_masked_load
        builder.create_masked_store = create_masked_store
        for name in ("create_atomic_rmw",):
            original = getattr(builder, name, None)
            if original is None:
                continue

            def atomic(self, op, ptr, val, mask, *rest, _original=original):
                check(ptr, mask, "atomic")
                return _original(self, op, ptr, val, mask, *rest)

            setattr(builder, name, atomic)


def _patch_language_once(interp) -> None:
    """Triton's interpreter patches triton.language when a kernel starts (undone when it returns), and
    again on every call of a @triton.jit helper from the kernel (tl.max and tl.zeros are helpers too): a
    scan of every member of the language modules, a fifth of T5's grading time. Within one kernel run
    only the first patch of a module changes anything (nothing is undone before the kernel returns, and
    a repeat sets the same functions again), so a helper whose modules are already patched skips it."""
    import inspect

    import triton.language as tl

    if not all(hasattr(interp, name) for name in ("_patch_lang", "_LangPatchScope", "InterpretedFunction")):
        return  # another Triton: leave it as it is
    patch_lang, grid_call = interp._patch_lang, interp.GridExecutor.__call__
    helper_code = interp.InterpretedFunction.__call__.__code__
    patched: list[set] = []  # the language modules patched since the running kernel started

    def languages(fn) -> set:
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and (v is tl or v is tl.core)}

    def run_grid(self, *args, **kwargs):
        patched.append(languages(self.fn))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            patched.pop()

    def patch_once(fn):
        if not patched or sys._getframe(1).f_code is not helper_code:
            return patch_lang(fn)
        needed = languages(fn)
        if needed and needed <= patched[-1]:
            return interp._LangPatchScope()  # Triton drops a helper's scope unrestored anyway
        scope = patch_lang(fn)
        patched[-1] |= needed
        return scope

    interp.GridExecutor.__call__ = run_grid
    interp._patch_lang = patch_once


def _tensor_ranges(names, args, kwargs) -> list[tuple[str, int, int]]:
    ranges = []
    items = list(zip(names, args)) + list(kwargs.items())
    for name, value in items:
        if hasattr(value, "untyped_storage") and hasattr(value, "data_ptr"):
            storage = value.untyped_storage()
            start = storage.data_ptr()
            ranges.append((name, start, start + storage.nbytes()))
    return ranges


def _nearest(ranges, ptr: int, size: int) -> tuple[str, str]:
    best = None
    for name, start, end in ranges:
        if ptr >= end:
            n = (ptr - end) // size + 1
            d, text = ptr - end, f"{n} element{'s' if n != 1 else ''} past its end"
        elif ptr < start:
            n = (start - ptr + size - 1) // size
            d, text = start - ptr, f"{n} element{'s' if n != 1 else ''} before its start"
        else:
            d, text = 0, "straddling its end"
        if best is None or d < best[0]:
            best = (d, name, text)
    if best is None or best[0] > 1 << 40:
        return "any argument", "a wild address"
    return best[1], best[2]


# What torch.empty returns in the learner's process: NaN, so that output a kernel never wrote shows; a
# different value while launches are disabled, so that a kernel whose output is NaN is not taken for
# no kernel at all.
POISON = {"value": float("nan")}
DISABLED_POISON = 7777.0


def _poison_empty() -> None:
    """torch.empty and friends return poisoned memory (floats)."""
    import torch

    def poisoned(fn):
        def wrapper(*args, **kwargs):
            t = fn(*args, **kwargs)
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and t.device.type == "cpu":
                t.fill_(POISON["value"])
            return t

        wrapper.__wrapped__ = fn
        return wrapper

    torch.empty = poisoned(torch.empty)
    torch.empty_like = poisoned(torch.empty_like)
    torch.empty_strided = poisoned(torch.empty_strided)
    torch.Tensor.new_empty = poisoned(torch.Tensor.new_empty)


# --- Running one call ------------------------------------------------------------------------------


def _tensors_in(value, found=None) -> list:
    import torch

    found = [] if found is None else found
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors_in(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors_in(v, found)
    return found


def _storages(tensors) -> dict:
    out = {}
    for t in tensors:
        s = t.untyped_storage()
        out.setdefault(s.data_ptr(), (s, t))
    return out


def _snapshot(storages: dict) -> dict | None:
    """Copies of every argument's storage, or None when one is too large to copy (a sparse cache)."""
    from drills.grading.bigmem import backing_file
    from drills.grading.wire import as_bytes_view

    if any(backing_file(s) is not None for s, _ in storages.values()):
        return None
    return {ptr: as_bytes_view(s).clone() for ptr, (s, _) in storages.items()}


def _restore(storages: dict, snap: dict) -> None:
    from drills.grading.wire import as_bytes_view

    for ptr, (s, _) in storages.items():
        as_bytes_view(s).copy_(snap[ptr])


def _differs(a, b) -> bool:
    """Two results differ (NaN equal to NaN; float noise below 1e-3 ignored, as atomics may reorder)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return True
    if a.is_floating_point():
        return not torch.isclose(a.float(), b.float(), rtol=1e-3, atol=1e-3, equal_nan=True).all().item()
    return not torch.equal(a, b)


def _typed(storage, like):
    import torch

    n = storage.nbytes() // like.element_size()
    return torch.empty(0, dtype=like.dtype, device=storage.device).set_(storage, 0, (n,), (1,))


def _compare_states(storages, after_a: dict, results_a: list, result_b, names: dict) -> str | None:
    """Where the state after run b differs from the state after run a (None: nowhere)."""
    for ptr, (s, t) in storages.items():
        before, now = _typed_copy(after_a[ptr], t), _typed(s, t)
        if _differs(before, now):
            return f"argument `{names.get(ptr, '?')}`: {_count_diff(before, now)} elements differ"
    for i, (x, y) in enumerate(zip(results_a, _tensors_in(result_b))):
        if _differs(x, y):
            return f"the returned tensor #{i}: {_count_diff(x, y)} elements differ"
    return None


def _typed_copy(u8_copy, like):
    import torch

    n = u8_copy.numel() // like.element_size()
    return torch.empty(0, dtype=like.dtype, device=u8_copy.device).set_(
        u8_copy.untyped_storage(), 0, (n,), (1,)
    )


def _count_diff(a, b) -> int:
    import torch

    if a.is_floating_point():
        return int((~torch.isclose(a.float(), b.float(), rtol=1e-3, atol=1e-3, equal_nan=True)).sum())
    return int((a != b).sum())


def _argument_names(fn, args, kwargs) -> dict:
    """data_ptr of each tensor argument's storage -> the parameter name it was passed as."""
    import inspect

    names = {}
    kernel = next(
        (
            c.cell_contents
            for c in (getattr(fn, "__closure__", None) or ())
            if hasattr(c.cell_contents, "arg_names")
        ),
        None,
    )  # kernel[grid] is a lambda around it
    try:
        if kernel is not None:
            bound = dict(zip(kernel.arg_names, args)) | dict(kwargs)
        else:
            bound = inspect.signature(fn).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = {f"argument {i}": a for i, a in enumerate(args)} | dict(kwargs)
    for name, value in bound.items():
        for t in _tensors_in(value):
            names.setdefault(t.untyped_storage().data_ptr(), name)
    return names


def run_call(watch: TritonWatch, fn, args, kwargs, options: dict):
    """Call fn as the grader asked: under the interpreter, a call that launches a kernel is run again
    with programs in reverse order, and with `provenance` once more with every launch disabled."""
    tensors = _tensors_in(list(args) + list(kwargs.values()))
    storages = _storages(tensors)
    checks = watch.interpreter and options.get("orders", True)
    provenance = options.get("provenance", False)
    snap = _snapshot(storages) if (checks or provenance) else None
    watch.launched, watch.reverse, watch.disabled = 0, False, False
    watch.stored = {} if provenance else None
    try:
        result = fn(*args, **kwargs)
    finally:
        stored, watch.stored = watch.stored, None
    if provenance and watch.launched:
        _check_written_by_a_launch(result, stored)
    if watch.launched == 0 or snap is None:
        return result
    names = _argument_names(fn, args, kwargs)
    after = {ptr: _u8(s).clone() for ptr, (s, _) in storages.items()}
    results = [t.clone() for t in _tensors_in(result)]
    if checks:
        _restore(storages, snap)
        watch.reverse = True
        try:
            result = fn(*args, **kwargs)
        finally:
            watch.reverse = False
        where = _compare_states(storages, after, results, result, names)
        if where is not None:
            raise WriteRace(
                "write race: the same call gave different results with the kernel's programs run in "
                f"reverse order ({where}); programs overwrite memory another program writes, which on a "
                "GPU, where programs run in any order, gives wrong results"
            )
    if provenance:
        _restore(storages, snap)
        watch.disabled, POISON["value"] = True, DISABLED_POISON
        try:
            disabled_result = fn(*args, **kwargs)
        except Exception:
            disabled_result = None
        finally:
            watch.disabled, POISON["value"] = False, float("nan")
        unchanged = _compare_states(storages, after, results, disabled_result, names) is None and len(
            _tensors_in(disabled_result)
        ) == len(results)
        _restore(storages, {ptr: a for ptr, a in after.items()})
        if unchanged:
            raise NotFromKernel(
                "the output did not come from your kernel: with every Triton launch turned into a no-op the "
                "call returned the same result, so it was computed some other way (torch, or a copy), or your "
                "kernel writes nothing (no tl.store into the output?)"
            )
    return result


def _check_written_by_a_launch(result, stored: dict) -> None:
    """Every tensor the call returns must hold what a launch left in it: its storage was given to a
    kernel, and nothing changed it after that kernel. A result computed by torch, next to a kernel that
    ran for show (one that copies an input, or one that only checks whether launches run), fails here."""
    for tensor in _tensors_in(result):
        storage = tensor.untyped_storage()
        after = stored.get(storage.data_ptr())
        if after is None or _differs(after, _u8(storage)):
            how = (
                "no kernel of yours was given it"
                if after is None
                else "it changed after your last kernel wrote it"
            )
            raise NotFromKernel(
                f"the output did not come from your kernel: a tensor the call returned ({tuple(tensor.shape)}, "
                f"{tensor.dtype}) does not hold what a launch stored ({how}); compute the result in your "
                "@triton.jit kernel and return the tensor it stores into"
            )


def _u8(storage):
    from drills.grading.wire import as_bytes_view

    return as_bytes_view(storage)


# --- The server ------------------------------------------------------------------------------------


class Server:
    def __init__(self, conn, graded_file: str, module_name: str):
        from drills.grading import wire

        self.conn = conn
        self.wire = wire
        self.known = wire.Storages()
        self.objects: dict[int, object] = {}
        self.counts: dict[int, int] = {}
        self.lent: dict[int, LentObject] = {}  # the grader's lent objects, one proxy per key
        self.graded_file = graded_file
        self.module_name = module_name
        self.watch = None

    # Encoding what goes back: plain values by value, the rest as handles kept here.
    def handle(self, obj):
        if self.wire.is_plain(obj) or isinstance(obj, BaseException):
            return None
        if type(obj) is LentObject:
            return ("L", object.__getattribute__(obj, "_key"))
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
            if hasattr(obj, "fn") and hasattr(obj, "run")
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
            return Callback(self, pid[1])
        if pid[0] == "L":
            if pid[1] not in self.lent:
                self.lent[pid[1]] = LentObject(self, pid[1])
            return self.lent[pid[1]]
        raise ValueError(f"unknown reference {pid!r}")

    def send(self, message):
        self.conn.send_bytes(self.wire.dumps(message, self.known, self.handle))

    def receive(self):
        return self.wire.loads(self.conn.recv_bytes(), self.known, self.resolve)

    def reply(self, value):
        updates = self.known.take_copies()
        self.send(("result", value, updates))

    def fail(self, exc):
        updates = self.known.take_copies()
        self.send(("error", describe_error(exc, self.graded_file), updates))

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
                    self.reply(run_call(self.watch, target, args, kwargs, options))
                elif op == "method":
                    _, key, name, args, kwargs, options = request
                    method = getattr(self.objects[key], name)
                    self.reply(run_call(self.watch, method, args, kwargs, options))
                elif op == "probe":
                    _, module_name, qualname, args, kwargs = request
                    self.reply(_probe(module_name, qualname)(*args, **kwargs))
                elif op == "op":
                    _, target, name, args = request
                    self.reply(_operate(target, name, args))
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
                if isinstance(exc, KeyboardInterrupt):
                    raise
                if isinstance(exc, SystemExit):
                    exc = RuntimeError(f"your code called sys.exit({exc.code!r}) while being graded")
                self.fail(exc)
            finally:
                request = None
                for key in releases:
                    self.counts[key] = self.counts.get(key, 1) - 1
                    if key != 0 and self.counts[key] <= 0:
                        self.objects.pop(key, None)
                        self.counts.pop(key, None)
                releases = ()


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


class LentObject:
    """An object the grader lent (wire.Lent): every attribute read asks the grader, which keeps the
    object; its methods come back as callbacks (kept here: a method's code does not change), other
    values by value. Read-only."""

    __slots__ = ("_server", "_key", "_methods")

    def __init__(self, server: Server, key: int):
        object.__setattr__(self, "_server", server)
        object.__setattr__(self, "_key", key)
        object.__setattr__(self, "_methods", {})

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        methods = object.__getattribute__(self, "_methods")
        if name in methods:
            return methods[name]
        server = object.__getattribute__(self, "_server")
        server.send(("callback_getattr", object.__getattribute__(self, "_key"), name))
        kind, value = server.receive()
        if kind == "method":
            methods[name] = value
            return value
        return _callback_reply(kind, value)

    def __setattr__(self, name, value):
        raise AttributeError(f"the grader's object is read-only here: cannot set {name}")

    def __repr__(self):
        return f"<an object lent by the grader (key {object.__getattribute__(self, '_key')})>"


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
    """Everything this process imports before the learner's file (drills/grading/warm.py does it once
    and forks a process per file from there)."""
    import drills.runtime

    drills.runtime.select()
    import torch  # noqa: F401

    from drills import contract  # noqa: F401
    from drills.grading import (
        launches,  # noqa: F401
        wire,  # noqa: F401  (loaded before the learner's file can reach it)
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    prepare()
    return run_file(int(argv[0]), argv[1], argv[2], reference="--reference" in argv)


def run_file(fd: int, graded_file: str, module_name: str, reference: bool) -> int:
    """Import the learner's file and serve the grader on the socket fd until it hangs up. Learner prints
    go to this process's stdout/stderr, which the grader keeps in a log."""
    from multiprocessing.connection import Connection

    from drills import contract

    # On SIGUSR1 the Python stack goes to stderr (the grader's log): a call that runs past its limit is
    # asked for it before the process is stopped, so the report can name the line that loops.
    faulthandler.register(STACK_SIGNAL, all_threads=False)
    conn = Connection(fd)
    server = Server(conn, graded_file, module_name)
    server.watch = TritonWatch(graded_file)
    server.watch.module_name = module_name
    if server.watch.interpreter:
        _poison_empty()
    if not reference:
        _protect(graded_file)
    try:
        module = contract.load_from_file(graded_file, module_name)
    except BaseException as exc:  # noqa: BLE001
        if isinstance(exc, SystemExit):
            exc = RuntimeError(f"your file called sys.exit({exc.code!r}) while being imported")
        server.send(("import_error", describe_error(exc, graded_file)))
        return 0
    server.send(("imported", None))  # a crash from here on is not an import problem
    try:
        not_started = contract.not_started_message(module)
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
