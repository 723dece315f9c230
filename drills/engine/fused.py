"""Fused kernels for the engine's forward: one launch where the torch path runs a chain of them.

A decode step of SmolLM2 (30 layers) in plain torch launches about 1,050 kernels, 35 a layer, and most
of them are elementwise: RMSNorm alone is seven (float, pow, mean, add, rsqrt, multiply, cast, times
the weight), RoPE five per tensor, the residual add one, SiLU and the multiply two. At batch 256 each of
them moves a few hundred kilobytes, so each costs its launch and a round trip through HBM, not its math.
Fused, a decode layer is 9 launches: QKV GEMM, RoPE with the K/V store, F1's split kernel, O GEMM,
residual add + norm, gate-up GEMM, SiLU-and-mul, down GEMM, and the next residual add + norm; one more
where F1 splits the KV (its merge kernel), one more where L1's store_kvcache runs on its own (the
engine's fused_store=False).

    rms_norm(x, weight, eps, residual=None)   (T, H) -> (T, H); with residual: residual += x first
                                              (in place), and the norm is of the sum
    rope_(qkv, positions, cos, sin, num_rotated, head_dim)   rotates the first num_rotated heads of
                                              each packed row in place (q's heads then k's)
    rope_store_(qkv, positions, cos, sin, num_q_heads, k_cache, v_cache, slot_mapping)
                                              rope_ over q's and k's heads, and the rotated K and
                                              the V of each row written to its slot, as L1 writes them
    silu_mul(gate_up)                         (T, 2I) -> (T, I): silu(gate) * up

Each rounds where the torch path rounds (an fp32 sum cast to the model's dtype before the norm reads
it, each RoPE product cast before the subtraction), so the results stay within a unit or a few of the
dtype of the torch path's (the order of RMSNorm's sum of squares, a fused multiply-add where the
compiler contracts one); tests/test_engine_fused.py holds them to it, and greedy tokens to identity. The torch versions
live in model.py: rms_norm and apply_rope, which the CPU's torch path keeps running.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drills.device_errors import error_word, record_error
from drills.launch import launch, next_pow2

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_rows(name: str, t, width: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (tokens, features), got shape {tuple(t.shape)}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have contiguous rows (stride(1) == 1), got strides {t.stride()}")
    if width is not None and t.shape[1] != width:
        raise ValueError(f"{name} must have {width} columns, got {t.shape[1]}")


# ---------------------------------------------------------------------------------------------------
# RMSNorm, with the residual add before it


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [T, H], rows stride_x apart
    res_ptr,  # [T, H], rows stride_r apart: read, x added, written back (ADD only)
    w_ptr,  # [H]
    out_ptr,  # [T, H], rows stride_o apart
    stride_x,
    stride_r,
    stride_o,
    H,
    eps,
    BLOCK: tl.constexpr,  # >= H: a row stays in registers between its sum of squares and its store
    ADD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if ADD:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        # The residual stream is kept in the model's dtype, as torch's `h = h + delta` keeps it: the
        # sum is rounded before the norm reads it, so both paths normalise the same values.
        h = (x + r).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * stride_r + cols, h, mask=mask)
        x = h.to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / H
    # model.rms_norm casts the normalised row to the model's dtype, then multiplies by the weight.
    y = (x * tl.rsqrt(mean_sq + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm of the rows of x (T, H) times weight (H,), in x's dtype. With residual (T, H): residual
    += x first, in place, and the rows normalised are the sums (the residual stream's next value)."""
    _check_rows("x", x)
    T, H = x.shape
    if not isinstance(weight, torch.Tensor) or weight.shape != (H,) or weight.stride(0) != 1:
        raise ValueError(f"weight must be a contiguous ({H},) tensor, got {getattr(weight, 'shape', weight)}")
    if residual is not None:
        _check_rows("residual", residual, H)
        if residual.shape[0] != T or residual.dtype != x.dtype:
            raise ValueError(
                f"residual must be ({T}, {H}) in {x.dtype}, got {tuple(residual.shape)} {residual.dtype}"
            )
    out = torch.empty((T, H), dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    res = x if residual is None else residual
    launch(
        _rms_norm_kernel,
        (T,),
        (x, res, weight, out, x.stride(0), res.stride(0), out.stride(0), H, float(eps)),
        BLOCK=next_pow2(H),
        ADD=residual is not None,
        num_warps=4 if H <= 2048 else 8,
    )
    return out


# ---------------------------------------------------------------------------------------------------
# RoPE, in place on the packed QKV rows, and (optionally) L1's store of the rotated K and V


@triton.jit
def _rotate_heads(
    row_ptr, first, count, c, s, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr
):
    """Rotate heads first .. first + count - 1 of one packed row in place; returns the rotated halves
    ([BLOCK_H, BLOCK_D] each, in the row's dtype) and their mask, for a caller that stores them again."""
    heads = tl.arange(0, BLOCK_H)[:, None]  # [BLOCK_H, 1]
    i = tl.arange(0, BLOCK_D)[None, :]  # [1, BLOCK_D]
    mask = (heads < count) & (i < HALF)
    dtype = row_ptr.dtype.element_ty
    p1 = row_ptr + (first + heads) * (2 * HALF) + i  # [BLOCK_H, BLOCK_D]
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)
    # Every product rounded to the model's dtype before the sum, as four torch multiplies round them
    # (and so no fused multiply-add changes the last bit).
    a = ((x1 * c).to(dtype).to(tl.float32) - (x2 * s).to(dtype).to(tl.float32)).to(dtype)
    b = ((x2 * c).to(dtype).to(tl.float32) + (x1 * s).to(dtype).to(tl.float32)).to(dtype)
    tl.store(p1, a, mask=mask)
    tl.store(p1 + HALF, b, mask=mask)
    return a, b, mask


@triton.jit
def _rope_kernel(
    qkv_ptr,  # [T, width], rows stride_t apart; head h's dims at h * 2 * HALF .. (h + 1) * 2 * HALF
    pos_ptr,  # [T] int64
    cos_ptr,  # [max_position, HALF] fp32
    sin_ptr,  # [max_position, HALF] fp32
    slot_ptr,  # [T] int64, -1 for a padding row (STORE only)
    k_cache_ptr,  # [num_blocks, PAGE, num_kv, 2 * HALF] (STORE only)
    v_cache_ptr,  # the same shape and strides as k_cache (STORE only)
    err_ptr,  # [4] int64, the device error word
    stride_t,
    stride_cb,
    stride_ct,
    stride_ch,
    num_q,  # heads rotated and not stored: q's (all of them without STORE)
    num_kv,  # heads rotated and stored after q's (k's), then as many stored unrotated (v's); 0 without STORE
    max_position,
    num_slots,  # num_blocks * PAGE
    HALF: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    STORE: tl.constexpr,
):
    t = tl.program_id(0)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    bad = (pos < 0) | (pos >= max_position)
    record_error(err_ptr, bad, 61, t, pos)
    pos = tl.where(bad, 0, pos)  # read inside the table whatever the device value; the step raises
    i = tl.arange(0, BLOCK_D)[None, :]  # [1, BLOCK_D]
    dtype = qkv_ptr.dtype.element_ty
    # forward() casts the fp32 table to the model's dtype before multiplying: so does this.
    c = tl.load(cos_ptr + pos * HALF + i, mask=i < HALF, other=0.0).to(dtype).to(tl.float32)
    s = tl.load(sin_ptr + pos * HALF + i, mask=i < HALF, other=0.0).to(dtype).to(tl.float32)
    row = qkv_ptr + t.to(tl.int64) * stride_t
    _rotate_heads(row, 0, num_q, c, s, HALF, BLOCK_Q, BLOCK_D)
    if STORE:
        # L1's store (section 3.4 of its explainer), reading K from registers instead of from memory:
        # K is written back to the row (the attention call still receives it) and into its slot.
        ka, kb, mask = _rotate_heads(row, num_q, num_kv, c, s, HALF, BLOCK_KV, BLOCK_D)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        record_error(err_ptr, (slot >= num_slots) | (slot < -1), 62, t, slot)
        keep = (slot >= 0) & (slot < num_slots)  # padding, or a bad slot: nothing is stored
        slot = tl.where(keep, slot, 0)
        heads = tl.arange(0, BLOCK_KV)[:, None]  # [BLOCK_KV, 1]
        dst = (slot // PAGE) * stride_cb + (slot % PAGE) * stride_ct + heads * stride_ch + i
        mask = mask & keep
        out_dtype = k_cache_ptr.dtype.element_ty
        tl.store(k_cache_ptr + dst, ka.to(out_dtype), mask=mask)
        tl.store(k_cache_ptr + dst + HALF, kb.to(out_dtype), mask=mask)
        pv = row + (num_q + num_kv + heads) * (2 * HALF) + i  # v's heads follow k's
        v1 = tl.load(pv, mask=mask, other=0.0)
        v2 = tl.load(pv + HALF, mask=mask, other=0.0)
        tl.store(v_cache_ptr + dst, v1.to(out_dtype), mask=mask)
        tl.store(v_cache_ptr + dst + HALF, v2.to(out_dtype), mask=mask)


def _check_rope_args(qkv, positions, cos, sin, heads: int, head_dim: int) -> int:
    """The checks rope_ and rope_store_ share; returns head_dim / 2."""
    _check_rows("qkv", qkv)
    if head_dim % 2 or heads * head_dim > qkv.shape[1]:
        raise ValueError(
            f"the head dim D = {head_dim} must be even and {heads} heads of it must fit qkv's "
            f"{qkv.shape[1]} columns"
        )
    _check_index("positions", positions, qkv)
    half = head_dim // 2
    for name, table in (("cos", cos), ("sin", sin)):
        if (
            not isinstance(table, torch.Tensor)
            or table.dtype != torch.float32
            or table.dim() != 2
            or table.shape[0] < 1
            or table.shape[1] != half
            or not table.is_contiguous()
            or table.device != qkv.device
        ):
            raise ValueError(
                f"{name} must be a contiguous (max_position >= 1, {half}) float32 table on {qkv.device}"
            )
    return half


def _check_index(name: str, t, qkv) -> None:
    """A (T,) int32/int64 tensor beside qkv's rows: the kernel reads element t at t (stride 1)."""
    T = qkv.shape[0]
    if not isinstance(t, torch.Tensor) or t.shape != (T,) or t.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"{name} must be a ({T},) int32 or int64 tensor, got {getattr(t, 'shape', t)} {getattr(t, 'dtype', '')}"
        )
    if T > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous (stride 1), got stride {t.stride(0)}")
    if t.device != qkv.device:
        raise ValueError(f"{name} must be on qkv's device {qkv.device}, got {t.device}")


def rope_(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_rotated: int,
    head_dim: int,
) -> torch.Tensor:
    """Rotate dims i and i + head_dim/2 of the first num_rotated heads of every row of qkv (T, width),
    in place, by the angles of row t's position (cos, sin: (max_position, head_dim/2) fp32 tables).
    A position outside the table rotates by angle 0 and is recorded in the device error word (code
    61), which the engine reads once per step. Returns qkv."""
    half = _check_rope_args(qkv, positions, cos, sin, num_rotated, head_dim)
    if qkv.shape[0] == 0:
        return qkv
    launch(
        _rope_kernel,
        (qkv.shape[0],),
        (qkv, positions, cos, sin, positions, qkv, qkv, error_word(qkv.device), qkv.stride(0), 0, 0, 0)
        + (num_rotated, 0, cos.shape[0], 0),
        HALF=half,
        PAGE=1,
        BLOCK_Q=next_pow2(num_rotated),
        BLOCK_KV=1,
        BLOCK_D=next_pow2(half),
        STORE=False,
        num_warps=4,
    )
    return qkv


def rope_store_(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_q_heads: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """rope_ over q's and k's heads, and L1's store_kvcache of the rotated K and of V, in one launch.

    qkv (T, (Hq + 2 Hkv) D): q's heads, then k's, then v's; rotated in place as rope_ rotates them.
    k_cache, v_cache [num_blocks, PAGE, Hkv, D] with the same strides, D contiguous: row t's K and V go
    to slot slot_mapping[t] (T,) int32/int64, as L1 stores them; -1 stores nothing (a padding row). A
    slot outside [-1, num_blocks * PAGE) stores nothing and is recorded in the device error word (code
    62), a position outside the table as rope_ records it (61). Returns qkv.
    """
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(cache, torch.Tensor) or cache.dim() != 4:
            raise ValueError(
                f"{name} must be a [num_blocks, PAGE, Hkv, D] tensor, got {getattr(cache, 'shape', cache)}"
            )
        if cache.dtype not in DTYPES or cache.device != qkv.device:
            raise TypeError(
                f"{name} must be float16, bfloat16 or float32 on {qkv.device}, got {cache.dtype} on {cache.device}"
            )
        if cache.stride(3) != 1:
            raise ValueError(
                f"{name} must have contiguous head dims (stride(3) == 1), got strides {cache.stride()}"
            )
    if (
        v_cache.shape != k_cache.shape
        or v_cache.stride() != k_cache.stride()
        or v_cache.dtype != k_cache.dtype
    ):
        raise ValueError(
            f"v_cache must match k_cache's shape, strides and dtype: {tuple(v_cache.shape)} {v_cache.stride()} "
            f"vs {tuple(k_cache.shape)} {k_cache.stride()}"
        )
    if v_cache.data_ptr() == k_cache.data_ptr():
        raise ValueError("k_cache and v_cache are the same memory: V would overwrite K")
    num_blocks, page, num_kv, head_dim = k_cache.shape
    if page & (page - 1):
        raise ValueError(f"k_cache's PAGE must be a power of two, got {page}")
    half = _check_rope_args(qkv, positions, cos, sin, num_q_heads + 2 * num_kv, head_dim)
    if qkv.shape[1] != (num_q_heads + 2 * num_kv) * head_dim:
        raise ValueError(
            f"qkv must have (num_q_heads + 2 Hkv) D = {(num_q_heads + 2 * num_kv) * head_dim} columns, "
            f"got {qkv.shape[1]}"
        )
    _check_index("slot_mapping", slot_mapping, qkv)
    if qkv.shape[0] == 0:
        return qkv
    launch(
        _rope_kernel,
        (qkv.shape[0],),
        (qkv, positions, cos, sin, slot_mapping, k_cache, v_cache, error_word(qkv.device), qkv.stride(0))
        + (*k_cache.stride()[:3], num_q_heads, num_kv, cos.shape[0], num_blocks * page),
        HALF=half,
        PAGE=page,
        BLOCK_Q=next_pow2(num_q_heads),
        BLOCK_KV=next_pow2(num_kv),
        BLOCK_D=next_pow2(half),
        STORE=True,
        num_warps=4,
    )
    return qkv


# ---------------------------------------------------------------------------------------------------
# SiLU and the multiply


@triton.jit
def _silu_mul_kernel(
    gu_ptr,  # [T, 2I], rows stride_in apart: gate then up
    out_ptr,  # [T, I], rows stride_out apart
    stride_in,
    stride_out,
    I,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < I
    g = tl.load(gu_ptr + t * stride_in + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + t * stride_in + I + cols, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    act = (g * tl.sigmoid(g)).to(dtype).to(tl.float32)  # F.silu returns the model's dtype, then the multiply
    tl.store(out_ptr + t * stride_out + cols, (act * u).to(dtype), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up (T, 2I) holding gate's columns then up's: (T, I)."""
    _check_rows("gate_up", gate_up)
    T, two_i = gate_up.shape
    if two_i % 2:
        raise ValueError(f"gate_up must have an even number of columns (gate then up), got {two_i}")
    inter = two_i // 2
    out = torch.empty((T, inter), dtype=gate_up.dtype, device=gate_up.device)
    if T == 0:
        return out
    block = min(1024, next_pow2(inter))
    launch(
        _silu_mul_kernel,
        (T, triton.cdiv(inter, block)),
        (gate_up, out, gate_up.stride(0), out.stride(0), inter),
        BLOCK=block,
        num_warps=4,
    )
    return out
