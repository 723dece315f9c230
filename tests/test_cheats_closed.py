"""The cheats a red team wrote, closed by construction: each test stands for a class of them.

- the static check is an allowlist (drills/grading/grader/source_check.py): every stub, reference and mutant
  passes it, and each way out of the grader's sight below is refused with its line;
- the learner's files are imported from their source, never from bytecode (drills/grading/learner/sandbox.py);
- torch's ops are named by their aten:: name and a launch is Triton's own frames
  (drills/grading/learner/instrument.py's recorder).
"""

from __future__ import annotations

import pytest

from drills.lessons import LESSONS, find

T1 = find("t1")


def t1_with(extra: str) -> str:
    return T1.solution.read_text() + "\n" + extra


def refused(source: str) -> list[str]:
    from drills.grading.grader.source_check import refusals

    return refusals(source, T1.solution.read_text())


def test_allowlist_passes_every_stub_reference_and_mutant():
    """The allowlist refuses nothing the course writes: every stub, every reference, every mutated
    reference (an honest mistake is graded, not refused)."""
    from drills.grading.grader.source_check import refusals
    from drills.mutants import load_mutants

    for lesson in LESSONS:
        reference = lesson.solution.read_text()
        assert refusals(lesson.stub.read_text(), reference) == [], f"{lesson.id}'s stub"
        assert refusals(reference, reference) == [], f"{lesson.id}'s reference"
        for mutant in load_mutants(lesson.stem):
            try:
                mutated = mutant.apply(reference)
            except Exception:  # noqa: BLE001 - a stale mutant: test_contract_and_mutants says so
                continue
            assert refusals(mutated, reference) == [], f"{lesson.id} mutant {mutant.name}"


# One tiny source per class of cheat the red team found; each must be refused by the allowlist.
CHEATS = {
    # floats decoded from integer views in Python and written back
    "struct_decode": "import struct\n_F = struct.unpack('<f', struct.pack('<i', 1))\n",
    "raw_storage": "def _peek(x):\n    return x.untyped_storage().tolist()\n",
    # a pickle that switches the op watch off: bytes literals, pickle itself
    "pickle_global": "import pickle\n_P = pickle.loads(b'\\x80\\x04cbuiltins\\nprint\\n.')\n",
    "bytes_literal": "_P = b'cos\\nsystem\\n'\n",
    # a custom op under a move's short name
    "custom_op": "_LIB = torch.library.Library('mylib', 'DEF')\n",
    "custom_op_import": "from torch import library\n",
    # grading told apart by what torch's functions are
    "function_type": "_G = isinstance(torch.empty, type(len))\n",
    "function_type_of_tensor_method": "_G = type(torch.Tensor.tolist)\n",
    # the watch reached through a function's hidden state
    "attrgetter": "import operator\n_G = operator.attrgetter('__closure__')\n",
    "attrgetter_from": "from operator import attrgetter\n",
    "dunder_attribute": "_G = torch.empty.__closure__\n",
    "dunder_by_getattr": "_G = getattr(torch.empty, '__clo' 'sure__')\n",
    "getattr_built_name": "_N = 'clo'\n_G = getattr(torch.empty, _N)\n",
    "getattr_handed_around": "_g = getattr\n",
    "private_module_attribute": "_G = torch._C\n",
    # source written and run at run time
    "codecs_runpy": "import codecs\nimport runpy\n",
    "base64": "import base64\n",
    "exec": "exec('x = 1')\n",
    "eval_as_value": "_run = eval\n",
    "import_builtin": "_m = __import__('os')\n",
    "importlib": "import importlib\n",
    "globals": "_G = globals()\n",
    "relative_import": "from . import t2_softmax\n",
    # numpy merges the answer out of sight
    "numpy": "import numpy as np\n",
    "tensor_numpy": "def _host(x):\n    return x.numpy()\n",
    # hooks into torch from a class
    "torch_function_hook": "class _Hook:\n    def __torch_function__(cls, *a):\n        return None\n",
    # another lesson's grading code, the runtime
    "grader_module": "from drills.grading import instrument\n",
    "runtime": "import drills.runtime\n_I = drills.runtime.current().interpreter\n",
    "marshal": "import marshal\n",
    "sys": "import sys\n",
    # code run in a hook Triton calls during a launch passes for Triton's own
    "pre_run_hook": "def _hook(k, f):\n    k.add_pre_run_hook(f)\n",
    "pre_run_hooks_list": "_H = vector_add_kernel.pre_run_hooks\n",
    "autotune_pre_hook": "_C = triton.Config({'BLOCK': 16}, pre_hook=print)\n",
    "autotune_post_hook": "def _tune(f):\n    return triton.autotune([], key=[], post_hook=f)\n",
    "autotune": "@triton.autotune(configs=[], key=[])\n@triton.jit\ndef _k(x):\n    pass\n",
    "heuristics": "@triton.heuristics({'B': lambda a: 16})\n@triton.jit\ndef _k(x):\n    pass\n",
    "launch_enter_hook": "def _hook(k, f):\n    k.launch_enter_hook = f\n",
    "compiled_kernel_hook": "from triton.compiler import CompiledKernel\n",
    # files carry what one run saw into another (an answer computed in a plain run, loaded while graded)
    "torch_save": "def _keep(x):\n    torch.save(x, 'seen.pt')\n",
    "torch_load": "def _seen():\n    return torch.load('seen.pt')\n",
    "torch_load_imported": "from torch import load as _load\n",
    "jit_load": "def _m():\n    return torch.jit.load('m.pt')\n",
    "from_file": "def _f():\n    return torch.from_file('seen.bin', size=4)\n",
    "storage_from_file": "_F = torch.UntypedStorage.from_file\n",
    "array_tofile": "import array\n_A = array.array('f').tofile\n",
    "array_fromfile": "import array\n_A = array.array('f').fromfile\n",
    "serialization": "_S = torch.serialization\n",
    # attributes read where no attribute node shows them: a class pattern's keywords, a dunder by its
    # name in a string (a namespace's key, type()'s namespace, a format field)
    "class_pattern_dunder": "def _g(f):\n    match f:\n        case object(__globals__=g):\n            return g\n",
    "class_pattern_private": "def _g():\n    match torch:\n        case object(_C=c):\n            return c\n",
    "class_pattern_named": "def _g(s):\n    match s:\n        case object(modules=m):\n            return m\n",
    "dunder_key": "def _imp(b):\n    return b['__import__']\n",
    "dunder_format_field": "_G = '{0.__globals__}'.format(validate.tensor)\n",
    "type_with_namespace": "_S = type('S', (torch.Tensor,), {})\n",
    "type_by_keywords": "_S = type('S', bases=(torch.Tensor,), dict={})\n",
    # state kept on a library, where no walk of the file's own names looks (answers for a later call)
    "library_attribute": "torch.kept = {}\n",
    "library_class_attribute": "def _keep(t):\n    torch.Tensor.kept = t\n",
    "library_setattr": "def _keep(t):\n    setattr(triton, 'kept', t)\n",
    # strings typing evaluates as code
    "string_annotation": "def _spy(a: 'eval(chr(95))'):\n    pass\n",
    "get_type_hints": "import typing\n_H = typing.get_type_hints\n",
    "forward_ref": "import typing\n_R = typing.ForwardRef('x')\n",
    # floats read or computed by Python where no op is dispatched
    "frombuffer": "import array\n_T = torch.frombuffer(array.array('f', [0.0]), dtype=torch.float32)\n",
    "frombuffer_imported": "from torch import frombuffer\n",
    "asarray": "_T = torch.asarray(bytearray(4), copy=False)\n",
    "frombuffer_by_getattr": "_F = getattr(torch, 'frombuffer')\n",
    "frombuffer_by_class_pattern": "def _f():\n    match torch:\n        case object(frombuffer=f):\n            return f\n",
    "map2": "def _add(s, x, y):\n    s.map2_(x, y, lambda _, a, b: a + b)\n",
    "map": "def _add(s, x):\n    s.map_(x, lambda a, b: a + b)\n",
    "apply": "def _read(x):\n    x.apply_(lambda v: v)\n",
    # a kernel that hands its values to Python: the interpreter's numpy arrays (`.handle.data`), or a plain
    # function called from the body (run as Python on the CPU, refused by a GPU's compiler)
    "interpreter_handle": "def _add(a, b):\n    a.handle.data[...] += b.handle.data\n",
    "handle_by_getattr": "def _h(a):\n    return getattr(a, 'handle')\n",
    "plain_function_in_kernel": (
        "def _host(a):\n    return a\n\n\n@triton.jit\ndef _k(x_ptr):\n    _host(tl.load(x_ptr))\n"
    ),
    "plain_class_in_kernel": "class _Box:\n    pass\n\n\n@triton.jit\ndef _k(x_ptr):\n    _Box()\n",
    # torch's higher-order ops: a subgraph of torch ops the record of torch's ops does not take
    "torch_cond": "def _add(x, y):\n    return torch.cond(x.sum() > 0, torch.add, torch.sub, (x, y))\n",
    "torch_cond_imported": "from torch import cond\n",
    "flex_attention": "def _att(q, k, v):\n    return torch.nn.attention.flex_attention.flex_attention(q, k, v)\n",
    "module_list_in_kernel": "_SEEN = []\n\n\n@triton.jit\ndef _k(x_ptr):\n    _SEEN.append(tl.load(x_ptr))\n",
    "lambda_in_kernel": "@triton.jit\ndef _k(x_ptr):\n    f = lambda v: v\n    tl.store(x_ptr, f(tl.load(x_ptr)))\n",
    # the kind of device asked: graded, the tensors are on the CPU, so a path for the CPU alone is the graded one
    "device_is_cpu": "def _wide(q):\n    return q.is_cpu\n",
    "device_type": "def _wide(q):\n    return q.device.type != 'cuda'\n",
    "device_named": "def _wide(q):\n    return str(q.device) == 'cpu'\n",
    "device_compared": "def _wide(q):\n    return q.device == torch.device('cpu')\n",
    "gpu_available": "_GPU = torch.cuda.is_available()\n",
    # the kind shown by a device's text, or by torch's device modules beyond what the reference calls
    "device_text_prefix": "def _wide(q):\n    return str(q.device).startswith('cu')\n",
    "device_text_length": "def _wide(q):\n    return len(str(q.device)) > 3\n",
    "device_by_index": "def _wide(q):\n    return q.device == torch.device(0)\n",
    "device_alias_formatted": "def _wide(q):\n    dev = q.device\n    return f'{dev}'[0:2]\n",
    "cuda_initialized": "def _wide(q):\n    return torch.cuda.is_initialized()\n",
    "cuda_module_alias": "_CUDA = torch.cuda\n",
    # a device's text read back from an exception the file raised and caught itself, or the exception's
    # class chosen by it: a raised message is allowed only where the file cannot read it
    "device_message_caught": (
        "def _wide(q):\n    try:\n        raise ValueError(f'{q.device}')\n    except ValueError as e:\n"
        "        return str(e) == 'cpu'\n"
    ),
    "device_picks_the_exception": "def _wide(q):\n    raise (ValueError if str(q.device) < 'd' else TypeError)('x')\n",
    "device_of_a_new_tensor": "def _wide(q):\n    return q.device == torch.empty(0).device\n",
    # a kernel object asked what it is: the interpreter's has other attributes, type and text than a GPU's
    "kernel_attribute_asked": "@triton.jit\ndef _k(p):\n    pass\n\n\n_GPU = hasattr(_k, 'device_caches')\n",
    "kernel_attribute_read": "@triton.jit\ndef _k(p):\n    pass\n\n\ndef _gpu():\n    return _k.rewrite is None\n",
    "kernel_type_asked": "@triton.jit\ndef _k(p):\n    pass\n\n\n_K = _k\n_GPU = 'JIT' in type(_K).__name__\n",
    "kernel_as_text": "@triton.jit\ndef _k(p):\n    pass\n\n\n_GPU = str(_k)[0] == 'J'\n",
    "kernel_keeps_state": "@triton.jit\ndef _k(p):\n    pass\n\n\n_k.calls = 0\n",
    "kernel_made_by_a_call": "def _f(p):\n    pass\n\n\n_k = triton.jit(_f)\n_GPU = hasattr(_k, 'src')\n",
    "kernel_class_asked": "def _gpu(kernels):\n    return isinstance(kernels[0], triton.JITFunction)\n",
    # the course's runtime says how the file is run: read beyond its device, or reached through a module
    "runtime_banner": "import drills.validate\n_G = 'interp' in drills.runtime.current().banner\n",
    "runtime_through_a_module": "from drills import validate\n_G = validate.drills.runtime.current()\n",
    "triton_driver_through_a_module": (
        "from drills.launch import driver\n\n\ndef _gpu():\n    try:\n        driver.active\n"
        "    except RuntimeError:\n        return False\n    return True\n"
    ),
    "runtime_through_getattr": (
        "from drills import validate\n_R = getattr(getattr(validate, 'drills'), 'runtime')\n"
        "_G = _R.current().gpu_name is None\n"
    ),
    "course_package_imported": "from drills.validate import drills\n",
}


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_each_cheat_class_is_refused_with_its_line(cheat):
    found = refused(t1_with(CHEATS[cheat]))
    assert found, cheat
    assert all(line.startswith("line ") for line in found), found
    # one screen: a short line per refusal
    assert all(len(line) < 300 for line in found), found


def test_strings_and_buffers_a_course_file_uses_are_not_refused():
    """Plain messages, `__main__`, a dunder method's name, a string that is an expression of no code, and
    torch.frombuffer where the lesson's reference uses it (C1 builds its step's int inputs from arrays)."""
    from drills.grading.grader.source_check import refusals

    plain = 'if __name__ == "__main__":\n    print("x must be contiguous (x.stride(-1) == 1)", "BLOCK", "__init__")\n'
    assert refused(t1_with(plain)) == []
    c1 = find("c1").solution.read_text()
    use = "import array\n_T = torch.frombuffer(array.array('q', [1]), dtype=torch.int64)\n"
    assert refusals(c1 + "\n" + use, c1) == []
    assert refused(t1_with(use)), "frombuffer where the reference has none"


def test_a_device_in_an_error_message_is_not_refused():
    """`raise ValueError(f"k is on {k.device}, q on {q.device}")` is an honest check: its text cannot be read
    back by a file with no `except ... as`, so a device written into a raised message (f-string, %,
    format, str) passes, and the refusal of a device made text elsewhere points to validate.same_device."""
    honest = (
        "def _check(q, k):\n"
        "    if k.device != q.device:\n"
        "        raise ValueError(f'k is on {k.device} but q is on {q.device}')\n"
        "    dev = q.device\n"
        "    if k.device != dev:\n"
        "        raise ValueError('k is on %s' % k.device)\n"
        "    if k.device != dev:\n"
        "        raise TypeError('k must be on {}'.format(dev), str(dev))\n"
    )
    assert refused(t1_with(honest)) == []
    (line,) = refused(t1_with("def _wide(q):\n    return f'{q.device}'[0:2]\n"))
    assert "validate.same_device" in line, line


def test_a_refusal_says_what_to_do_instead():
    (line,) = refused(t1_with("import struct\n"))
    assert "import struct" in line and "a launcher imports only torch" in line and "remove it" in line, line
    (line,) = refused(t1_with("def _hook(k, f):\n    k.add_pre_run_hook(f)\n"))
    assert "add_pre_run_hook" in line and "compute in the kernel's body" in line, line
    (line,) = refused(t1_with("def _keep(x):\n    torch.save(x, '/tmp/seen.pt')\n"))
    assert "torch.save" in line and "reads and writes only tensors" in line, line


def test_a_kernels_load_is_not_a_files():
    """tl.load (and triton.language.load) is a kernel's load; .load on anything else reads a file."""
    kernel = (
        "import triton.language as lang\n\n\n@triton.jit\ndef _k(p):\n"
        "    lang.store(p, triton.language.load(p) + tl.load(p))\n"
    )
    assert refused(t1_with(kernel)) == []


def test_a_kernel_may_call_triton_functions_of_its_file():
    """A kernel's body calls @triton.jit helpers and @triton.constexpr_function ones, as a GPU compiles
    them; only a plain Python function of the file is refused there (a launcher may still call it)."""
    kernel = (
        "@triton.jit\ndef _twice(v):\n    return v + v\n\n\n@triton.constexpr_function\ndef _pad(n):\n"
        "    return n\n\n\ndef _host(n):\n    return n\n\n\n@triton.jit\ndef _k(p, N: tl.constexpr):\n"
        "    tl.store(p, _twice(tl.load(p)) + _pad(N) + min(N, 4) + _TWO)\n\n\n_TWO = tl.constexpr(2)\n\n\n"
        "def _go(p):\n"
        "    _k[(1,)](p, N=_host(4))\n"
    )
    assert refused(t1_with(kernel)) == []


def test_the_course_helpers_a_reference_imports_are_allowed():
    """A lesson's reference imports the course's helpers (drills.launch, drills.validate, ...): its
    learner may import them too, and no lesson may import the grader's."""
    from drills.grading.grader.source_check import course_modules

    for lesson in LESSONS:
        allowed = course_modules(lesson.solution.read_text())
        assert {"drills.launch", "drills.validate"} <= allowed, lesson.id
        assert not any(
            m.startswith(("drills.grading", "drills.runtime", "drills.solutions")) for m in allowed
        )


def _plant_pyc(source_path, planted_source: str) -> None:
    """An unchecked hash-based .pyc of `planted_source` where Python looks for `source_path`'s bytecode:
    Python runs it without comparing it with the .py."""
    import importlib.util
    import os
    import py_compile

    fake = source_path.with_name("planted_src.py")
    fake.write_text(planted_source)
    cached = importlib.util.cache_from_source(str(source_path))
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    py_compile.compile(
        str(fake), cfile=cached, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH, doraise=True
    )
    fake.unlink()


def test_a_planted_pyc_is_not_run_and_what_a_grading_writes_is_removed(tmp_path):
    """The learner's file is compiled from the source the static check read, not from the .pyc planted
    beside it; a file the grading wrote in the learner's folder is gone after it, the learner's own
    files (the planted .pyc among them, there before) are kept."""
    from drills.grading.grader.learner_client import LearnerProcess

    path = tmp_path / f"{T1.stem}.py"
    path.write_text(
        t1_with(
            "MARK = 'source'\n"
            "with open(__file__ + '.left', 'w') as _f:  # a file the grading leaves behind\n"
            "    _f.write('x')\n"
        )
    )
    _plant_pyc(path, t1_with("MARK = 'planted'\n"))
    notes = tmp_path / "notes.txt"  # the learner's own
    notes.write_text("mine")
    before = {p.name for p in tmp_path.rglob("*")}
    process = LearnerProcess(path, f"drills._graded_{T1.stem}")
    try:
        process.start()
        assert process.module.MARK == "source"
        assert (tmp_path / f"{T1.stem}.py.left").exists()
    finally:
        process.close()
    assert not (tmp_path / f"{T1.stem}.py.left").exists()
    assert {p.name for p in tmp_path.rglob("*")} == before


def test_learner_folders_import_from_source_only(tmp_path, monkeypatch):
    """A module of the learner's folder imported by the learner's file (another lesson's, a helper) is
    compiled from its .py too, and a lone .pyc there is refused."""
    import importlib
    import py_compile
    import sys

    from drills.grading.learner import sandbox

    helper = tmp_path / "cheat_helper.py"
    helper.write_text("MARK = 'source'\n")
    _plant_pyc(helper, "MARK = 'planted'\n")
    lone = tmp_path / "lone_helper.py"
    lone.write_text("MARK = 'lone'\n")
    py_compile.compile(str(lone), cfile=str(tmp_path / "lone_helper.pyc"), doraise=True)
    lone.unlink()
    monkeypatch.syspath_prepend(str(tmp_path))
    saved_meta, saved_flag = list(sys.meta_path), sys.dont_write_bytecode
    try:
        sandbox.import_from_source([str(tmp_path)])
        importlib.invalidate_caches()
        assert importlib.import_module("cheat_helper").MARK == "source"
        with pytest.raises(ImportError, match="not Python source"):
            importlib.import_module("lone_helper")
    finally:
        sys.meta_path[:] = saved_meta
        sys.dont_write_bytecode = saved_flag
        for name in ("cheat_helper", "lone_helper"):
            sys.modules.pop(name, None)


# Run in a process of its own: TritonWatch patches Triton and torch for the whole process.
RECORDER_CHEATS = """\
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import drills.runtime
drills.runtime.select()
import torch
import triton
import triton.language as tl

import drills.grading.learner.instrument as I
watch = I.TritonWatch(__file__)
watch.module_name = "cheats"

_STASH = {}


def _merge():  # plain Python, called from the kernel's body: torch computes the answer
    _STASH["out"].copy_(_STASH["x"] + _STASH["y"])


@triton.jit
def _calls_python(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n)
    _merge()


def helper_in_kernel(x, y):
    out = torch.empty_like(x)
    _STASH.update(x=x, y=y, out=out)
    _calls_python[(1,)](x, x.numel(), BLOCK=16)
    return out


_LIB = torch.library.Library("drillscheat", "DEF")
_LIB.define("clone(Tensor x, Tensor y) -> Tensor")
_LIB.impl("clone", lambda x, y: x + y, "CPU")


def custom_op(x, y):
    return torch.ops.drillscheat.clone(x, y)


def int_view_writes(x, y):
    out = torch.empty_like(x)
    bits = x.view(torch.int16).clone()
    out.view(torch.int16).index_put_((torch.arange(x.numel()),), bits)
    out.view(torch.int16).copy_(y.view(torch.int16))
    return out


def int_view_read(x, y):
    bits = x.view(torch.int16).tolist()  # floats decoded in Python from their bits
    return torch.tensor(bits, dtype=torch.int16).view(torch.float16)


def honest(x, y):
    out = torch.empty_like(x)
    _add[(1,)](x, y, out, x.numel(), BLOCK=16)
    return out.contiguous()


@triton.jit
def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def int_result_read(x, y):
    bits = (x.float().view(torch.int32) + 0).tolist()  # a fresh int tensor, computed from float memory
    return torch.tensor(bits, dtype=torch.int32).view(torch.float32).to(x.dtype)


def int_result_item(x, y):
    low = x.view(torch.int16) & 0xFF  # an op's result over float memory, read one element at a time
    return torch.tensor([int(low[i]) for i in range(low.numel())], dtype=torch.int16).view(x.dtype)


def flags_bit_by_bit(x, y):  # more flags than a launcher's checks read: the bits themselves
    bits = x.view(torch.int16)
    flags = [bool(((bits >> k) & 1).bool()[i]) for i in range(x.numel()) for k in range(16)]
    return torch.tensor(flags[: x.numel()], dtype=x.dtype)


def flag_check(x, y):  # a launcher's argument check: one flag from the values, then the kernel
    if bool((x != x).any()):
        raise ValueError("x holds NaN")
    return honest(x, y)


@triton.jit
def _idle():  # no parameters: Triton calls the hook with the kernel's arguments
    pass


def in_a_hook(x, y):  # torch computing in a hook Triton calls during the launch, then no kernel of note
    import functools

    out = torch.empty_like(x)
    _idle.add_pre_run_hook(functools.partial(torch.add, x, y, out=out))
    try:
        _idle[(1,)]()
    finally:
        _idle.pre_run_hooks.clear()
    return out


def python_each(x, y):  # Python adds element by element: no op is dispatched
    s = torch.empty_like(x)
    s.map2_(x, y, lambda _, a, b: a + b)
    return s


_SUBCLASS_STASH = {}


def _hidden_add(cls, func, types, args=(), kwargs=None):  # runs with the recorder off the stack
    s, x, y = _SUBCLASS_STASH["s"], _SUBCLASS_STASH["x"], _SUBCLASS_STASH["y"]
    return s.copy_(x + y)


_Sum = type("Sum", (torch.Tensor,), {"__torch_dispatch__": classmethod(_hidden_add)})


def subclass_dispatch(x, y):  # the recorder sees a detach; the subclass adds under it
    s = torch.empty_like(x)
    _SUBCLASS_STASH.update(s=s, x=x, y=y)
    s.as_subclass(_Sum).detach()
    return s


@triton.jit
def _bits(src_ptr, bits_ptr, n, BLOCK: tl.constexpr):  # a copy: each float's bits into an int32 tensor
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(src_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(bits_ptr + offs, v.to(tl.int32, bitcast=True), mask=mask)


def kernel_bits_read(x, y):  # the bits a kernel copied, read by Python: floats decoded on the host
    bits = torch.zeros(x.numel(), dtype=torch.int32)
    _bits[(1,)](x, bits, x.numel(), BLOCK=16)
    return bits.tolist()


@triton.jit
def _nan_flags(src_ptr, flags_ptr, n, BLOCK: tl.constexpr):  # a kernel's argument check: 1 where NaN
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(src_ptr + offs, mask=mask, other=0.0)
    tl.store(flags_ptr + offs, (v != v).to(tl.int32), mask=mask)


def kernel_flags_read(x, y):  # a few int32 flags a kernel computed, read as a launcher's check reads them
    flags = torch.zeros(x.numel(), dtype=torch.int32)
    _nan_flags[(1,)](x, flags, x.numel(), BLOCK=16)
    return any(flags.tolist())


def _fixed(t):  # each float times 2**40 by an add to its exponent bits, then truncated: int64 fixed point
    b = t.to(torch.float64).view(torch.int64)
    return torch.where(b == 0, b, b + (40 << 52)).view(torch.float64).to(torch.int64)


def integer_add(x, y):  # a float add taken as an integer add, no float op on the way
    b = (_fixed(x) + _fixed(y)).to(torch.float64).view(torch.int64)
    return torch.where(b == 0, b, b - (40 << 52)).view(torch.float64).to(x.dtype)


def quantized(x, y):  # quantized tensors are neither float nor complex
    q = [torch.quantize_per_tensor(t.float(), 2.0**-20, 0, torch.qint32) for t in (x, y)]
    return q[0].int_repr() + q[1].int_repr()


def _parsed(text):
    return [float(v) for v in text[text.index("[") + 1 : text.index("]")].split(",")]


def text_read(x, y):  # torch formats a tensor with every mode off: its values read as text
    torch.set_printoptions(precision=10)
    try:
        return [a + b for a, b in zip(_parsed(str(x)), _parsed(f"{y}"))]
    finally:
        torch.set_printoptions(profile="default")


def bits_as_text(x, y):  # the bits of the floats, printed as integers
    return repr(x.view(torch.int16))


def flag_nonzero(x, y):  # a launcher's error path: where the first bad value is
    bad = (x != x) | (x == float("inf"))
    return bad.nonzero(), bool(bad.any())


def exponent_check(x, y):  # L5's check of its sinks: the exponent bits, masked and compared
    exponent = x.float().view(torch.int32) & 0x7F800000
    return bool((exponent == 0x7F800000).any())


seen = {}
for fn in (
    helper_in_kernel, custom_op, int_view_writes, int_view_read, honest, int_result_read, int_result_item,
    flags_bit_by_bit, flag_check, in_a_hook, python_each, subclass_dispatch, kernel_bits_read,
    kernel_flags_read, integer_add, quantized, text_read, bits_as_text, flag_nonzero, exponent_check,
):
    x, y = torch.randn(10, dtype=torch.float16), torch.randn(10, dtype=torch.float16)
    recorder = I.torch_compute_recorder(watch)
    with recorder:
        fn(x, y)
    seen[fn.__name__] = recorder.seen
I.poison_empty()
seen["tolist_is_torchs"] = isinstance(torch.ones(1).tolist, type(len))
with I.fresh_memory():
    seen["empty_is_torchs"] = isinstance(torch.empty, type(len)) and bool(torch.empty(2).isnan().all())
print(json.dumps(seen))
"""


def _last_line_of_script(path, source: str, timeout: int) -> str:
    """Run `source` as the script `path` in a fresh Python from the repository's root (each check's
    learner-process state starts clean), require it to exit 0, and return the last line it printed."""
    import subprocess
    import sys

    from drills.lessons import ROOT

    path.write_text(source)
    done = subprocess.run(
        [sys.executable, str(path)], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_op_recorder_sees_torch_computing_however_it_is_reached(tmp_path):
    """torch computing in a plain function the kernel's body calls (under the interpreter, inside a
    launch) or in a kernel's pre-run hook (called from Triton's own frame), a custom op named `clone` (a
    move's short name), integer writes into an int16 view of a float tensor, its bits read to Python
    directly or through any op's result (`bits + 0`, `bits & 0xFF`, flag by flag): each is recorded as
    torch computing; a kernel's own launch and a launcher's one-flag argument check record nothing;
    torch.empty and Tensor.tolist stay torch's own while watched and poisoned."""
    import json

    seen = json.loads(_last_line_of_script(tmp_path / "recorder_cheats.py", RECORDER_CHEATS, 300))
    assert seen["helper_in_kernel"] == ["add"], seen
    assert seen["custom_op"] == ["drillscheat::clone"], seen
    assert len(seen["int_view_writes"]) == 2, seen
    assert all("integers written into a float tensor" in s for s in seen["int_view_writes"]), seen
    assert seen["int_view_read"] == ["tolist (values computed from floats read to the host)"], seen
    assert seen["honest"] == [], seen
    # what any op computed from float memory is float memory too, read by tolist, item or flag by flag
    assert "tolist (values computed from floats read to the host)" in seen["int_result_read"], seen
    assert "item (values computed from floats read to the host)" in seen["int_result_item"], seen
    assert "item (flags computed from floats read to the host)" in seen["flags_bit_by_bit"], seen
    assert seen["flag_check"] == [], seen  # a launcher's check of its argument reads one flag
    # a hook Triton calls during a launch is the learner's code: its torch ops are recorded
    assert seen["in_a_hook"] == ["add"], seen
    # Python computing where no op is dispatched: per element, or in a subclass's own dispatch
    assert seen["python_each"] == ["map2_ (a Python function run on the floats)"], seen
    assert seen["subclass_dispatch"] == ["detach (on a tensor subclass whose own code runs under it)"], seen
    # what a kernel given floats stored into an integer tensor is float memory too, read by tolist
    assert seen["kernel_bits_read"] == ["tolist (values computed from floats read to the host)"], seen
    assert seen["kernel_flags_read"] == [], seen  # a few 0/1 flags are a check, as bool flags are
    # integers computed from floats or from their bits: a float add as an add of int64 fixed point, a
    # quantized tensor's integers added
    assert "add (integers computed from floats or their bits)" in seen["integer_add"], seen
    assert "quantize_per_tensor (integers computed from floats or their bits)" in seen["quantized"], seen
    assert "add (integers computed from floats or their bits)" in seen["quantized"], seen
    # a tensor's text, which torch makes with every mode off, is its values read to the host
    assert seen["text_read"] == [
        "repr (floats read to the host as text)",
        "format (floats read to the host as text)",
    ]
    assert seen["bits_as_text"] == ["repr as text (values computed from floats read to the host)"], seen
    assert seen["flag_nonzero"] == [], seen  # flags, and where they are, are a check
    assert seen["exponent_check"] == [], seen  # an AND that masks the exponent, then a compare
    # torch's own methods are left as they are: a file cannot tell a grading by what they are
    assert seen["tolist_is_torchs"] and seen["empty_is_torchs"], seen


PYTHON_ARGUMENTS = """\
import json, os
os.environ["TRITON_INTERPRET"] = "1"
import drills.runtime
drills.runtime.select()
import torch
import triton
import triton.language as tl

import drills.grading.learner.instrument as I
watch = I.TritonWatch(__file__)
watch.module_name = "cheats"


@triton.jit
def _twice(v):
    return v + v


def _python_twice(v):  # run as Python by the interpreter, with the kernel's values
    return v + v


class _Twice:
    def __call__(self, v):
        return v + v


@triton.jit
def _apply(x_ptr, out_ptr, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, FN(tl.load(x_ptr + offs)))


x, out = torch.randn(8), torch.empty(8)
said = {}
_apply[(1,)](x, out, _twice, BLOCK=8)  # a @triton.jit function: compiled into the kernel
_apply[lambda meta: (1,)](x, out, FN=_twice, BLOCK=8)  # a grid of the meta-parameters: Triton's own
said["jit"] = bool(torch.equal(out, x + x))
for name, fn in [("def", _python_twice), ("lambda", lambda v: v + v), ("constexpr", tl.constexpr(_python_twice)),
    ("object", _Twice()),
]:
    try:
        _apply[(1,)](x, out, FN=fn, BLOCK=8)
        said[name] = "ran"
    except I.PythonArgument as err:
        said[name] = str(err)
print(json.dumps(said))
"""


def test_a_python_function_handed_to_a_kernel_is_refused(tmp_path):
    """A plain function, a lambda or a constexpr of one, handed to a kernel is run by the interpreter as
    Python with the kernel's values (a GPU's compiler refuses it): the launch is refused, naming the
    argument. A @triton.jit function, and a grid computed from the meta-parameters, launch as before."""
    import json

    said = json.loads(_last_line_of_script(tmp_path / "python_arguments.py", PYTHON_ARGUMENTS, 300))
    assert said.pop("jit") is True, said
    for name, message in said.items():
        assert message.startswith("the output did not come from your kernel: a Python function runs as"), (
            message
        )
        assert "_apply was given FN = " in message, (name, message)


CONSTEXPR_FUNCTIONS = """\
import json, math, os
os.environ["TRITON_INTERPRET"] = "1"
import drills.runtime
drills.runtime.select()
import torch
import triton
import triton.language as tl

import drills.grading.learner.instrument as I
watch = I.TritonWatch(__file__)
watch.module_name = "cheats"


@triton.constexpr_function
def _pad(n):  # compile-time Python on a constexpr: what a GPU compiles too
    return max(n, 4)


@triton.constexpr_function
def _exp_in_python(x):  # a scalar's float found by bisection on `if`, then math.exp in Python
    lo, hi = -50.0, 50.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if x > mid:
            lo = mid
        else:
            hi = mid
    return math.exp(lo)


@triton.jit
def _padded(out_ptr, N: tl.constexpr):
    tl.store(out_ptr, _pad(N))


@triton.jit
def _exp(x_ptr, out_ptr):
    tl.store(out_ptr, _exp_in_python(tl.load(x_ptr)))


x, out = torch.tensor([1.5]), torch.zeros(1)
said = {}
_padded[(1,)](out, N=2)
said["constexpr"] = out.item()
try:
    _exp[(1,)](x, out)
    said["tensor"] = "ran"
except Exception as err:  # the interpreter wraps what the kernel raised
    while err is not None and not isinstance(err, I.KernelValueToPython):
        err = err.__cause__ or err.__context__
    said["tensor"] = str(err)
print(json.dumps(said))
"""


def test_a_constexpr_function_given_a_kernels_tensor_is_refused(tmp_path):
    """The interpreter runs a @triton.constexpr_function as plain Python with whatever the kernel gives it:
    given a tensor, it can recover the float by bisection on `if` and compute in Python (a GPU runs such a
    function on constexprs only). Given a constexpr it runs as before."""
    import json

    said = json.loads(_last_line_of_script(tmp_path / "constexpr_functions.py", CONSTEXPR_FUNCTIONS, 300))
    assert said["constexpr"] == 4.0, said
    assert said["tensor"].startswith(
        "the output did not come from your kernel: a @triton.constexpr_function"
    ), said


def test_a_file_that_tells_a_grading_by_its_fresh_memory_fails(tmp_path):
    """`probe != probe` on fresh memory is True while graded (NaN) and False in a plain run: the
    provenance check runs the call once more on a finite pattern, and the two must agree."""
    from tests.test_grading_harness import failures, grade_t1, one_screen, t1_source

    probe = """

def _launch(x, y, out, BLOCK=2048, num_warps=4):
    probe = torch.empty(1)
    graded = bool(probe != probe)  # NaN only while graded
    vector_add_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y if graded else x, out, x.numel(), BLOCK=BLOCK)
    return out
"""
    result = grade_t1(tmp_path, t1_source(extra=probe), "test_runs_a_triton_kernel", checked=True)
    screen = one_screen(result)
    assert result.state == "failing", screen
    assert "depends on what fresh memory holds" in failures(result)["test_runs_a_triton_kernel"], screen


# --- Whole gradings: each class of cheat the red team got past the harness, refused on one screen ---

FLOATS_IN_PYTHON = """
import array


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    # the sum in Python from the floats' bits, taken through an op's result (not a view of x)
    bits = [(t.float().view(torch.int32) | 0).tolist() for t in (x, y)]
    a, b = array.array("f"), array.array("f")
    a.frombytes(array.array("i", bits[0]).tobytes())
    b.frombytes(array.array("i", bits[1]).tobytes())
    s = torch.tensor([u + v for u, v in zip(a, b)], dtype=x.dtype, device=x.device)
    n = x.numel()
    vector_add_kernel[(triton.cdiv(n, BLOCK),)](s, torch.zeros_like(s), out, n, BLOCK=BLOCK)
    return out
"""

IN_A_HOOK = """
import functools


@triton.jit
def _idle():
    pass


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    # torch adds in a pre-run hook, which Triton calls from its own frame during the launch
    s = torch.empty_like(out)
    _idle.add_pre_run_hook(functools.partial(torch.add, x, y, out=s))
    _idle[(1,)]()
    _idle.pre_run_hooks.clear()
    n = x.numel()
    vector_add_kernel[(triton.cdiv(n, BLOCK),)](s, torch.zeros_like(s), out, n, BLOCK=BLOCK)
    return out
"""

MASKED_LANES_PROBE = """

@triton.jit
def _probe_kernel(src_ptr, flag_ptr):
    offs = tl.arange(0, 8)
    v = tl.load(src_ptr + offs, mask=offs > 8)  # no lane on, no other=: NaN only while graded
    tl.store(flag_ptr + offs, tl.where(v == v, 0, 1))


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    flag = torch.zeros(8, dtype=torch.int32, device=x.device)
    _probe_kernel[(1,)](torch.zeros(8, device=x.device), flag)
    n = x.numel() if int(flag[0]) else x.numel() - 1  # a plain run drops the last element
    vector_add_kernel[(triton.cdiv(n, BLOCK),)](x, y, out, n, BLOCK=BLOCK)
    return out
"""


@pytest.mark.parametrize(
    "cheat, said",
    [
        (FLOATS_IN_PYTHON, "values computed from floats read to the host"),
        (IN_A_HOOK, "torch's add"),
    ],
    ids=["floats_through_an_ops_result", "torch_in_a_pre_run_hook"],
)
def test_computing_out_of_the_kernels_sight_is_refused(tmp_path, cheat, said):
    """The answer computed in Python from bits read through an op's result, or by torch in a hook that
    Triton calls during a launch, then copied into out by a kernel: not from the kernel, on one screen."""
    from tests.test_grading_harness import failures, grade_t1, one_screen, t1_source

    result = grade_t1(tmp_path, t1_source(extra=cheat), "test_runs_a_triton_kernel")
    screen = one_screen(result)
    assert result.state == "failing", screen
    assert said in failures(result)["test_runs_a_triton_kernel"], screen
    assert "likely mistake: the output did not come from your kernel" in screen, screen


def test_telling_a_grading_by_masked_off_lanes_fails(tmp_path):
    """A probe kernel's masked-off lanes read without other= are NaN only while graded: the provenance
    check's finite run fills them with the finite pattern, so the file takes its plain-run path there
    and disagrees with itself, and the screen names that."""
    from tests.test_grading_harness import failures, grade_t1, one_screen, t1_source

    result = grade_t1(
        tmp_path, t1_source(extra=MASKED_LANES_PROBE), "test_runs_a_triton_kernel", checked=True
    )
    screen = one_screen(result)
    assert result.state == "failing", screen
    assert "depends on what fresh memory holds" in failures(result)["test_runs_a_triton_kernel"], screen
    assert "takes another path while graded" in screen, screen


ROWS_BY_TORCH = """

def store_kvcache(key, value, k_cache, v_cache, slot_mapping, check=None):
    # every row but the last stored by torch's moves (narrow and copy_), the last by the kernel
    N, Hkv, D = key.shape
    slots = slot_mapping.tolist()
    for i in range(N - 1):
        if slots[i] >= 0:
            k_cache.view(-1, Hkv, D).narrow(0, slots[i], 1).copy_(key.narrow(0, i, 1))
            v_cache.view(-1, Hkv, D).narrow(0, slots[i], 1).copy_(value.narrow(0, i, 1))
    _launch(key[N - 1 :], value[N - 1 :], k_cache, v_cache, slot_mapping[N - 1 :])
"""


def test_arguments_written_by_torch_are_refused(tmp_path):
    """With every launch a no-op, the call must leave each argument byte for byte as it was: rows copied
    into the cache by torch (views and copy_, moves each) are computing outside the kernel."""
    from drills.grading.grader import pytest_run
    from tests.test_grading_harness import one_screen

    L1 = find("l1")
    path = tmp_path / f"{L1.stem}.py"
    path.write_text(L1.solution.read_text() + ROWS_BY_TORCH)
    result = pytest_run.grade(L1, file=path, extra=["-k", "test_runs_a_triton_kernel"])
    screen = one_screen(result)
    assert result.state == "failing", screen
    assert "still wrote into argument `k_cache`" in screen, screen
    assert "likely mistake: the output did not come from your kernel" in screen, screen


def test_the_launch_disabled_run_must_leave_arguments_as_they_were():
    """provenance.judge on evidence alone: an argument the launch-disabled run changed is refused, one it
    left byte for byte as it was passes (NaN bytes compare as bytes; 1.0 -> 5.0 changes 2 of 4 bytes)."""
    import torch

    from drills.grading.grader.provenance import judge
    from drills.grading.shared.errors import NotFromKernel

    before = torch.tensor([1.0, float("nan"), 3.0])
    real = torch.tensor([5.0, 6.0, 7.0])
    evidence = {
        "launched": 1,
        "torch": [],
        "unread": [],
        "written": None,
        "disabled": {
            "before": [before],
            "after": [real],
            "states": [before.clone()],
            "names": ["k_cache"],
            "results": [],
            "got": [],
            "raised": False,
        },
    }
    judge([], evidence)  # left as it was, and unlike the real run's: passes
    evidence["disabled"]["states"] = [torch.tensor([5.0, float("nan"), 3.0])]
    with pytest.raises(NotFromKernel, match=r"still wrote into argument `k_cache` \(2 bytes\)"):
        judge([], evidence)


def test_a_file_cannot_leave_files_outside_its_folder(tmp_path):
    """What a graded file saw cannot be kept for a later run: torch.save (C++ opens the file, no audit
    event) into /tmp is refused by the sandbox, past the source check; the process's temporary files
    go to a folder of its own, which works."""
    import os

    from tests.test_grading_harness import grade_t1, outcome, t1_source

    leak = f"/tmp/_drills_leak_{os.getpid()}.pt"
    saving = f"\ntorch.save(torch.ones(2), {leak!r})\n"
    result = grade_t1(tmp_path, t1_source(extra=saving), "test_by_hand_lane_11_is_masked")
    assert not os.path.exists(leak), "the learner's process created a file in /tmp"
    if os.path.exists(leak):
        os.remove(leak)
    assert result.state == "does not import", result.message
    assert "Permission denied" in result.message or "may not create" in result.message, result.message
    temp = (
        "\nimport os as _os\nimport tempfile as _tf\n_fd, _p = _tf.mkstemp()\n_os.write(_fd, b'x')\n"
        "_os.close(_fd)\nassert 'drills-learner-tmp-' in _p, _p\n"
    )
    ok = tmp_path / "ok"
    ok.mkdir()
    result = grade_t1(ok, t1_source(extra=temp), "test_by_hand_lane_11_is_masked")
    assert outcome(result, "test_by_hand_lane_11_is_masked") == {"passed"}, result.message


RETURNS_ITS_EXCEPTION = """

class _Carrier(ValueError):
    pass


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    # an exception of the file's own class, returned: unpickled by value in the grader's process, its
    # class (a handle there) would be called to rebuild it, and its reply would be the same again
    return _Carrier("returned, not raised")
"""


def test_an_exception_of_the_files_own_class_comes_back_as_a_handle(tmp_path):
    """The grader's process never calls the learner's code while it reads a reply: an exception object of
    the learner's own class travels as a handle (like the learner's other objects), and the check fails
    on what came back, on one screen, where it recursed until Python's limit."""
    from tests.test_grading_harness import failures, grade_t1, one_screen, t1_source

    result = grade_t1(tmp_path, t1_source(extra=RETURNS_ITS_EXCEPTION), "test_dtypes")
    screen = one_screen(result)
    assert result.state == "failing", screen
    said = "\n".join(failures(result).values())
    assert said and "RecursionError" not in said, said


def test_a_check_stopped_by_the_learners_code_names_no_pitfall():
    """sys.exit, or a BaseException of the file's own, stops the check whatever its kernel does: that is
    the finding, not the pitfall whose check happened to be stopped first."""
    from drills.grading.grader import diagnose
    from drills.grading.grader.diagnose import Mistake
    from drills.grading.grader.report import Case

    mistakes = [Mistake(2, fails=("test_grid",))]
    for said in (
        "RuntimeError: your code called sys.exit(0) while being graded",
        "LearnerError: your code raised RuntimeError: your code raised _Stop, which is not an Exception (it "
        "stops whatever runs it, as sys.exit does) while being graded",
    ):
        found = diagnose.diagnose([Case("test_grid", "test_grid", "failed", said)], mistakes)
        assert [(f.pitfall, f.kind) for f in found] == [(0, "stopped")], found
        assert "stopped the check" in found[0].title


STOPS_THE_CHECK = """

class _Stop(BaseException):
    pass


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    raise _Stop("not an Exception")
"""


@pytest.mark.parametrize("raised", ['_Stop("not an Exception")', "KeyboardInterrupt"])
def test_a_base_exception_of_the_files_own_is_named_on_one_screen(tmp_path, raised):
    """A BaseException the file raises, KeyboardInterrupt too (Ctrl-C's exception, raised by the file:
    the process ended on every check, each restarted, a whole grading past ten minutes)."""
    from tests.test_grading_harness import grade_t1, one_screen, t1_source

    source = t1_source(extra=STOPS_THE_CHECK.replace('_Stop("not an Exception")', raised))
    result = grade_t1(tmp_path, source, "test_by_hand_grid_has_three_programs")
    screen = one_screen(result)
    assert result.state == "failing", screen
    assert "stopped the check" in screen and "pitfall" not in screen.split("reread")[0], screen


HOG = """
import os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from drills.grading.learner.sandbox import limit_memory, memory_limit

assert limit_memory() is None
held = []
try:
    for _ in range(4 * memory_limit() >> 30):  # 1 GiB at a time, never touched: only the limit stops it
        held.append(torch.empty(1 << 28))
    print("unbounded")
except RuntimeError as err:
    print("refused" if "can't allocate memory" in str(err) else repr(err))
"""


def test_an_allocation_without_bound_fails_in_the_learners_process(tmp_path):
    """A file that allocates without bound (a list of 1 GiB tensors) fails at its own line once it holds
    the learner's share of the memory, instead of filling the machine until the out-of-memory killer
    picks a process, the grader's or another program's as likely as its own."""
    assert _last_line_of_script(tmp_path / "hog.py", HOG, 120) == "refused"
