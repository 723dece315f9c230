"""bf16 under Triton's interpreter, computed as a GPU computes it.

The interpreter holds a bf16 tensor as its uint16 bits, and its dot, elementwise ops and reductions then
do integer arithmetic on those bits: a 16x16 bf16 tl.dot came out off by about 3e10. In the learner's
process (instrument.TritonWatch) these are replaced: a bf16 dot upcasts its operands and accumulates in
fp32, as tensor cores do, and bf16 elementwise ops and reductions compute in fp32 and round to nearest
even. Then every lesson's bf16 cases grade on a CPU too.
"""

from __future__ import annotations


def _bf16_to_f32(bits):
    """bf16 values stored as uint16 (the interpreter's representation) -> float32, exactly."""
    import numpy as np

    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _f32_to_bf16(values):
    """float32 -> bf16 bits, rounded to nearest even, as a GPU's conversion rounds."""
    import numpy as np

    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    out = rounded.astype(np.uint16)
    nan = np.isnan(values)
    out[nan] = np.uint16(0x7FC0)
    return out


def exact_bf16_dot(interp) -> None:
    """tl.dot with a bf16 operand, computed as a GPU's tensor cores do: bf16 operands upcast to fp32
    (exact), products summed in fp32, then the accumulator's dtype. Triton's interpreter keeps bf16 as
    uint16 and multiplies the integers (a 16x16 bf16 dot is off by about 3e10), so bf16 cases could not
    run on a CPU at all; with this, every lesson's bf16 cases run everywhere."""
    import numpy as np
    import triton.language as tl

    builder = type(interp.interpreter_builder)
    original = builder.create_dot
    if getattr(original, "drills_exact_bf16", False):
        return

    def create_dot(self, a, b, d, *rest):
        a_bf16, b_bf16 = a.dtype.scalar == tl.bfloat16, b.dtype.scalar == tl.bfloat16
        d_bf16 = d.dtype.scalar == tl.bfloat16
        if not (a_bf16 or b_bf16 or d_bf16):
            return original(self, a, b, d, *rest)
        x = _bf16_to_f32(a.data) if a_bf16 else np.asarray(a.data, dtype=np.float32)
        y = _bf16_to_f32(b.data) if b_bf16 else np.asarray(b.data, dtype=np.float32)
        acc = _bf16_to_f32(d.data) if d_bf16 else np.asarray(d.data, dtype=np.float32)
        total = np.matmul(x, y, dtype=np.float32) + acc
        data = _f32_to_bf16(total) if d_bf16 else total.astype(d.data.dtype)
        return interp.TensorHandle(data, d.dtype.scalar)

    create_dot.drills_exact_bf16 = True
    builder.create_dot = create_dot
    _bf16_elementwise(interp)


# The interpreter's float operations that would treat bf16's uint16 storage as integers.
_BF16_ARITHMETIC = (
    "create_fadd create_fsub create_fmul create_fdiv create_frem create_precise_divf create_fma "
    "create_minimumf create_minnumf create_maximumf create_maxnumf create_clampf create_exp create_exp2 "
    "create_log create_log2 create_sqrt create_precise_sqrt create_rsqrt create_sin create_cos "
    "create_floor create_ceil create_erf"
).split()
_BF16_COMPARISONS = [f"create_fcmp{p}{c}" for p in "OU" for c in ("LT", "GT", "LE", "GE", "EQ", "NE")]


def _bf16_elementwise(interp) -> None:
    """bf16 elementwise arithmetic and comparisons computed in fp32 and rounded back to bf16 (to the
    nearest even), as a GPU computes them; Triton's interpreter adds the uint16 bit patterns."""
    import triton.language as tl

    builder = type(interp.interpreter_builder)
    handle = interp.TensorHandle

    def is_bf16(x):
        return isinstance(x, handle) and x.dtype.scalar == tl.bfloat16

    def wrap(name, comparison):
        original = getattr(builder, name, None)
        if original is None:
            return

        def op(self, *args):
            if not any(is_bf16(a) for a in args):
                return original(self, *args)
            wide = [handle(_bf16_to_f32(a.data), tl.float32) if is_bf16(a) else a for a in args]
            out = original(self, *wide)
            return out if comparison else handle(_f32_to_bf16(out.data), tl.bfloat16)

        setattr(builder, name, op)

    for name in _BF16_ARITHMETIC:
        wrap(name, False)
    for name in _BF16_COMPARISONS:
        wrap(name, True)
    _bf16_reductions(interp)


def _bf16_reductions(interp) -> None:
    """tl.sum, tl.max, tl.min, tl.cumsum and tl.cumprod of bf16: computed on the fp32 values."""
    import triton.language as tl

    def widen(x):
        if isinstance(x, tl.core.tensor) and x.dtype.scalar == tl.bfloat16:
            data = _bf16_to_f32(x.handle.data)
            ty = tl.block_type(tl.float32, list(x.shape)) if x.type.is_block() else tl.float32
            return tl.core.tensor(interp.TensorHandle(data, tl.float32), ty), True
        return x, False

    def narrow(x):
        if isinstance(x, tl.core.tensor) and x.dtype.scalar == tl.float32:
            data = _f32_to_bf16(x.handle.data)
            ty = tl.block_type(tl.bfloat16, list(x.shape)) if x.type.is_block() else tl.bfloat16
            return tl.core.tensor(interp.TensorHandle(data, tl.bfloat16), ty)
        return x

    def wrap(cls, name):
        original = getattr(cls, name, None)
        if original is None:
            return

        def op(self, input, *rest, **kwargs):
            wide, was = widen(input[0] if isinstance(input, tuple) else input)
            if not was:
                return original(self, input, *rest, **kwargs)
            out = original(self, (wide,) if isinstance(input, tuple) else wide, *rest, **kwargs)
            if isinstance(out, (list, tuple)):
                return type(out)(narrow(o) for o in out)
            return narrow(out)

        setattr(cls, name, op)

    for cls, names in ((interp.ReduceOps, ("sum", "min_max")), (interp.ScanOps, ("cumsum", "cumprod"))):
        for name in names:
            wrap(cls, name)
