"""Input validation shared by every launcher: each check raises ValueError or TypeError naming the
argument, before anything is launched. Lessons that read the same layouts (L2, F1) share one check."""

from __future__ import annotations

import math
import numbers

import torch

import drills.runtime
from drills.device_errors import raise_device_errors  # noqa: F401 - the one read of the device error word


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def tensor(
    name: str, t, rank: int | None = None, dtypes: tuple[torch.dtype, ...] | None = None
) -> torch.Tensor:
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
            raise ValueError(
                f"{name} must be contiguous in its last dimension, got strides {tuple(t.stride())}"
            )


def contiguous(**tensors: torch.Tensor) -> None:
    # For tensors a kernel reads as flat arrays (ptr + i): a strided view would be read at the wrong places.
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(
                f"{name} must be contiguous, got strides {tuple(t.stride())} for shape "
                f"{tuple(t.shape)}: pass {name}.contiguous()"
            )


def positive_int(name: str, value) -> int:
    """An int >= 1 (a bool or a float is a TypeError, even 2.0: a length or a count is never fractional)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def non_negative_int(name: str, value) -> int:
    """An int >= 0 (a length that may be 0: a padding sequence)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def finite_positive(name: str, value) -> float:
    """A Python number, finite and > 0 (a softmax scale: NaN, inf, 0 or a negative one is never meant)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a Python float, got {type(value).__name__}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte] of the elements t reaches."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _index_difference_exists(delta: int, dims: list[tuple[int, int]]) -> bool:
    """Whether some d with |d_k| < size_k gives sum(d_k * stride_k) == delta; dims = [(stride, size)] by
    decreasing stride. In a layout without self-overlap each stride exceeds what the smaller ones reach,
    so at most two d_k fit at each level; anything wider is answered True (assume they overlap)."""
    if not dims:
        return delta == 0
    (stride, size), rest = dims[0], dims[1:]
    reach = sum((n - 1) * s for s, n in rest)
    lo, hi = max(-(size - 1), -((reach - delta) // stride)), min(size - 1, (delta + reach) // stride)
    if hi - lo > 1:
        return True
    return any(_index_difference_exists(delta - d * stride, rest) for d in range(lo, hi + 1))


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some element of a is also an element of b. Exact for two views with one layout (K and V
    halves of one pool interleave without sharing), conservative otherwise (overlapping byte ranges)."""
    if a.numel() == 0 or b.numel() == 0:
        return False
    (a_lo, a_hi), (b_lo, b_hi) = _span(a), _span(b)
    if a_hi <= b_lo or b_hi <= a_lo:
        return False
    if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
        return True
    delta, misaligned = divmod(b.data_ptr() - a.data_ptr(), a.element_size())
    if misaligned:
        return True
    dims = sorted(((s, n) for n, s in zip(a.shape, a.stride()) if n > 1 and s > 0), reverse=True)
    return _index_difference_exists(delta, dims)


def disjoint(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a is b or shares_memory(a, b):
        same = "is" if a is b else "shares memory with"
        raise ValueError(
            f"{name_b} {same} {name_a}: pass two separate tensors (views of one pool are fine "
            "when they share no element)"
        )


def device_values_checked(check, t: torch.Tensor) -> bool:
    """Whether a launcher checks the values its tensors hold on the device (lengths, block ids, slots).

    Reading them costs a device-to-host copy that waits for the GPU (a sync: the host stops queueing
    work), and inside CUDA-graph capture it cannot happen at all. So: check=True always checks (and
    refuses to run while a graph is captured), check=False never does, and check=None (the default)
    checks when it costs no sync: tensors on the CPU. On a GPU the engine checks on the host, where it
    built those values, or passes check=True while developing.
    """
    if check is None:
        return t.device.type == "cpu"
    if not isinstance(check, bool):
        raise TypeError(f"check must be True, False or None, got {type(check).__name__} {check!r}")
    if check and t.is_cuda and torch.cuda.is_current_stream_capturing():
        raise ValueError(
            "check=True reads device values, which cannot happen while a CUDA graph is captured: check "
            "in an eager call before capturing, and capture with check=None"
        )
    return check


_HALF = (torch.float16, torch.bfloat16)
_DISJOINT_LAYOUTS: set[tuple] = set()  # (pointers, shapes, strides) of K, V (and out) found disjoint


MAX_GRID_YZ = 65535  # CUDA's limit on grid axes 1 and 2, in programs
# The domain the attention launchers admit, named once: the graders draw their cases from these.
HEAD_DIM_RANGE = (16, 256)  # head dims: the powers of two in this range
DECODE_MIN_PAGE = 16  # L2 loads one page per tile, so at least tl.dot's smallest tile
DECODE_MAX_PAGE = 128  # L2 holds a page of K and of V in registers: [128, 256] tiles are the most
STORE_MAX_KV_HEADS = 128  # L1 stores a token's [Hkv, D] heads as one tile: 128 x 256 elements at most
GATHER_MAX_PAGE = 128  # F1 and F2 gather a tile token by token, from PAGE = 1 up to this


def paged_decode_inputs(
    q,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    scale=None,
    out=None,
    min_page=DECODE_MIN_PAGE,
    max_page=None,
    check=None,
    cache_dtype=None,
):
    """Checks for a decode step over a paged KV cache (L2, F1, F3). Returns (B, Hq, Hkv, D, PAGE).

    min_page, max_page: the page sizes the kernel handles (L2 loads one page per tile, so at least 16
    for tl.dot; F1 gathers token by token and takes any power of two from 1 to 128).

    q [B, Hq, D] fp16/bf16; k_cache, v_cache [num_blocks, PAGE, Hkv, D]; block_tables [B, max_pages]
    int32; context_lens [B] int32 in [0, max_pages * PAGE] (0 is a padding sequence); out None or
    [B, Hq, D] of q's dtype. Shapes, dtypes, strides and devices are checked on every call (the host has
    them); the lengths and block ids only when device_values_checked(check, ...) says so. cache_dtype:
    the caches' dtype when it is not q's (F3's float8_e4m3fn cache).

    This runs before every decode step, so it is written for speed (about 10 us of Python on an H200's
    host, L2 section 3.6): each test reads attributes once, and the helpers that build the messages run
    only once a test has failed.
    """
    T = torch.Tensor
    if not (isinstance(q, T) and q.dim() == 3 and q.dtype in _HALF):
        tensor("q", q, 3, _HALF)
    dtype = q.dtype
    kv_dtype = cache_dtype or dtype
    named = (("k_cache", k_cache, 4), ("v_cache", v_cache, 4))
    for name, t, rank in named:
        if not (isinstance(t, T) and t.dim() == rank and t.dtype == kv_dtype):
            tensor(name, t, rank, (kv_dtype,))
    if not (isinstance(block_tables, T) and block_tables.dim() == 2 and block_tables.dtype == torch.int32):
        tensor("block_tables", block_tables, 2, (torch.int32,))
    if not (isinstance(context_lens, T) and context_lens.dim() == 1 and context_lens.dtype == torch.int32):
        tensor("context_lens", context_lens, 1, (torch.int32,))
    if out is not None and not (isinstance(out, T) and out.dim() == 3 and out.dtype == dtype):
        tensor("out", out, 3, (dtype,))
    device = q.device
    if (
        k_cache.device != device
        or v_cache.device != device
        or block_tables.device != device
        or context_lens.device != device
        or (out is not None and out.device != device)
        or (device.type == "cpu") != drills.runtime.current().interpreter
    ):
        named_all = dict(
            q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, context_lens=context_lens
        )
        if out is not None:
            named_all["out"] = out
        same_device(**named_all)

    B, Hq, D = q.shape
    k_shape = k_cache.shape
    _, PAGE, Hkv, Dk = k_shape
    if v_cache.shape != k_shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_shape)}")
    if Dk != D:
        raise ValueError(f"k_cache head dim {Dk} (k_cache.shape[3]) must equal q's head dim {D}")
    if not (is_pow2(D) and HEAD_DIM_RANGE[0] <= D <= HEAD_DIM_RANGE[1]):
        raise ValueError(f"head dim D = {D} (q.shape[2]) must be a power of two from 16 to 256")
    if not (is_pow2(PAGE) and min_page <= PAGE <= (max_page or PAGE)):
        allowed = f">= {min_page}" if max_page is None else f"from {min_page} to {max_page}"
        raise ValueError(f"page size PAGE = {PAGE} (k_cache.shape[1]) must be a power of two {allowed}")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"Hq = {Hq} (q.shape[1]) must be a multiple of Hkv = {Hkv} (k_cache.shape[2])")
    if Hkv > MAX_GRID_YZ:
        # The decode kernels put KV heads on grid axis 1, which CUDA caps: the domain stops there.
        raise ValueError(f"Hkv = {Hkv} KV heads (k_cache.shape[2]): at most {MAX_GRID_YZ} (grid axis 1)")
    if out is not None and out.shape != q.shape:
        raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    if (
        q.stride(2) != 1
        or k_cache.stride(3) != 1
        or v_cache.stride(3) != 1
        or (out is not None and out.stride(2) != 1)
    ):
        last_dim_contiguous(q=q, k_cache=k_cache, v_cache=v_cache, **({} if out is None else {"out": out}))
    bt_rows, max_pages = block_tables.shape
    if bt_rows != B:
        raise ValueError(f"block_tables must be [B={B}, max_pages], got {tuple(block_tables.shape)}")
    # Kernels read entry p of a row at row + p (rows may be strided: a slice of a wider table is fine).
    if max_pages > 1 and block_tables.stride(1) != 1:
        raise ValueError(
            f"block_tables must have contiguous rows (stride 1 along max_pages), got strides "
            f"{tuple(block_tables.stride())}: pass block_tables.contiguous()"
        )
    if context_lens.shape[0] != B:
        raise ValueError(f"context_lens must have B = {B} entries, got {context_lens.shape[0]}")
    if B > 1 and context_lens.stride(0) != 1:  # kernels read context_lens[b] at context_lens_ptr + b
        contiguous(context_lens=context_lens)
    # K and V are usually two views of one pool, their byte ranges interleaved: the exact test runs then.
    # The same pool (and out buffer) comes back every step, so a layout found disjoint once is remembered.
    layout = (k_cache.data_ptr(), v_cache.data_ptr(), k_shape, k_cache.stride(), v_cache.stride())
    if out is not None:
        layout += (out.data_ptr(), out.shape, out.stride())
    if layout not in _DISJOINT_LAYOUTS:
        k_span = _span(k_cache)
        v_span = _span(v_cache)
        if not (k_span[1] <= v_span[0] or v_span[1] <= k_span[0]):
            disjoint("k_cache", k_cache, "v_cache", v_cache)
        if out is not None:
            o_lo, o_hi = _span(out)
            for name, cache, (lo, hi) in (("k_cache", k_cache, k_span), ("v_cache", v_cache, v_span)):
                if not (hi <= o_lo or o_hi <= lo):
                    disjoint(name, cache, "out", out)
        if len(_DISJOINT_LAYOUTS) > 256:
            _DISJOINT_LAYOUTS.clear()
        _DISJOINT_LAYOUTS.add(layout)
    if scale is not None:
        finite_positive("scale", scale)
    if check is not None or device.type == "cpu":
        if device_values_checked(check, context_lens):
            context_lens_fit(context_lens, max_pages * PAGE)
            live_block_ids(block_tables, context_lens, PAGE, k_shape[0])
    return B, Hq, Hkv, D, PAGE


def context_lens_fit(context_lens: torch.Tensor, max_len: int, what: str = "max_pages * PAGE") -> None:
    """Every length in [0, max_len] (one host copy of the lengths). 0 is a padding sequence: nothing is read."""
    for i, n in enumerate(context_lens.tolist()):
        if not 0 <= n <= max_len:
            raise ValueError(
                f"context_lens[{i}] = {n} is outside [0, {what} = {max_len}] (0 marks a padding sequence)"
            )


def live_block_ids(
    block_tables: torch.Tensor, context_lens: torch.Tensor, PAGE: int, num_blocks: int
) -> None:
    """Every block id a kernel reads, block_tables[b, :cdiv(context_lens[b], PAGE)], lies in [0, num_blocks);
    entries past a sequence's last page are never read and may hold anything."""
    pages = (context_lens.long() + PAGE - 1) // PAGE  # [B]
    live = torch.arange(block_tables.shape[1], device=block_tables.device)[None, :] < pages[:, None]
    bad = live & ((block_tables < 0) | (block_tables >= num_blocks))  # [B, max_pages]
    if bad.any():
        b, p = bad.nonzero()[0].tolist()
        raise ValueError(
            f"block_tables[{b}, {p}] = {int(block_tables[b, p])} is outside the pool [0, num_blocks = "
            f"{num_blocks}): page {p} of sequence {b} is read (context_lens[{b}] = "
            f"{int(context_lens[b])}, PAGE = {PAGE})"
        )


def decode_plan_args(
    context_lens, num_kv_heads, page_size, num_sms=None, num_splits=None, max_page=GATHER_MAX_PAGE
) -> list[int]:
    """Checks for a split-KV planner's arguments (F1's plan()). Returns the lengths as a list of ints.

    context_lens a non-empty list of ints or a 1-D integer tensor, every length >= 0 (0: a padding sequence); num_kv_heads,
    num_sms (None or) and num_splits (None or) ints >= 1; page_size a power of two from 1 to max_page.
    """
    if isinstance(context_lens, torch.Tensor):
        if (
            context_lens.dim() != 1
            or context_lens.dtype.is_floating_point
            or context_lens.dtype.is_complex
            or context_lens.dtype == torch.bool
        ):
            raise TypeError(
                f"context_lens must be a 1-D integer tensor, got {str(context_lens.dtype).replace('torch.', '')} "
                f"of shape {tuple(context_lens.shape)}"
            )
        lens = context_lens.tolist()
    elif isinstance(context_lens, (list, tuple)):
        lens = list(context_lens)
    else:
        raise TypeError(
            f"context_lens must be a list of ints or a 1-D integer tensor, got {type(context_lens).__name__}"
        )
    if not lens:
        raise ValueError("context_lens must be a non-empty list of lengths >= 0")
    lens = [non_negative_int(f"context_lens[{i}]", n) for i, n in enumerate(lens)]
    positive_int("num_kv_heads", num_kv_heads)
    if isinstance(page_size, bool) or not isinstance(page_size, numbers.Integral):
        raise TypeError(f"page_size must be an int, got {type(page_size).__name__} {page_size!r}")
    if not (is_pow2(page_size) and page_size <= max_page):
        raise ValueError(f"page_size must be a power of two from 1 to {max_page}, got {page_size!r}")
    if num_sms is not None:
        positive_int("num_sms", num_sms)
    if num_splits is not None:
        positive_int("num_splits", num_splits)
    return lens


def offsets_fit_int32(**tensors: torch.Tensor) -> None:
    # Kernels that build element offsets as int32 (offs * stride) must never see one past 2**31 - 1.
    for name, t in tensors.items():
        last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()) if size > 0)
        if last >= 2**31:
            raise ValueError(
                f"{name} spans {last + 1} elements (shape {tuple(t.shape)}, strides "
                f"{tuple(t.stride())}): past the int32 offsets this kernel computes"
            )


def paged_prefill_inputs(
    q,
    k_cache,
    v_cache,
    block_tables,
    cu_seqlens_q,
    context_lens,
    scale=None,
    out=None,
    return_lse=False,
    check=None,
):
    """Checks for a paged prefill (L4): packed new tokens over a paged cache. Returns (B, Hq, Hkv, D, PAGE).

    q [total_q, Hq, D] fp16/bf16; k_cache, v_cache [num_blocks, PAGE, Hkv, D], PAGE any power of two;
    block_tables [B, max_pages] int32; cu_seqlens_q [B + 1] int32, 0 then non-decreasing up to total_q;
    context_lens [B] int32 with q_len_b <= context_lens[b] <= max_pages * PAGE; out None or q's shape and
    dtype; return_lse a bool. Only sequences with new tokens have their live block ids checked: the
    kernel never reads the table of a q_len = 0 (padding) row. The values (cu_seqlens_q, context_lens,
    block ids) are read only when device_values_checked(check, context_lens) says so.
    """
    tensor("q", q, 3, (torch.float16, torch.bfloat16))
    tensor("k_cache", k_cache, 4, (q.dtype,))
    tensor("v_cache", v_cache, 4, (q.dtype,))
    tensor("block_tables", block_tables, 2, (torch.int32,))
    tensor("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32,))
    tensor("context_lens", context_lens, 1, (torch.int32,))
    named = dict(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        cu_seqlens_q=cu_seqlens_q,
        context_lens=context_lens,
    )
    if out is not None:
        named["out"] = tensor("out", out, 3, (q.dtype,))
    same_device(**named)

    total_q, Hq, D = q.shape
    _, PAGE, Hkv, Dk = k_cache.shape
    if v_cache.shape != k_cache.shape:
        raise ValueError(
            f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}"
        )
    if Dk != D:
        raise ValueError(f"k_cache head dim {Dk} (k_cache.shape[3]) must equal q's head dim {D}")
    if not (is_pow2(D) and HEAD_DIM_RANGE[0] <= D <= HEAD_DIM_RANGE[1]):
        raise ValueError(f"head dim D = {D} (q.shape[2]) must be a power of two from 16 to 256")
    if not is_pow2(PAGE):
        raise ValueError(f"page size PAGE = {PAGE} (k_cache.shape[1]) must be a power of two")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"Hq = {Hq} (q.shape[1]) must be a multiple of Hkv = {Hkv} (k_cache.shape[2])")
    if out is not None and out.shape != q.shape:
        raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    last_dim_contiguous(**{n: named[n] for n in ("q", "k_cache", "v_cache", "out") if n in named})
    B = block_tables.shape[0]
    if B < 1:
        raise ValueError(f"block_tables must have a row per sequence, got shape {tuple(block_tables.shape)}")
    if block_tables.shape[1] > 1 and block_tables.stride(1) != 1:
        raise ValueError(
            f"block_tables must have contiguous rows (stride 1 along max_pages), got strides "
            f"{tuple(block_tables.stride())}: pass block_tables.contiguous()"
        )
    if context_lens.shape[0] != B:
        raise ValueError(
            f"context_lens must have B = {B} entries (block_tables.shape[0]), got {context_lens.shape[0]}"
        )
    if cu_seqlens_q.shape[0] != B + 1:
        raise ValueError(
            f"cu_seqlens_q must have B + 1 = {B + 1} entries (B = block_tables.shape[0]), got {cu_seqlens_q.shape[0]}"
        )
    contiguous(cu_seqlens_q=cu_seqlens_q, context_lens=context_lens)  # read at ptr + b by the kernel
    disjoint("k_cache", k_cache, "v_cache", v_cache)
    if out is not None:
        disjoint("k_cache", k_cache, "out", out)
        disjoint("v_cache", v_cache, "out", out)
    if scale is not None:
        finite_positive("scale", scale)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")

    # The value checks cost host syncs: only where device_values_checked allows them (section 3.6 of L2).
    if not device_values_checked(check, context_lens):
        return B, Hq, Hkv, D, PAGE
    cu = cu_seqlens_q.tolist()
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens_q[0] = {cu[0]} must be 0: sequence 0's new tokens start at row 0 of q")
    for b in range(B):
        if cu[b + 1] < cu[b]:
            raise ValueError(
                f"cu_seqlens_q must be non-decreasing: cu_seqlens_q[{b + 1}] = {cu[b + 1]} < "
                f"cu_seqlens_q[{b}] = {cu[b]}"
            )
    if cu[B] != total_q:
        raise ValueError(
            f"cu_seqlens_q[{B}] = {cu[B]} must equal total_q = {total_q} (q.shape[0]): every row of q "
            "belongs to one sequence"
        )
    max_len = block_tables.shape[1] * PAGE
    for b, n in enumerate(context_lens.tolist()):
        q_len = cu[b + 1] - cu[b]
        if n < q_len:
            raise ValueError(
                f"context_lens[{b}] = {n} is less than sequence {b}'s q_len = {q_len} (cu_seqlens_q[{b + 1}] - "
                f"cu_seqlens_q[{b}]): context_lens counts the cached prefix plus the new tokens"
            )
        if n > max_len:
            raise ValueError(
                f"context_lens[{b}] = {n} is past the block table's capacity max_pages * PAGE = {max_len}"
            )
    has_new = torch.tensor([cu[b + 1] > cu[b] for b in range(B)], device=context_lens.device)
    live_block_ids(block_tables, torch.where(has_new, context_lens, 0), PAGE, k_cache.shape[0])
    return B, Hq, Hkv, D, PAGE
