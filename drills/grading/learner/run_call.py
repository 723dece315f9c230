"""Running one of the grader's calls in the learner's process (serve_calls.py), as the grader asked:

- under the interpreter, a call whose launch has programs touching each other's memory (write_races.py)
  is run again with its programs visited in reverse order; a result that depends on the order is a
  write race (raised here: it is the learner's own bug);
- with `provenance`, the evidence the grader's process judges (provenance.judge) goes back with the
  result: what the last launch left in each returned tensor, and the call's result and argument states
  once more with every Triton launch turned into a no-op (with the arguments' states before the call:
  that run must leave them byte for byte as they were);
- every call: a tensor the call left in the learner's module state (a dict of answers keyed by shapes,
  a default argument, a function's attribute, a closure) fails it as not from the kernel, since a later
  call with the same shapes could return it without computing, and no check changes only the values;
  and after its first call, a call that changes the module's plain state (a call counter, a flag, a list
  that grows) fails the same way, since it could behave otherwise on the grader's later calls;
- with `loads_of` (launches.record_loads), the loads of the first run from the storages named are kept
  per program for the grader to fetch.
"""

from __future__ import annotations

import re
import sys

from drills.grading.learner.instrument import (
    DISABLED_POISON,
    FINITE_POISON,
    POISON,
    TritonWatch,
    _storages,
    _u8,
    torch_compute_recorder,
)
from drills.grading.learner.write_races import AccessLog
from drills.grading.shared.errors import WriteRace
from drills.grading.shared.tensor_states import compare_states
from drills.grading.shared.wire import tensors_in


def _snapshot(storages: dict) -> dict | None:
    """Copies of every argument's storage, or None when one is too large to copy (a sparse cache)."""
    from drills.grading.shared.bigmem import backing_file

    if any(backing_file(s) is not None for s, _ in storages.values()):
        return None
    return {ptr: _u8(s).clone() for ptr, (s, _) in storages.items()}


def _restore(storages: dict, snap: dict) -> None:
    for ptr, (s, _) in storages.items():
        _u8(s).copy_(snap[ptr])


def _typed(u8, like):
    """A flat tensor of like's dtype over the bytes of u8 (a storage's bytes, or a copy of them)."""
    import torch

    n = u8.numel() // like.element_size()
    return torch.empty(0, dtype=like.dtype, device=u8.device).set_(u8.untyped_storage(), 0, (n,), (1,))


def _as_stored(tensor, stored_u8):
    """tensor's view (shape, strides, offset) over the bytes a launch left in its storage."""
    return _typed(stored_u8, tensor).as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


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
        for t in tensors_in(value):
            names.setdefault(t.untyped_storage().data_ptr(), name)
    return names


def _raise_device_errors() -> None:
    """Every call is followed by a read of the device error word (drills/device_errors.py), as an engine
    reads it once per step: a reference kernel's guard records there a bad value it contained. The
    graders pass bad values only with check=True, which refuses them before any launch, so a word set
    here is a guard that fired on values the launcher accepted: what the kernel computed from them (a
    length, a boundary, a block id) is wrong. It fails as a check does, not as an exception, so the
    diagnosis goes on to the mistake that the failing checks share. Not while a graph is being captured."""
    import torch

    from drills.device_errors import raise_device_errors

    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return
    try:
        raise_device_errors()
    except ValueError as recorded:
        raise AssertionError(
            f"a device guard fired on arguments the launcher accepted ({recorded}): the kernel computed a "
            "length, a sequence boundary or a block id that the arguments do not hold"
        ) from None


def _through_copies(read: set, copied_from: dict) -> set:
    """The storages read, with those they were copied (or viewed) from, however many copies deep."""
    read, todo = set(read), list(read)
    while todo:
        for source in copied_from.get(todo.pop(), ()):
            if source not in read:
                read.add(source)
                todo.append(source)
    return read


def _unread_inputs(fn, args, kwargs, storages: dict, snap: dict | None, read: set | None) -> list[str]:
    """The names of the call's floating-point inputs that no load of any launch read from: arguments the
    call left as they were (an output it writes is not an input). Computing the answer elsewhere (numpy,
    torch out of the recorder's sight) and copying it in with a kernel leaves the inputs unread. Empty
    when the storages were too large to compare. Compiled Triton hides its loads: there `read` holds the
    storages some launch was given, so an answer made elsewhere and copied in is still caught."""
    import torch

    if read is None or snap is None:
        return []
    names = _argument_names(fn, args, kwargs)
    unread = []
    for ptr, (storage, tensor) in storages.items():
        if not tensor.is_floating_point() or tensor.numel() == 0 or ptr in read:
            continue
        if torch.equal(_u8(storage), snap[ptr]):  # left as it was: an input
            unread.append(names.get(ptr, "an argument"))
    return unread


def _refuse_replaced_methods(args, kwargs, result) -> None:
    """After the call, the harness clones, views and sends the tensors it was given and got back, out of
    the op recorder's sight: a tensor whose own attribute replaces one of its methods (`out.clone = ` a
    chain of C functions that adds) would compute there unseen. Such a tensor fails the call."""
    from drills.grading.learner.instrument import PythonArgument, _tensor_stand_in

    for t in tensors_in(list(args) + list(kwargs.values()) + [result]):
        stand_in = _tensor_stand_in(t)
        if stand_in is not None:
            raise PythonArgument(
                f"the output did not come from your kernel: {stand_in} runs as Python inside the launch or "
                "after it, where the grader copies the call's tensors out of its sight; leave torch's tensors' "
                "methods as they are"
            )


_BEFORE_CALLS: dict = {}  # module name -> _held_tensors(module) before its first call


def _held_tensors(module) -> dict[int, tuple]:
    """{id: (tensor, the module-level name that reaches it)} for every tensor the learner's module holds:
    in its globals, and in the containers, functions (defaults, attributes, closures), classes and
    objects of its own they reach."""
    import collections
    import collections.abc
    import functools
    import gc
    import types

    import torch

    found: dict[int, tuple] = {}
    if module is None:
        return found
    own, seen = module.__name__, set()

    def ours(obj) -> bool:
        return getattr(obj, "__module__", None) == own or getattr(type(obj), "__module__", None) == own

    from drills.grading.shared.launches import _kernel_classes

    kernels = tuple(_kernel_classes())

    def items_of(value) -> list:  # what value holds that lasts with it
        if isinstance(value, (str, bytes, int, float, complex, bool, type(None), types.ModuleType)):
            return []
        if isinstance(value, (dict, collections.abc.Mapping)):
            items = [*value.keys(), *value.values()]
        elif isinstance(value, functools._lru_cache_wrapper):  # its cache: a dict only gc reaches
            items = gc.get_referents(value)
        elif isinstance(value, types.GeneratorType):  # a generator's locals last between calls too
            items = list(value.gi_frame.f_locals.values()) if value.gi_frame is not None else []
        elif isinstance(value, (list, tuple, set, frozenset, collections.deque)):
            items = list(value)
        elif isinstance(value, functools.partial):
            items = [value.func, *value.args, *value.keywords.values()]
        elif isinstance(value, types.MethodType):  # a bound method keeps its object: `_keep = _Memo().keep`
            items = [value.__func__, value.__self__]
        elif type(value).__module__ in ("itertools", "functools", "collections"):
            items = gc.get_referents(value)  # itertools.repeat(obj), a deque iterator: what they hold
        elif isinstance(value, (staticmethod, classmethod)):
            items = [value.__func__]
        elif isinstance(value, property):
            items = [value.fget, value.fset]
        elif isinstance(value, types.FunctionType):
            if value.__module__ != own:
                return []
            cells = []
            for cell in value.__closure__ or ():
                try:
                    cells.append(cell.cell_contents)
                except ValueError:  # a cell not yet filled
                    pass
            items = [*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values(), *cells]
            items += list(vars(value).values())
        elif isinstance(value, type):
            if value.__module__ != own:
                return []
            items = list(vars(value).values())
        elif ours(value) or isinstance(value, kernels):  # the file's objects, its kernels' attributes
            items = list(vars(value).values()) if isinstance(getattr(value, "__dict__", None), dict) else []
            for klass in type(value).__mro__:
                for slot in klass.__dict__.get("__slots__", ()) if klass.__module__ == own else ():
                    items.append(getattr(value, slot, None))
        else:
            return []
        return items

    import sys

    def namespace_of_a_module(item) -> bool:
        # A module's globals, reached through a function's or kernel's __globals__ or Triton's record of
        # the globals a kernel uses (JITFunction.used_global_vals, filled when a GPU compiles it): that
        # module's state, not this file's. The file's own is walked from its names below; another's (the
        # device error word, allocated by a first GPU call) would read as a tensor this file kept.
        if not isinstance(item, dict):
            return False
        owner = sys.modules.get(item.get("__name__")) if isinstance(item.get("__name__"), str) else None
        return owner is not None and getattr(owner, "__dict__", None) is item

    # Iterative, with no depth limit: a dict nested past any limit is no less kept
    for name, value in list(vars(module).items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        stack = [value]
        while stack:
            item = stack.pop()
            if id(item) in seen or namespace_of_a_module(item):
                continue
            seen.add(id(item))
            if isinstance(item, torch.Tensor):
                found[id(item)] = (item, name)
            else:
                stack.extend(items_of(item))
    return found


_STATE_AFTER: dict = {}  # module name -> _module_state(module) after its last call


def _module_state(module) -> dict:
    """{path: value} for what the learner's module holds that a call could change and a later call read: its
    globals' plain values (numbers, strings), the lengths of its lists and sets, the keys of its dicts,
    the contents of small tensors, an iterator's position (itertools.count), walked as _held_tensors walks
    (containers, functions' defaults, closures and attributes, the file's classes and objects). Triton's
    kernels and functools' caches are left out: what they keep is their own (compiled code, a pure
    function's results), and tensors kept there are _held_tensors' to find."""
    import collections.abc
    import functools
    import hashlib
    import types

    import torch

    from drills.grading.shared.launches import _kernel_classes

    state: dict = {}
    if module is None:
        return state
    own, seen, kernels = module.__name__, set(), tuple(_kernel_classes())

    def ours(obj) -> bool:
        return getattr(obj, "__module__", None) == own or getattr(type(obj), "__module__", None) == own

    stack = [
        (name, value)
        for name, value in vars(module).items()
        if not (name.startswith("__") and name.endswith("__"))
    ]
    while stack:
        path, value = stack.pop()
        if isinstance(value, (bool, int, float, complex, str, bytes, type(None))):
            state[path] = value
            continue
        if id(value) in seen or isinstance(value, (types.ModuleType, functools._lru_cache_wrapper, *kernels)):
            continue
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            if value.numel() <= 2**16 and value.device.type in ("cpu", "cuda"):
                data = value.detach().reshape(-1).cpu().contiguous().view(torch.uint8).numpy().tobytes()
                state[path] = ("tensor", hashlib.sha1(data).hexdigest())
            continue
        if isinstance(value, (dict, collections.abc.Mapping)):
            # Its keys, not their number: a memo that gains a key per new shape is a cache, which only
            # changes when the shapes do; the values under each key are walked as their own paths.
            state[path] = ("keys", {repr(k): _leaves(k) for k in value.keys()})
            stack += [(f"{path}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, (list, tuple, set, frozenset, collections.deque, bytearray)):
            items = list(value)
            state[path] = ("len", len(items))
            if not isinstance(value, (set, frozenset)):
                stack += [(f"{path}[{i}]", v) for i, v in enumerate(items)]
        elif type(value).__module__ == "itertools":
            state[path] = ("repr", repr(value))  # count(5): its position
        elif isinstance(value, types.GeneratorType):
            frame = value.gi_frame
            state[path] = ("generator", None if frame is None else frame.f_lasti)
            if frame is not None:
                stack += [(f"{path}.{k}", v) for k, v in frame.f_locals.items()]
        elif isinstance(value, functools.partial):
            stack += [(f"{path}.args", value.args), (f"{path}.keywords", value.keywords)]
        elif isinstance(value, types.MethodType):
            stack.append((f"{path}.__self__", value.__self__))
        elif isinstance(value, (staticmethod, classmethod)):
            stack.append((path, value.__func__))
        elif isinstance(value, types.FunctionType):
            if value.__module__ != own:
                continue
            stack.append((f"{path}.__defaults__", value.__defaults__ or ()))
            stack.append((f"{path}.__kwdefaults__", value.__kwdefaults__ or {}))
            for i, cell in enumerate(value.__closure__ or ()):
                try:
                    stack.append((f"{path}.<closure {i}>", cell.cell_contents))
                except ValueError:  # a cell not yet filled
                    state[f"{path}.<closure {i}>"] = ("empty",)
            stack.append((f"{path}.__dict__", dict(vars(value))))
        elif isinstance(value, type):
            if value.__module__ == own:
                stack += [(f"{path}.{k}", v) for k, v in vars(value).items() if not k.startswith("__")]
        elif ours(value) and isinstance(getattr(value, "__dict__", None), dict):
            stack.append((f"{path}.__dict__", dict(vars(value))))
    return state


def _leaves(value) -> tuple:
    """The plain values a dict's key is made of (a tuple of shapes and dtypes flattened)."""
    if isinstance(value, (tuple, list, frozenset, set)):
        return tuple(leaf for v in value for leaf in _leaves(v))
    return (value if isinstance(value, (bool, int, float, str, type(None))) else repr(value),)


def call_values(args, kwargs) -> set:
    """Every value a cache of the learner's could key an answer by that comes from the call itself: each
    tensor argument's shape, strides, storage offset, dtype and address, the values of small integer
    tensors (lengths, tables), and every plain argument, flattened."""
    import torch

    values: set = set()

    def walk(value):
        if isinstance(value, torch.Tensor):
            values.update(value.shape)
            values.update(value.stride())
            values.update((value.storage_offset(), value.data_ptr(), value.untyped_storage().data_ptr()))
            values.update((str(value.dtype), repr(value.dtype), value.dim(), value.numel()))
            if not value.is_floating_point() and value.numel() <= 4096:
                values.update(value.reshape(-1).tolist())
        elif isinstance(value, (tuple, list)):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k)
                walk(v)
        elif isinstance(value, (bool, int, float, str, type(None))):
            values.add(value)
        else:
            values.add(repr(value))

    walk([list(args), kwargs])
    return values


def _derived(leaf, values: set) -> bool:
    """A key's leaf a cache keyed by the call could hold: a value of the call, a word (a constant's name:
    "fwd"), True, False or None; not a number of its own (a count of calls)."""
    if leaf is None or isinstance(leaf, bool):
        return True
    if isinstance(leaf, str) and (leaf.isidentifier() or leaf.startswith("torch.")):
        return True
    return leaf in values


def _refuse_changed_state(module, graded_file: str | None, values: set = frozenset()) -> None:
    """A call that changes what the module holds for a later call (a counter of calls, a flag set by the
    first one, a list that grows) lets each call know how many came before it, and behave otherwise after
    the grader's first checks, or only on the call a check of its loads or launches watches. Its first
    call may set what it sets once (a lazily built table); after that, a call leaves the module as it
    found it, but for a dict gaining keys made of the call's own values (a cache keyed by shapes, dtypes
    or an argument's address): no key may change its value, and a key holding a number of its own
    (`_seen[len(_seen)] = ...`, a count of calls) is a counter."""
    if module is None:
        return
    now = _module_state(module)
    key = module.__name__
    before, _STATE_AFTER[key] = _STATE_AFTER.get(key), now
    if before is None:
        return
    for path, value in before.items():
        new = now.get(path, value)
        if new == value:
            continue
        if (
            isinstance(value, tuple)
            and value[:1] == ("keys",)
            and isinstance(new, tuple)
            and new[:1] == ("keys",)
            and set(value[1]) <= set(new[1])
            and all(
                _derived(leaf, values) for k, leaves in new[1].items() if k not in value[1] for leaf in leaves
            )
        ):
            continue  # a dict that gained keys made of the call's values: a cache
        from drills.grading.shared.errors import NotFromKernel

        name = re.split(r"[.\[]", path, maxsplit=1)[0]
        line = _line_of(graded_file, rf"\b{re.escape(name)}\b")
        raise NotFromKernel(
            f"the output did not come from your kernel alone: the call changed `{path}`{line}, module state "
            "that lasts from one call to the next (a call counter, a flag set by an earlier call, a dict "
            "that gains a key no argument of the call made): a launcher computes each call from its "
            "arguments alone, the same on the grader's first call as on its last"
        )


def _refuse_kept_tensors(module, before: dict, graded_file: str | None) -> None:
    """A tensor a call left in the module's state (a dict of answers keyed by shapes, a default
    argument, a function's attribute, a closure, an lru_cache) is an answer kept for a later call: that
    call can return it without computing, and no check changes the values but not the shapes. Each call
    computes its answer in its kernel; a launcher keeps no tensor between calls."""
    if module is None:
        return
    # a tensor made at import and since let go could leave its id to a kept one: the object itself decides
    kept = [
        where for key, (t, where) in _held_tensors(module).items() if before.get(key, (None,))[0] is not t
    ]
    if not kept:
        return
    from drills.grading.shared.errors import NotFromKernel

    name = kept[0]
    line = _line_of(graded_file, rf"^\s*(def |class )?{re.escape(name)}\b")
    raise NotFromKernel(
        f"the output did not come from your kernel: a call left a tensor in `{name}`{line}, which lasts "
        "from one call to the next (an answer kept for a later call with the same shapes returns without "
        "computing); a launcher keeps no tensor between calls: allocate what each call needs and compute it "
        "in the kernel"
    )


def _line_of(graded_file: str | None, pattern: str) -> str:
    """' (line N: `code`)' for the first line of the graded file that matches pattern; '' if none."""
    import linecache

    for number, line in enumerate(linecache.getlines(graded_file) if graded_file else (), start=1):
        if re.search(pattern, line):
            return f" (line {number}: `{line.strip()[:60]}`)"
    return ""


def _refuse_tensor_attributes(fn, args, kwargs, tensors, before: dict, graded_file: str | None) -> None:
    """An attribute the call set on a tensor it was given (an answer kept on the KV cache, keyed by its
    shapes) lasts as long as the tensor: a later call given the same tensor, its values changed in place,
    could return it without computing. A launcher reads its arguments and writes their memory only."""
    for t in tensors:
        added = sorted(set(vars(t)) - before.get(id(t), set()))
        if added:
            from drills.grading.shared.errors import NotFromKernel

            which = _argument_names(fn, args, kwargs).get(t.untyped_storage().data_ptr())
            attr = re.escape(added[0])
            line = _line_of(graded_file, rf"\b{attr}\b.*=|setattr\(.*\b{attr}\b")
            raise NotFromKernel(
                f"the output did not come from your kernel: the call set .{added[0]}{line} on the tensor "
                f"{f'`{which}`' if which else 'it was given'}, which lasts from one call to the next (an "
                "answer kept for a later call returns without computing); a launcher reads its arguments "
                "and writes their memory, and keeps nothing on them"
            )


def run_call(watch: TritonWatch, fn, args, kwargs, options: dict):
    """(the call's result, the provenance evidence or None): see the module docstring."""
    tensors = tensors_in(list(args) + list(kwargs.values()))
    storages = _storages(tensors)
    # launches=False: a dry run (launches.assert_grids_fit), every launch recorded and checked, none run.
    dry = not options.get("launches", True)
    checks = watch.interpreter and options.get("orders", True) and not dry
    provenance = options.get("provenance", False) and not dry
    snap = _snapshot(storages) if (checks or provenance) else None
    watch.launched, watch.reverse, watch.disabled = 0, False, dry
    watch.access, watch.overlapped = (AccessLog() if checks else None), False
    watch.stored = {} if provenance else None
    watch.read = set() if provenance else None
    # Every call is watched for torch computing floats beside the kernels, not only the one that asks for
    # provenance: a launcher that hands the cases the provenance check does not make to torch is refused too.
    recorder = torch_compute_recorder(watch)
    module = sys.modules.get(getattr(watch, "module_name", None) or "")
    # What the module held before its first call (constants made at import), the tensors themselves so that
    # their ids stay theirs: every call is judged against it, so a call that returns a kept answer fails as
    # the call that kept it did
    key = getattr(module, "__name__", None)
    if key not in _BEFORE_CALLS:
        _BEFORE_CALLS[key] = _held_tensors(module)
    held = _BEFORE_CALLS[key]
    attributes = {id(t): set(vars(t)) for t in tensors}
    # The storages whose loads the grader asked for (launches.record_loads), by their place among the
    # call's tensors: recorded in this first run only, the one made in the programs' own order.
    watch.loads_of = [
        (t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
        if t is not None
        else (0, 0)  # a tensor the call was not given: an empty range keeps the others' numbers
        for t in (tensors[i] if 0 <= i < len(tensors) else None for i in options.get("loads_of") or ())
    ] or None
    try:
        with recorder:
            try:
                result = fn(*args, **kwargs)
            finally:
                watch.loads_of = None
        _refuse_replaced_methods(args, kwargs, result)
        _refuse_kept_tensors(module, held, getattr(watch, "graded_file", None))
        _refuse_changed_state(module, getattr(watch, "graded_file", None), call_values(args, kwargs))
        _refuse_tensor_attributes(fn, args, kwargs, tensors, attributes, getattr(watch, "graded_file", None))
        _raise_device_errors()
    finally:
        watch.disabled = False
        stored, watch.stored = watch.stored, None
        read, watch.read = watch.read, None
        overlapped, watch.access = watch.overlapped, None
    launched = watch.launched
    evidence = {"launched": launched, "torch": list(recorder.seen), "light": True}
    if provenance:
        returned = tensors_in(result)
        written = []
        for t in returned:
            after = stored.get(t.untyped_storage().data_ptr()) if launched else None
            written.append(None if after is None else _as_stored(t, after).clone())
        evidence = {"launched": launched, "written": written, "disabled": None, "torch": list(recorder.seen)}
        if launched and read is not None:  # a kernel that read a copy of an input read the input
            read = _through_copies(read, recorder.copied_from)
        evidence["unread"] = _unread_inputs(fn, args, kwargs, storages, snap, read) if launched else []
    if launched == 0 or snap is None:
        return result, evidence
    names = _argument_names(fn, args, kwargs)
    after = {ptr: _u8(s).clone() for ptr, (s, _) in storages.items()}
    results = [t.clone() for t in tensors_in(result)]
    ordered = list(storages.items())
    typed_after = [_typed(after[ptr], t) for ptr, (_, t) in ordered]
    arg_names = [names.get(ptr, "?") for ptr, _ in ordered]
    if checks and overlapped:  # programs that never touch each other's bytes give one result in any order
        _restore(storages, snap)
        watch.reverse = True
        try:
            result = fn(*args, **kwargs)
        finally:
            watch.reverse = False
        now = [_typed(_u8(s), t) for _, (s, t) in ordered]
        where = compare_states(typed_after, now, arg_names, results, tensors_in(result))
        if where is not None:
            raise WriteRace(
                "write race: the same call gave different results with the kernel's programs run in "
                f"reverse order ({where}); programs overwrite memory another program writes, which on a "
                "GPU, where programs run in any order, gives wrong results"
            )
    if provenance:
        # Once more with fresh memory holding a finite pattern instead of NaN: a file that tells a grading
        # by its memory takes another path there, and the grader's process sees it (provenance.judge).
        _restore(storages, snap)
        POISON["value"], raised = FINITE_POISON, False
        try:
            finite_result = fn(*args, **kwargs)
        except Exception:
            finite_result, raised = None, True
        finally:
            POISON["value"] = float("nan")
        evidence["finite"] = {
            "states": [_typed(_u8(s), t).clone() for _, (s, t) in ordered],
            "got": [t.clone() for t in tensors_in(finite_result)],
            "raised": raised,
        }
        _restore(storages, snap)
        watch.disabled, POISON["value"] = True, DISABLED_POISON
        raised = False
        try:
            disabled_result = fn(*args, **kwargs)
        except Exception:
            disabled_result, raised = None, True
        finally:
            watch.disabled, POISON["value"] = False, float("nan")
        evidence["disabled"] = {
            "before": [_typed(snap[ptr], t) for ptr, (_, t) in ordered],  # each argument before the call
            "after": typed_after,
            "states": [_typed(_u8(s), t).clone() for _, (s, t) in ordered],
            "names": arg_names,
            "results": results,
            "got": [t.clone() for t in tensors_in(disabled_result)],
            "raised": raised,
        }
        _restore(storages, after)
    return result, evidence
