"""The messages between the grader and the learner's process (grader/learner_client.py and
learner/serve_calls.py).

A message is pickled, with three kinds of object sent by reference rather than by value:

  tensors   sent as (storage, dtype, shape, strides, offset), each storage once per message: CUDA
            storages through CUDA IPC (both processes see the same memory), CPU storages backed by a
            sparse file (drills/grading/shared/bigmem.py) as the file's path (both map it), other CPU storages
            as their bytes, which the learner's process sends back after a call so that in-place
            writes reach the grader's own tensors. A storage that came from the other side goes back
            as a reference to it, so a returned view of `out` is a view of the caller's own `out`.
  objects   that must stay in the learner's process (instances of its classes, its functions and
            kernels) travel as a handle; the grader holds a RemoteObject.
  callables of the grader (a hash_fn passed to the learner's code) travel as a handle too; calling
            one from the learner's process asks the grader to run it.
  lent      objects of the grader wrapped in `Lent(obj)` (C1 lends its L3 BlockManager to the
            learner's scheduler, which may not import the reference) travel as a handle ("L", key,
            class_view); the learner's process holds a proxy of a class rebuilt as the lent object's
            (its name, module and members), whose attribute reads ask the grader
            ("callback_getattr", key, name): plain values come back by value, methods as callbacks;
            calling the class asks the grader for a new object of the real class ("callback_new").
            A built-in exception the object raises (ValueError when the pool is out of blocks,
            KeyError, AttributeError) reaches the learner's code as the same class; a plain
            callback's failure stays a RuntimeError. The grader's object is never written: an
            attribute the learner's code sets stays on its proxy. The grader keeps the object itself,
            so a test can inspect it after the learner's code used it.
"""

from __future__ import annotations

import io
import pickle
import struct
import weakref

import torch

# Types sent by value; anything else the learner's process returns stays there, sent as a handle.
PLAIN = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    tuple,
    list,
    dict,
    set,
    frozenset,
    slice,
    range,
    torch.dtype,
    torch.device,
    torch.Size,
    type(Ellipsis),
)


class Lent:
    """An object of the grader's, passed to the learner's process by handle (see the module docstring):
    `impl.f(wire.Lent(manager))`. The learner's code reads its attributes and calls its methods; every
    read and call runs here, in the grader's process, on the object itself.

    like: the object the learner's code takes it for (default: obj itself). A grader's wrapper that
    records the calls (C1's Watched around L3's BlockManager) lends itself as the object it wraps: the
    proxy's class bears like's class's name, module and members, and a name like lacks raises like's
    AttributeError, so the learner's code cannot tell the grader's object from the one it is used with
    (by its type, its repr, its methods' type, or the wrapper's own attributes) and branch on that.

    module: the module the proxy's class says it comes from, where the object the learner's code is used
    with comes from another one than like's (C1 grades with L3's reference BlockManager; the engine
    hands the learner's scheduler the learner's own BlockManager once that passes its grader)."""

    __slots__ = ("obj", "like", "module")

    def __init__(self, obj, like=None, module=None):
        self.obj = obj
        self.like = obj if like is None else like
        self.module = module


def class_view(cls: type, module: str | None = None) -> tuple:
    """(module, qualname, members) of a lent object's class, as the learner's process rebuilds it:
    members are (name, "method" | "property" | "value", value) for every name that is not a dunder,
    plain values by value; module, where given, in place of the class's own."""
    import inspect

    members = []
    for name in dir(cls):
        if name.startswith("__") and name.endswith("__"):
            continue
        static = inspect.getattr_static(cls, name)
        if isinstance(static, property):
            members.append((name, "property", None))
        elif callable(static) or isinstance(static, (staticmethod, classmethod)):
            members.append((name, "method", None))
        elif is_plain(static):
            members.append((name, "value", static))
    return (module or cls.__module__, cls.__qualname__, tuple(members))


def tensors_in(value, found=None) -> list:
    """Every tensor in value (a tensor, or lists, tuples and dicts of them), in order."""
    found = [] if found is None else found
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            tensors_in(v, found)
    elif isinstance(value, dict):
        for v in value.values():
            tensors_in(v, found)
    return found


def is_plain(obj) -> bool:
    if type(obj) in PLAIN:
        return True
    return (type(obj).__module__ or "").split(".")[0] == "numpy"


def as_bytes_view(storage: torch.UntypedStorage) -> torch.Tensor:
    """The storage as a flat uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def payload_of(storage: torch.UntypedStorage):
    """How a storage travels: ("cuda", ipc args) | ("file", path, nbytes) | ("bytes", raw)."""
    if storage.device.type == "cuda":
        from torch.multiprocessing.reductions import reduce_tensor

        # torch shares CUDA memory per tensor: a uint8 tensor over the whole storage carries it.
        return ("cuda", reduce_tensor(as_bytes_view(storage))[1])
    if storage.device.type == "meta":  # no data: only its size travels
        return ("meta", storage.nbytes())
    from drills.grading.shared.bigmem import backing_file

    found = backing_file(storage)
    if found is not None:
        return ("file", *found)
    return ("bytes", as_bytes_view(storage).numpy().tobytes())


def _backed_by_file(storage) -> bool:
    from drills.grading.shared.bigmem import backing_file

    return backing_file(storage) is not None


class Storages:
    """What one side knows of the storages the two sides have exchanged."""

    def __init__(self):
        # Our storages that the other side has seen, by our data_ptr (weak: they die with our tensors).
        self.own: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        # Storages the other side sent: their key -> our storage, and our data_ptr -> their key.
        self.received: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self.key_of: dict[int, int] = {}
        self.copies: dict[int, torch.UntypedStorage] = {}  # their key -> our private copy, this request
        # Shared storages (CUDA, sparse files) we sent: kept alive until the other side drops its view, so
        # that it can always send them back by reference. `dropped`: keys of theirs we no longer hold.
        self.lent: dict[int, torch.UntypedStorage] = {}
        self.dropped: list[int] = []
        # Our storages are named by a serial number, never reused: an address is reused as soon as a
        # storage is freed, and the other side must not take a new storage for an old one it still holds.
        self._serials: dict[int, int] = {}  # id(storage) -> serial
        self._next = 0

    def serial(self, storage: torch.UntypedStorage) -> int:
        key = id(storage)
        if key not in self._serials:
            self._next += 1
            self._serials[key] = self._next
            weakref.finalize(storage, self._serials.pop, key, None)
        return self._serials[key]

    def receive(self, key: int, payload) -> torch.UntypedStorage:
        kind = payload[0]
        existing = self.received.get(key)
        if kind == "bytes":
            raw = payload[1]
            if existing is not None and existing.nbytes() == len(raw):
                if raw:  # the sender's bytes may have changed since: refresh our copy in place
                    as_bytes_view(existing).copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
                storage = existing
            else:
                u8 = (
                    torch.frombuffer(bytearray(raw), dtype=torch.uint8)
                    if raw
                    else torch.empty(0, dtype=torch.uint8)
                )
                storage = u8.untyped_storage()
            self.copies[key] = storage
        elif existing is not None:
            storage = existing  # shared memory: the same storage object as before
        elif kind == "meta":
            storage = torch.empty(payload[1], dtype=torch.uint8, device="meta").untyped_storage()
        elif kind == "cuda":
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            storage = rebuild_cuda_tensor(*payload[1]).untyped_storage()
        else:
            from drills.grading.shared.bigmem import register

            _, path, nbytes = payload
            storage = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8).untyped_storage()
            register(storage, path, nbytes)
        if self.received.get(key) is not storage:
            self.received[key] = storage
            ptr = storage.data_ptr()
            self.key_of[ptr] = key
            weakref.finalize(storage, self._drop, ptr, key, kind != "bytes")
        return storage

    def _drop(self, ptr: int, key: int, shared: bool) -> None:
        self.key_of.pop(ptr, None)
        if shared:
            self.dropped.append(key)

    def forget(self, keys) -> None:
        for key in keys:
            self.lent.pop(key, None)

    def take_copies(self) -> dict[int, bytes]:
        """{their key: bytes} of the private copies received in this request (to send back)."""
        out = {key: as_bytes_view(s).numpy().tobytes() for key, s in self.copies.items()}
        self.copies = {}
        return out

    def write_back(self, updates: dict[int, bytes]) -> None:
        """Bytes the other side sends back for storages of ours: write them into ours."""
        for key, raw in updates.items():
            storage = self.own.get(key)
            if storage is not None and raw:
                as_bytes_view(storage).copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))


class _Encoder(pickle.Pickler):
    def __init__(self, file, known: Storages, handle):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.known = known
        self.handle = handle
        self.payloads: dict[int, object] = {}

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            if obj.layout != torch.strided or obj.is_quantized:
                raise TypeError(f"a {obj.layout} tensor cannot be passed between the processes")
            storage = obj.untyped_storage()
            theirs = self.known.key_of.get(storage.data_ptr())
            if theirs is not None and self.known.received.get(theirs) is not storage:
                theirs = None  # a stale entry: that address now holds another storage
            key = self.known.serial(storage)
            if key not in self.payloads:
                # A storage the other side sent us goes back by reference alone when the memory is
                # shared (CUDA, sparse files); a private copy's bytes travel too, in case theirs is gone.
                shared = storage.device.type not in ("cpu", "meta") or _backed_by_file(storage)
                self.payloads[key] = None if (theirs is not None and shared) else payload_of(storage)
                self.known.own[key] = storage
                if shared and theirs is None:
                    self.known.lent[key] = storage
            return ("T", theirs, key, obj.dtype, tuple(obj.shape), tuple(obj.stride()), obj.storage_offset())
        return self.handle(obj)


class _Decoder(pickle.Unpickler):
    def __init__(self, file, known: Storages, payloads: dict, resolve):
        super().__init__(file)
        self.known = known
        self.payloads = payloads
        self.made: dict[int, torch.UntypedStorage] = {}
        self.resolve = resolve

    def persistent_load(self, pid):
        if pid[0] != "T":
            return self.resolve(pid)
        _, ours, key, dtype, shape, stride, offset = pid
        storage = self.known.own.get(ours) if ours is not None else None
        if storage is None and self.payloads.get(key) is None:
            raise RuntimeError("a shared storage came back after its owner freed it (grading harness bug)")
        if storage is None:  # new to us (or ours was freed meanwhile): build it from what was sent
            if key not in self.made:
                self.made[key] = self.known.receive(key, self.payloads[key])
            storage = self.made[key]
        if storage.device.type == "meta":  # no data, and meta storages cannot be re-viewed: a fresh one
            return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
        t = torch.empty(0, dtype=dtype, device=storage.device)
        return t.set_(storage, offset, shape, stride)


def settle() -> None:
    """Wait for this process's GPU work: the other process reads the same memory as soon as it gets
    the message, and CUDA runs kernels asynchronously."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def dumps(obj, known: Storages, handle) -> bytes:
    """Pickle obj. handle(obj) returns a persistent id for what travels by handle, else None."""
    settle()
    body = io.BytesIO()
    enc = _Encoder(body, known, handle)
    enc.dump(obj)
    dropped, known.dropped = known.dropped, []
    header = pickle.dumps((enc.payloads, dropped), protocol=pickle.HIGHEST_PROTOCOL)
    return struct.pack("<Q", len(header)) + header + body.getvalue()


def loads(data: bytes, known: Storages, resolve):
    (n,) = struct.unpack("<Q", data[:8])
    payloads, dropped = pickle.loads(data[8 : 8 + n])
    known.forget(dropped)
    return _Decoder(io.BytesIO(data[8 + n :]), known, payloads, resolve).load()
