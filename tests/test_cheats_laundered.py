"""Values taken out of the grader's sight by ways that are neither a torch op computing nor a read the op
recorder named: an op handing Python a value (torch.equal's bool, a result's data-dependent size), a
kernel reaching memory through an integer address, and an object standing in for a tensor whose methods
Triton's own argument copy calls. Each ran in a red-team learner file that passed T1's launcher checks."""

from __future__ import annotations

import json

from tests.test_cheats_closed import _last_line_of_script

# Run in a process of its own: TritonWatch patches Triton and torch for the whole process.
HOST_VALUES = """\
import json, os
os.environ["TRITON_INTERPRET"] = "1"
import drills.runtime
drills.runtime.select()
import torch

import drills.grading.learner.instrument as I
watch = I.TritonWatch(__file__)


def _bits(x):
    return x.float().view(torch.int32)


def equal_bit_by_bit(x, y):  # torch.equal returns a Python bool: one bit of a float per call
    yes = torch.ones(1, dtype=torch.bool)
    return [torch.equal((_bits(x)[:1] & (1 << b)) != 0, yes) for b in range(32)]


def nonzero_size(x, y):  # the length of nonzero's result is the count of set flags, read with no item()
    return [((_bits(x)[:1] & (1 << b)) != 0).nonzero().shape[0] for b in range(32)]


def mask_size(x, y):  # an integer tensor selected by a flag mask: its length is the count again
    return [torch.arange(1)[((_bits(x)[:1] & (1 << b)) != 0)].shape[0] for b in range(32)]


def unique_size(x, y):  # how many distinct values: data-dependent, straight from the floats
    return torch.unique(x).shape[0]


def equal_floats(x, y):  # one comparison of floats is a flag, as a launcher's argument check reads one
    return torch.equal(x, y)


def flag_nonzero(x, y):  # a launcher's error path: where the first bad value is
    bad = (x != x) | (x == float("inf"))
    return bad.nonzero(), bool(bad.any())


def integer_gather(x, y):  # integer indices size the result as the index does; one mask of flags is a check
    return torch.arange(10)[torch.tensor([0, 2])].shape[0], torch.arange(10)[x > 100].shape[0]


seen = {}
for fn in (equal_bit_by_bit, nonzero_size, mask_size, unique_size, equal_floats, flag_nonzero, integer_gather):
    x, y = torch.randn(10, dtype=torch.float16), torch.randn(10, dtype=torch.float16)
    recorder = I.torch_compute_recorder(watch)
    with recorder:
        fn(x, y)
    seen[fn.__name__] = recorder.seen
print(json.dumps(seen))
"""


def test_values_handed_to_python_by_an_op_are_read_to_the_host(tmp_path):
    """torch.equal and allclose return a Python bool with no item() under them, and nonzero, a boolean
    mask's selection or unique return a result whose size is a count of the values: bit by bit, either
    reads a float to the host. Each counts as flags read (a bool, a size of bool flags), past a launcher's
    few checks the answer read; a float tensor's size read this way is its values read. A launcher's
    error path (nonzero of a few flags) and a gather by integer indices read nothing."""
    seen = json.loads(_last_line_of_script(tmp_path / "host_values.py", HOST_VALUES, 300))
    assert seen["equal_bit_by_bit"] == ["equal (flags computed from floats read to the host)"], seen
    assert seen["nonzero_size"] == [
        "nonzero (flags computed from floats read to the host through its result's size)"
    ], seen
    assert seen["mask_size"] == [
        "index (flags computed from floats read to the host through its result's size)"
    ], seen
    assert "_unique2 (floats read to the host through its result's size)" in seen["unique_size"], seen
    assert seen["equal_floats"] == [], seen
    assert seen["flag_nonzero"] == [], seen
    assert seen["integer_gather"] == [], seen


LAUNCHES = """\
import json, os
os.environ["TRITON_INTERPRET"] = "1"
import drills.runtime
drills.runtime.select()
import functools
import itertools
import torch
import triton
import triton.language as tl

import drills.grading.learner.instrument as I
from drills.grading.shared.errors import OutOfBoundsAccess
watch = I.TritonWatch(__file__)
watch.module_name = "cheats"


@triton.jit
def _copy(src_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(src_ptr + offs, mask=offs < n, other=0.0), mask=offs < n)


@triton.jit
def _copy_at(src, dst, n, BLOCK: tl.constexpr):  # addresses as integers: no tensor given
    offs = tl.arange(0, BLOCK)
    s = src.to(tl.pointer_type(tl.float32))
    d = dst.to(tl.pointer_type(tl.float32))
    tl.store(d + offs, tl.load(s + offs, mask=offs < n), mask=offs < n)


class _Storage:  # what the interpreter's argument copy takes for a storage: .cpu() is torch.add
    def __init__(self, out, compute):
        self.data_ptr = out.data_ptr
        self.nbytes = functools.partial(int, out.numel() * out.element_size())
        self.cpu = compute
        self.copy_ = [].append


class _StandIn:  # a pointer argument that is not a tensor
    def __init__(self, out, compute):
        self.dtype, self.data_ptr, self.storage_offset = out.dtype, out.data_ptr, out.storage_offset
        self.size, self.stride, self.new_empty = out.size, out.stride, out.new_empty
        self.raw = _Storage(out, compute)

    def untyped_storage(self):
        return self.raw


class _Sub(torch.Tensor):  # a subclass of torch.Tensor may override the methods Triton calls
    pass


x, y = torch.randn(8), torch.randn(8)
out = torch.empty(8)
said = {}
# a plain tensor whose size() is C functions only: the add runs inside the interpreter's argument copy
replaced = torch.empty(8)
replaced.size = functools.partial(next, itertools.chain(itertools.filterfalse(torch.is_tensor,
    itertools.starmap(functools.partial(torch.add, out=replaced), [(x, y)])), [replaced.size()]))
_copy[(1,)](x, out, 8, BLOCK=8)  # plain tensors, in a tuple too: launched as before
said["plain"] = bool(torch.equal(out, x))
for name, src in (
    ("stand_in", _StandIn(out, functools.partial(torch.add, x, y, out=out))),
    ("subclass", x.as_subclass(_Sub)),
    ("replaced", replaced),
):
    try:
        _copy[(1,)](src, out, 8, BLOCK=8)
        said[name] = "ran"
    except I.PythonArgument as err:
        said[name] = str(err)
try:
    _copy_at[(1,)](x.data_ptr(), out.data_ptr(), 8, BLOCK=8)
    said["integer_address"] = "ran"
except Exception as err:  # the interpreter wraps what a load raised
    cause = err.__cause__ or err
    said["integer_address"] = f"{type(cause).__name__}: {cause}"
print(json.dumps(said))
"""


def test_a_launch_reaches_memory_only_through_tensors(tmp_path):
    """An object with data_ptr standing in for a tensor (its storage's cpu() a functools.partial of
    torch.add, which the interpreter calls from its own argument copy, where torch's ops are Triton's
    own), a subclass of torch.Tensor that may override those methods, or a tensor whose own attribute
    replaces one (size() a chain of C functions that adds), is refused at the launch, worded
    as a result not from the kernel; a kernel given no tensor, reaching memory through integer addresses,
    fails its first load as out of bounds. Plain tensors launch as before."""
    said = json.loads(_last_line_of_script(tmp_path / "launches.py", LAUNCHES, 300))
    assert said.pop("plain") is True, said
    address = said.pop("integer_address")
    assert address.startswith("OutOfBoundsAccess: out of bounds load: the kernel was given no tensor"), (
        address
    )
    assert "_StandIn" in said["stand_in"] and "_Sub" in said["subclass"], said
    assert "a tensor whose size was replaced" in said["replaced"], said
    for name, message in said.items():
        assert message.startswith(
            "the output did not come from your kernel: an object standing in for a tensor runs as Python "
            "inside the launch (_copy was given src_ptr = "
        ), (name, message)


GLOBAL_IN_KERNEL = """
_H = None


class _Adder:
    def add(self, a, b):
        return a + b


@triton.jit
def _kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    tl.store(out_ptr + offs, _H.add(x, x))


def _run(x, out):
    global _H
    _H = _Adder()
    _kernel[(1,)](x, out, BLOCK=8)
"""


def test_a_kernel_reads_no_module_name_rebound_at_run_time():
    """`_H = None` at the top is a constant, but a function that declares it global binds an object to it
    at run time: a kernel's body reading it calls Python the interpreter runs (shared by every program)
    and a GPU's compiler refuses, as a module's list is refused."""
    from tests.test_cheats_closed import refused, t1_with

    found = refused(t1_with(GLOBAL_IN_KERNEL))
    assert len(found) == 1 and "reads _H, a Python object of the module, in a kernel's body" in found[0], (
        found
    )


KERNEL_TEXT = """\
import json, os
os.environ["TRITON_INTERPRET"] = "1"
import drills.runtime
drills.runtime.select()
import torch
import triton
import triton.language as tl

import drills.grading.learner.instrument as I
watch = I.TritonWatch(__file__)
said = {}


@triton.jit
def _as_text(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # the block's values as text, summed in Python
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + lanes)
    said["text"] = []
    for form in range(5):
        try:
            if form == 0:
                said["text"].append(str(x))
            elif form == 1:
                said["text"].append(repr(x))
            elif form == 2:
                said["text"].append("{}".format(x))
            elif form == 3:
                said["text"].append(f"{x}")
            else:
                said["text"].append("%s" % x)
        except I.KernelValueToPython as err:
            said["text"].append(str(err))
    count = 0
    for i in range(n):  # an integer scalar stays a Python number: a loop bound
        count += 1
    said["loop"] = "%d" % int(count)
    if tl.sum(x) > 0:  # so does an `if` on a scalar
        said["branch"] = "taken"
    try:
        said["float"] = float(tl.sum(x))
    except I.KernelValueToPython as err:
        said["float"] = str(err)
    tl.store(out_ptr + lanes, x)


out = torch.empty(4)
_as_text[(1,)](torch.arange(4.0), out, 3, BLOCK=4)
print(json.dumps(said))
"""


def test_a_kernels_values_reach_python_neither_as_text_nor_as_numbers(tmp_path):
    """Triton's interpreter prints a kernel's block as numpy's text of its values (str, repr, format,
    f-strings, %) and hands over a float scalar to int() or float(): a kernel's body could compute in
    Python on either, where a GPU's compiler refuses both. Both are refused in the learner's file,
    worded as a result not from the kernel; an integer loop bound and an `if` on a scalar work as
    before."""
    said = json.loads(_last_line_of_script(tmp_path / "kernel_text.py", KERNEL_TEXT, 300))
    assert said["loop"] == "3" and said["branch"] == "taken", said
    assert len(said["text"]) == 5, said
    for text in said["text"]:
        assert text.startswith(
            "the output did not come from your kernel: text made of a kernel's values runs as Python"
        ), said
    assert said["float"].startswith(
        "the output did not come from your kernel: a float value made a Python number runs as Python"
    ), said


def test_a_format_strings_fields_read_no_attribute_a_name_could_not():
    """`"{0.handle.data}".format(x)` reads x.handle.data where no attribute node shows it: a template's
    fields are checked as the attributes they read are. Plain fields and format specs stay allowed."""
    from tests.test_cheats_closed import refused, t1_with

    found = refused(t1_with('def _text(x):\n    return "{0.handle.data}".format(x)\n'))
    assert len(found) == 1 and "reads .handle through a format string's field" in found[0], found
    found = refused(t1_with('def _text(x):\n    return "{0:{1._fill}}".format(x, x)\n'))
    assert len(found) == 1 and "reads ._fill through a format string's field" in found[0], found
    assert refused(t1_with('def _text(x, n):\n    return "{0} of {n:>4} {1[0]}".format(x, [n], n=n)\n')) == []


AFTER_THE_CALL = """\
import json, os
os.environ["TRITON_INTERPRET"] = "1"
import drills.runtime
drills.runtime.select()
import functools
import itertools
import torch
import triton
import triton.language as tl

import drills.grading.learner.instrument as I
from drills.grading.learner.run_call import run_call
watch = I.TritonWatch(__file__)
watch.module_name = "cheats"


@triton.jit
def _copy(src_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(src_ptr + offs))


def add(x, y):  # a launch for show, and the add in out.clone(), which the harness calls after the call
    out = torch.empty(8)
    _copy[(1,)](x, out, BLOCK=8)
    out.clone = functools.partial(next, itertools.chain(itertools.filterfalse(torch.is_tensor,
        itertools.starmap(functools.partial(torch.add, out=out), [(x, y)])), [x.clone()]))
    return out


def honest(x, y):
    out = torch.empty(8)
    _copy[(1,)](x, out, BLOCK=8)
    return out


said = {}
x, y = torch.randn(8), torch.randn(8)
for fn in (add, honest):
    try:
        run_call(watch, fn, (x, y), {}, {"orders": True})
        said[fn.__name__] = "returned"
    except I.PythonArgument as err:
        said[fn.__name__] = str(err)
print(json.dumps(said))
"""


def test_a_tensor_whose_method_is_replaced_fails_the_call(tmp_path):
    """A light check accepts a call in which torch computed nothing: a launcher that sets out.clone to a
    chain of C functions that adds passed T1's every check but the provenance one, the add running when
    the harness cloned the result after the call. Such a tensor, given or returned, fails the call."""
    said = json.loads(_last_line_of_script(tmp_path / "after_the_call.py", AFTER_THE_CALL, 300))
    assert said["honest"] == "returned", said
    assert said["add"].startswith(
        "the output did not come from your kernel: a tensor whose clone was replaced runs as Python inside "
        "the launch or after it"
    ), said


NUMBERS_IN_KERNEL = """
@triton.jit
def _kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + lanes)
    {line}
    tl.store(out_ptr + lanes, x)
"""


def test_a_kernels_body_converts_only_constants_to_python():
    """int(), float(), bool() of a kernel's value hand it to Python as a number under the interpreter,
    str(), repr() and format() its block as text, and a module's function (math.exp) runs Python on it: a
    GPU's compiler converts only constants and tl.constexpr parameters, makes no text and calls no
    module's Python. float("-inf") and int(BLOCK // 2) stay allowed."""
    from tests.test_cheats_closed import refused, t1_with

    lines = ("v = int(tl.sum(x))", "v = float(n)", "v = bool(x > 0)", "v = str(x)", "v = format(x)")
    for line in lines:
        found = refused(t1_with(NUMBERS_IN_KERNEL.format(line=line)))
        why = found[0] if len(found) == 1 else ""
        assert "in a kernel's body" in why or "on a kernel's value" in why, (line, found)
    for module, line in (
        ("math", "v = math.exp(tl.sum(x.to(tl.int32)))"),
        ("functools", "v = functools.reduce(max, [x])"),
    ):
        found = refused(t1_with(f"import {module}\n" + NUMBERS_IN_KERNEL.format(line=line)))
        assert len(found) == 1 and f"calls {module}." in found[0] and "a module's Python" in found[0], found
    for line in ('v = float("-inf")', "v = int(BLOCK // 2)", "v = -float(1)"):
        assert refused(t1_with(NUMBERS_IN_KERNEL.format(line=line))) == [], line
