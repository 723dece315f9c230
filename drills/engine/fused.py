"""Fused kernels for the engine's forward: one launch where the torch path runs a chain of them.

A decode step of SmolLM2 (30 layers) in plain torch launches about 1,050 kernels, 35 a layer, and most
of them are elementwise: RMSNorm alone is seven (float, pow, mean, add, rsqrt, multiply, cast, times
the weight), RoPE five per tensor, the residual add one, SiLU and the multiply two. At batch 256 each of
them moves a few hundred kilobytes, so each costs its launch and a round trip through HBM, not its math.
Fused, a layer is 11 launches: norm, QKV GEMM, RoPE, L1's store, F1's two kernels, O GEMM, residual add
+ norm, gate-up GEMM, SiLU-and-mul, down GEMM, and the next residual add + norm.

    rms_norm(x, weight, eps, residual=None)   (T, H) -> (T, H); with residual: residual += x first
                                              (in place), and the norm is of the sum
    rope_(qkv, positions, cos, sin, num_rotated, head_dim)   rotates the first num_rotated heads of
                                              each packed row in place (q's heads then k's)
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
# RoPE, in place on the packed QKV rows


@triton.jit
def _rope_kernel(
    qkv_ptr,  # [T, width], rows stride_t apart; head h's dims at h * 2 * HALF .. (h + 1) * 2 * HALF
    pos_ptr,  # [T] int64
    cos_ptr,  # [max_position, HALF] fp32
    sin_ptr,  # [max_position, HALF] fp32
    err_ptr,  # [4] int64, the device error word
    stride_t,
    num_heads,  # heads rotated: q's then k's
    max_position,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    bad = (pos < 0) | (pos >= max_position)
    record_error(err_ptr, bad, 61, t, pos)
    pos = tl.where(bad, 0, pos)  # read inside the table whatever the device value; the step raises
    heads = tl.arange(0, BLOCK_H)[:, None]  # [BLOCK_H, 1]
    i = tl.arange(0, BLOCK_D)[None, :]  # [1, BLOCK_D]
    dmask = i < HALF
    mask = (heads < num_heads) & dmask
    dtype = qkv_ptr.dtype.element_ty
    # forward() casts the fp32 table to the model's dtype before multiplying: so does this.
    c = tl.load(cos_ptr + pos * HALF + i, mask=dmask, other=0.0).to(dtype).to(tl.float32)
    s = tl.load(sin_ptr + pos * HALF + i, mask=dmask, other=0.0).to(dtype).to(tl.float32)
    p1 = qkv_ptr + t.to(tl.int64) * stride_t + heads * (2 * HALF) + i  # [BLOCK_H, BLOCK_D]
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)
    # Every product rounded to the model's dtype before the sum, as four torch multiplies round them
    # (and so no fused multiply-add changes the last bit).
    a = (x1 * c).to(dtype).to(tl.float32) - (x2 * s).to(dtype).to(tl.float32)
    b = (x2 * c).to(dtype).to(tl.float32) + (x1 * s).to(dtype).to(tl.float32)
    tl.store(p1, a.to(dtype), mask=mask)
    tl.store(p1 + HALF, b.to(dtype), mask=mask)


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
    _check_rows("qkv", qkv)
    if head_dim % 2 or num_rotated * head_dim > qkv.shape[1]:
        raise ValueError(
            f"num_rotated * head_dim = {num_rotated} * {head_dim} must be even and fit qkv's {qkv.shape[1]} columns"
        )
    if positions.shape != (qkv.shape[0],) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"positions must be ({qkv.shape[0]},) int32 or int64, got {tuple(positions.shape)} {positions.dtype}"
        )
    half = head_dim // 2
    for name, table in (("cos", cos), ("sin", sin)):
        if (
            table.dtype != torch.float32
            or table.dim() != 2
            or table.shape[1] != half
            or not table.is_contiguous()
        ):
            raise ValueError(f"{name} must be a contiguous (max_position, {half}) float32 table")
    if qkv.shape[0] == 0:
        return qkv
    launch(
        _rope_kernel,
        (qkv.shape[0],),
        (qkv, positions, cos, sin, error_word(qkv.device), qkv.stride(0), num_rotated, cos.shape[0]),
        HALF=half,
        BLOCK_H=next_pow2(num_rotated),
        BLOCK_D=next_pow2(half),
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
