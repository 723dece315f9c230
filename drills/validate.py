"""Input validation shared by every launcher: each check raises ValueError or TypeError naming the
argument, before anything is launched. Lessons that read the same layouts (L2, F1) share one check."""
from __future__ import annotations

import torch

import drills.runtime


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def tensor(name: str, t, rank: int | None = None, dtypes: tuple[torch.dtype, ...] | None = None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if rank is not None and t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must be {allowed}, got {str(t.dtype).replace('torch.', '')}")
    return t


def same_device(**tensors: torch.Tensor) -> None:
    """All on one device, and the device the runtime can run: CPU under the interpreter, CUDA otherwise."""
    runtime = drills.runtime.current()
    (first_name, first), *_ = tensors.items()
    for name, t in tensors.items():
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}: use one device")
        if runtime.interpreter and t.device.type != "cpu":
            raise ValueError(f"{name} is on {t.device}, but the Triton interpreter only reads CPU tensors")
        if not runtime.interpreter and t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}; compiled Triton needs CUDA tensors")


def last_dim_contiguous(**tensors: torch.Tensor) -> None:
    # Kernels add offs_d to a row pointer, so elements of one row must be adjacent.
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension, got strides {tuple(t.stride())}")


def paged_decode_inputs(q, k_cache, v_cache, block_tables, context_lens, scale=None, out=None, min_page=16,
                        max_page=None):
    """Checks for a decode step over a paged KV cache (L2, F1). Returns (B, Hq, Hkv, D, PAGE).

    min_page, max_page: the page sizes the kernel handles (L2 loads one page per tile, so at least 16
    for tl.dot; F1 gathers token by token and takes any power of two from 1 to 128).

    q [B, Hq, D] fp16/bf16; k_cache, v_cache [num_blocks, PAGE, Hkv, D]; block_tables [B, max_pages]
    int32; context_lens [B] int32 in [1, max_pages * PAGE]; out None or [B, Hq, D] of q's dtype.
    """
    tensor("q", q, 3, (torch.float16, torch.bfloat16))
    tensor("k_cache", k_cache, 4, (q.dtype,))
    tensor("v_cache", v_cache, 4, (q.dtype,))
    tensor("block_tables", block_tables, 2, (torch.int32,))
    tensor("context_lens", context_lens, 1, (torch.int32,))
    named = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, context_lens=context_lens)
    if out is not None:
        named["out"] = tensor("out", out, 3, (q.dtype,))
    same_device(**named)

    B, Hq, D = q.shape
    _, PAGE, Hkv, Dk = k_cache.shape
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    if Dk != D:
        raise ValueError(f"k_cache head dim {Dk} (k_cache.shape[3]) must equal q's head dim {D}")
    if not (is_pow2(D) and 16 <= D <= 256):
        raise ValueError(f"head dim D = {D} (q.shape[2]) must be a power of two from 16 to 256")
    if not (is_pow2(PAGE) and min_page <= PAGE <= (max_page or PAGE)):
        allowed = f">= {min_page}" if max_page is None else f"from {min_page} to {max_page}"
        raise ValueError(f"page size PAGE = {PAGE} (k_cache.shape[1]) must be a power of two {allowed}")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"Hq = {Hq} (q.shape[1]) must be a multiple of Hkv = {Hkv} (k_cache.shape[2])")
    if out is not None and out.shape != q.shape:
        raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    last_dim_contiguous(**{n: named[n] for n in ("q", "k_cache", "v_cache", "out") if n in named})
    if block_tables.shape[0] != B or block_tables.stride(1) != 1:
        raise ValueError(f"block_tables must be [B={B}, max_pages] with contiguous rows, got {tuple(block_tables.shape)}")
    if context_lens.shape[0] != B:
        raise ValueError(f"context_lens must have B = {B} entries, got {context_lens.shape[0]}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"scale must be a Python float, got {type(scale).__name__}")

    # The value check costs one host sync; benchmarks time the bare launch so it stays out of kernel time.
    max_len = block_tables.shape[1] * PAGE
    for i, n in enumerate(context_lens.tolist()):
        if not 1 <= n <= max_len:
            raise ValueError(f"context_lens[{i}] = {n} is outside [1, max_pages * PAGE = {max_len}]")
    return B, Hq, Hkv, D, PAGE


def offsets_fit_int32(**tensors: torch.Tensor) -> None:
    # Kernels that build element offsets as int32 (offs * stride) must never see one past 2**31 - 1.
    for name, t in tensors.items():
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)
        if last >= 2**31:
            raise ValueError(f"{name} spans {last + 1} elements (shape {tuple(t.shape)}, strides "
                             f"{tuple(t.stride())}): past the int32 offsets this kernel computes")
