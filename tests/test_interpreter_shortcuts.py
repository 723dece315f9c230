"""The learner process's shortcuts through Triton's interpreter (drills/grading/learner/semantic_cache.py)
give what Triton's own code gives: the same tensors (dtype, shape, values; the very operands where
Triton hands them back untouched) for ops of every kind of operand pair, and the same refusal where
Triton refuses. Objects a caller may change (keyword dicts, block types) are never shared between calls.
Not a lesson's grader: it runs in `make check`, under the interpreter only.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests import markers

pytestmark = markers.interpreter_only(
    "the shortcuts patch Triton's interpreter, which a GPU run does not use"
)


@pytest.fixture(scope="module")
def triton_parts():
    import triton.language.core as core
    from triton.runtime import interpreter as interp

    from drills.grading.learner import semantic_cache

    if not semantic_cache.install(interp):
        pytest.skip("this Triton's interpreter is not the one the shortcuts were written for: left as it is")
    shortcut = interp.TritonSemantic
    # Triton's own semantic: the class with every shortcut replaced by the function it wraps
    own = type("TritonsOwn", (shortcut,), dict(shortcut._drills_tritons_own))
    builder = interp.interpreter_builder
    return interp, core, shortcut(builder), own(builder)


DTYPES = ["fp32", "fp16", "bf16", "int32", "int64", "int1", "uint32"]
SHAPES = [None, (4, 8), (4, 1), (1, 8), (8,)]  # None: a scalar tensor


def make(interp, core, name: str, shape, seed: int):
    dtype = getattr(
        core, {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int1": "int1"}.get(name, name)
    )
    np_dtype = interp._get_np_dtype(dtype)
    values = np.random.default_rng(seed).integers(0, 5, size=shape or (1,)).astype(np_dtype)
    ty = dtype if shape is None else core.block_type(dtype, list(shape))
    return core.tensor(interp.TensorHandle(values, dtype), ty)


def same_tensor(a, b) -> bool:
    return (
        a.type == b.type
        and a.handle.dtype == b.handle.dtype
        and a.handle.data.dtype == b.handle.data.dtype
        and np.array_equal(a.handle.data, b.handle.data)
    )


def outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs), None
    except Exception as err:  # noqa: BLE001 - the refusal itself is what is compared
        return None, (type(err), str(err))


@pytest.mark.parametrize("div_or_mod", [False, True], ids=["add", "div"])
def test_binary_operands_match_tritons_own_for_every_dtype_and_shape_pair(triton_parts, div_or_mod):
    interp, core, shortcut, own = triton_parts
    for (ld, ls), (rd, rs) in itertools.combinations_with_replacement(itertools.product(DTYPES, SHAPES), 2):
        lhs, rhs = make(interp, core, ld, ls, 1), make(interp, core, rd, rs, 2)
        got, got_err = outcome(shortcut.binary_op_type_checking_impl, lhs, rhs, div_or_mod=div_or_mod)
        want, want_err = outcome(own.binary_op_type_checking_impl, lhs, rhs, div_or_mod=div_or_mod)
        case = f"{ld}{ls} with {rd}{rs}"
        assert got_err == want_err, case
        if want is None:
            continue
        for g, w, given in zip(got, want, (lhs, rhs)):
            assert same_tensor(g, w), case
            assert (g is given) == (w is given), f"{case}: the very operand, as Triton hands it back"


# 2**40 as fp16 overflows to inf in both: numpy's warning says so
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_python_scalars_and_refusals_match_tritons_own(triton_parts):
    interp, core, shortcut, own = triton_parts
    for name, shape, scalar in itertools.product(DTYPES, SHAPES, [3, -1, 2.5, 2**40, True]):
        block = make(interp, core, name, shape, 3)
        for lhs, rhs in ((block, scalar), (scalar, block)):
            got, got_err = outcome(shortcut.binary_op_type_checking_impl, lhs, rhs)
            want, want_err = outcome(own.binary_op_type_checking_impl, lhs, rhs)
            assert got_err == want_err, (name, shape, scalar)
            if want is not None:
                assert all(same_tensor(g, w) for g, w in zip(got, want)), (name, shape, scalar)


def test_promoted_dtype_and_casts_match_tritons_own(triton_parts):
    interp, core, shortcut, own = triton_parts
    dtypes = [make(interp, core, n, None, 0).dtype for n in DTYPES]
    for a, b, a_scalar, b_scalar, div in itertools.product(dtypes, dtypes, *[[False, True]] * 3):
        for _ in range(2):  # the second call reads the kept answer
            got = outcome(shortcut.computation_type_impl, a, a_scalar, b, b_scalar, div)
            assert got == outcome(own.computation_type_impl, a, a_scalar, b, b_scalar, div)
    for src, dst, shape in itertools.product(DTYPES, DTYPES, [None, (4, 8)]):
        value = make(interp, core, src, shape, 4)
        target = make(interp, core, dst, None, 0).dtype
        got, want = shortcut.cast(value, target), own.cast(value, target)
        assert same_tensor(got, want) and (got is value) == (want is value), (src, dst, shape)


def test_patched_builtin_never_changes_or_keeps_the_callers_keywords(triton_parts):
    interp, core, shortcut, own = triton_parts
    seen = []

    @core.builtin
    def probe(x, scale=1, _semantic=None):
        seen.append(_semantic)
        return x * scale

    scope = interp._LangPatchScope()
    holder = type("Holder", (), {})()
    interp._patch_attr(holder, "probe", probe, interp.interpreter_builder, scope)
    keywords = {"scale": 3, "_semantic": None}
    assert holder.probe(2, **keywords) == 6
    assert keywords == {"scale": 3, "_semantic": None}, "the caller's dict must be left as it was"
    assert holder.probe(2) == 2, "a keyword from an earlier call must not stay"
    assert seen[0] is not None and seen[0] is seen[1]


def test_each_block_type_is_a_fresh_object_with_its_own_name(triton_parts):
    interp, core, shortcut, own = triton_parts
    first, second = core.block_type(core.float32, [4, 8]), core.block_type(core.float32, [4, 8])
    assert first is not second and first == second and first.numel == second.numel == 32
    first.name = "changed by a caller"
    assert second.name == "<['4', '8'], fp32>"
    with pytest.raises(ValueError):  # a refused shape is refused every time, never kept
        core.block_type(core.float32, [3, 8])
    with pytest.raises(ValueError):
        core.block_type(core.float32, [3, 8])
