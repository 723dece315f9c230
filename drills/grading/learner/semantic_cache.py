"""Triton's interpreter made cheaper per op in the learner's process, with every result unchanged.

Profiled on L4's and T5's reference gradings, the interpreter spends most of a kernel's time in Python
around each op rather than in numpy: a `tl.add` goes through the lambda the interpreter patches in (a
dict of the keyword arguments rebuilt on every call), the `@builtin` wrapper's check that a semantic
was passed (the lambda always passes one), then `binary_op_type_checking_impl`, which for two tensors
of one dtype and one shape, most of a kernel's ops, works out the promoted dtype, casts each operand to
the dtype it already has, and compares the two shapes element by element to broadcast nothing.

What changes here:
- the patched-in function calls the builtin's own function with the semantic directly, dropping a
  `_semantic` the caller passed as the lambda does (the check it skips cannot fail: the semantic is
  never None);
- the promoted dtype of two plain dtypes (not pointers) is kept per (dtypes, scalar flags, division):
  `computation_type_impl` is a pure function of them (dtypes are compared and hashed by name, and two
  plain dtypes of one name are built alike); a combination it refuses raises as before, every time;
- `binary_op_type_checking_impl` returns its two operands untouched, as Triton's own code would, when
  they are tensors of the one plain dtype whose promotion is that dtype and of one shape (the same
  block shape object, which drills/frontend_cache.py shares between equal shapes, or both scalars);
- `broadcast_impl_value` of two blocks of one shape object returns them untouched, as Triton's does;
- `cast` to the dtype a tensor already has returns it at once (Triton's first test, by identity here).
Any other call runs Triton's own code. Nothing is cached that a caller could mutate: dtypes only.

`install(interp)` is idempotent and returns False, changing nothing, on a Triton whose functions do not
read as the ones above (their source is checked), so an unknown version runs exactly as Triton wrote it.
"""

from __future__ import annotations

import inspect


def install(interp) -> bool:
    """Patch Triton's interpreter and semantic layer once; True when the patches apply."""
    import triton.language.core as core

    semantic_cls = getattr(interp, "TritonSemantic", None)
    if semantic_cls is None:
        return False
    if getattr(semantic_cls, "_drills_semantic_cache", False):
        return True
    patch_attr = _fast_patch_attr(interp, core)
    if patch_attr is None or not _semantic_as_expected(semantic_cls):
        return False
    interp._patch_attr = patch_attr
    _shortcut_semantic(semantic_cls, core)
    semantic_cls._drills_semantic_cache = True
    return True


def _source(fn) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _builtin_function(core):
    """member -> the function a `@builtin` wraps, or None where member is not that wrapper."""
    probe = core.builtin(lambda *args, **kwargs: None)
    wrapper_code = getattr(probe, "__code__", None)
    check = '"_semantic" not in kwargs or kwargs["_semantic"] is None'
    if wrapper_code is None or check not in _source(core.builtin):
        return lambda member: None

    def unwrapped(member):
        if getattr(member, "__code__", None) is wrapper_code:
            return getattr(member, "__wrapped__", None)
        return None

    return unwrapped


def _fast_patch_attr(interp, core):
    """A `_patch_attr` doing what the interpreter's does, or None where its source is not the one read
    here. Triton 3.6 makes a semantic per patch (`TritonSemantic(builder)`), 3.9 reads the module's
    `interpreter_semantic` on every call."""
    source = _source(getattr(interp, "_patch_attr", None))
    filters = "for k, v in kwargs.items()" in source and 'if k != "_semantic"}' in source
    per_patch = "semantic = TritonSemantic(builder)" in source and "_semantic=semantic))" in source
    shared = "_semantic=interpreter_semantic))" in source and hasattr(interp, "interpreter_semantic")
    if not filters or "lambda *args, member=member, **kwargs" not in source or per_patch == shared:
        return None
    unwrapped = _builtin_function(core)

    def patch_attr(obj, name, member, builder, scope):
        semantic = interp.TritonSemantic(builder) if per_patch else None
        direct = unwrapped(member)

        def new_member(*args, **kwargs):
            sem = semantic if per_patch else interp.interpreter_semantic
            target = member
            if kwargs:
                kwargs.pop("_semantic", None)
                if "member" in kwargs:  # the lambda's own default parameter, which a keyword replaces
                    target = kwargs.pop("member")
            if target is member and direct is not None and sem is not None:
                return direct(*args, **kwargs, _semantic=sem)
            return target(*args, **kwargs, _semantic=sem)

        scope.set_attr(obj, name, new_member)

    return patch_attr


def _semantic_as_expected(semantic_cls) -> bool:
    binary = _source(getattr(semantic_cls, "binary_op_type_checking_impl", None))
    cast = _source(getattr(semantic_cls, "cast", None))
    computation = _source(getattr(semantic_cls, "computation_type_impl", None))
    broadcast = _source(getattr(semantic_cls, "broadcast_impl_value", None))
    to_tensor = _source(getattr(semantic_cls, "to_tensor", None))
    # Triton 3.6 casts a tensor operand in place; 3.9 through _cast_to_computation_type, and passes both
    # operands through to_tensor when it checks no arithmetic (a tensor comes back as it is).
    casts_in_place = "else self.cast(lhs, ret_sca_ty)" in binary
    casts_through = (
        "lhs = self._cast_to_computation_type(lhs, ret_sca_ty)" in binary
        and "if not isinstance(value, numbers.Number):\n            return self.cast(value, dtype)"
        in _source(getattr(semantic_cls, "_cast_to_computation_type", None))
        and "if isinstance(x, self.tensor):\n            return x" in to_tensor
    )
    return (
        "self.check_ptr_type_impl(lhs_sca_ty, rhs_sca_ty, allow_lhs_ptr)" in binary
        and "self.computation_type_impl(lhs_sca_ty, lhs_is_scalar, rhs_sca_ty, rhs_is_scalar, div_or_mod)"
        in binary
        and (casts_in_place or casts_through)
        and "lhs, rhs = self.broadcast_impl_value(lhs, rhs)" in binary
        and "if src_sca_ty == dst_sca_ty:\n            return input" in cast
        and "if a_ty.is_fp64() or b_ty.is_fp64():" in computation
        and "if lhs_shape != ret_shape:" in broadcast
        and "if rhs_shape != ret_shape:" in broadcast
    )


def _shortcut_semantic(semantic_cls, core) -> None:
    plain_dtype, tensor, block_type = core.dtype, core.tensor, core.block_type
    computation_type = semantic_cls.computation_type_impl
    binary_checks = semantic_cls.binary_op_type_checking_impl
    cast = semantic_cls.cast
    broadcast = semantic_cls.broadcast_impl_value
    promoted: dict = {}  # (a name, a_is_scalar, b name, b_is_scalar, div_or_mod) -> the promoted dtype
    keeps: dict = {}  # (name, div_or_mod) -> whether two tensors of that plain dtype compute in it

    def computation_type_impl(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod):
        if type(a_ty) is not plain_dtype or type(b_ty) is not plain_dtype:  # pointers, subclasses
            return computation_type(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod)
        key = (a_ty.name, bool(a_is_scalar), b_ty.name, bool(b_is_scalar), bool(div_or_mod))
        try:
            return promoted[key]
        except KeyError:
            result = promoted[key] = computation_type(self, a_ty, a_is_scalar, b_ty, b_is_scalar, div_or_mod)
            return result

    def binary_op_type_checking_impl(
        self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False, arithmetic_check=True, div_or_mod=False
    ):
        if type(lhs) is tensor and type(rhs) is tensor:
            lhs_ty, rhs_ty = lhs.type, rhs.type
            dtype = lhs_ty.scalar
            if dtype is rhs_ty.scalar and type(dtype) is plain_dtype:
                if lhs_ty is dtype:  # a scalar: the other must be one too
                    same_shape = rhs_ty is dtype
                else:
                    same_shape = (
                        type(lhs_ty) is block_type
                        and type(rhs_ty) is block_type
                        and lhs_ty.shape is rhs_ty.shape
                    )
                if same_shape and (not arithmetic_check or _keeps(self, dtype, div_or_mod)):
                    # Triton's code: no pointer to check, each cast to the dtype it has, nothing to broadcast
                    return lhs, rhs
        return binary_checks(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

    def _keeps(self, dtype, div_or_mod) -> bool:
        key = (dtype.name, bool(div_or_mod))
        try:
            return keeps[key]
        except KeyError:
            try:
                result = computation_type_impl(self, dtype, False, dtype, False, div_or_mod)
            except (TypeError, ValueError):  # refused: Triton's own code raises it again
                return False
            keeps[key] = kept = result == dtype  # then each operand's cast is to the dtype it has
            return kept

    def cast_(self, input, dst_ty, fp_downcast_rounding=None):
        if type(input) is tensor and input.type.scalar is dst_ty:  # Triton's first test: the same dtype
            return input
        return cast(self, input, dst_ty, fp_downcast_rounding)

    def broadcast_impl_value(self, lhs, rhs):
        lhs_ty, rhs_ty = lhs.type, rhs.type
        if type(lhs_ty) is block_type and type(rhs_ty) is block_type and lhs_ty.shape is rhs_ty.shape:
            return lhs, rhs  # one shape: Triton's code broadcasts neither
        return broadcast(self, lhs, rhs)

    # Triton's own functions, for a check that the shortcuts give what they give (tests/)
    semantic_cls._drills_tritons_own = {
        "computation_type_impl": computation_type,
        "binary_op_type_checking_impl": binary_checks,
        "cast": cast,
        "broadcast_impl_value": broadcast,
    }
    semantic_cls.broadcast_impl_value = broadcast_impl_value
    semantic_cls.computation_type_impl = computation_type_impl
    semantic_cls.binary_op_type_checking_impl = binary_op_type_checking_impl
    semantic_cls.cast = cast_
