"""Objects of the learner's process as the grader holds them: `RemoteObject` (a function, kernel, class
or instance living there), `RemoteMethod` (a method called by name), `RemoteModule` (the learner's
module, handle 0). Every attribute read, call and operator is a request to LearnerProcess (learner_client.py),
so tests use them exactly like the objects themselves (impl.paged_decode(...), impl.Kernel[grid](...),
impl.BlockManager(...).allocate(...))."""

from __future__ import annotations

from drills.grading.shared.errors import LearnerCrash

# proc below is a learner_client.LearnerProcess; learner_client.py imports this module, so the type is not
# imported here (not even for annotations): the two modules stay a one-way dependency.


class RemoteObject:
    """Something that lives in the learner's process: a function, a kernel, a class, an instance."""

    __slots__ = ("_proc", "_key", "_kind", "_typename", "_generation", "__weakref__")

    def __init__(self, proc, key: int, kind: str, typename: str):
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

    def __init__(self, proc, key: int, name: str):
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

    def __init__(self, proc):
        super().__init__(proc, 0, "module", "module")

    @property
    def __name__(self):
        return self._proc.module_name

    def _drills_record_launches(self):
        return self._proc.record_launches()

    def _drills_record_loads(self, tensors):
        return self._proc.record_loads(tensors)

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
