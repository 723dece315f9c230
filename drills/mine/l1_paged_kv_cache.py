"""L1, your file: the paged KV cache.

Fill in, in this order: BlockAllocator, BlockTable, waste_contiguous and waste_paged (plain Python), then
`store_kvcache_kernel`; the launcher under it is complete. Read drills/content/l1_paged_kv_cache.md
first: every TODO names the section that teaches it. Grade with `make test L=l1`. Each public function
(and each class's __init__) starts with a `raise NotImplementedError` line: delete it when you fill it in.

    bytes = 2 (K and V) * N * Hkv * D * elt read + the same written   # N=32768, Hkv=8, D=128, fp16: 268 MB
"""

from __future__ import annotations

import math
from collections import deque

import torch
import triton
import triton.language as tl

from drills import validate
from drills.device_errors import error_word
from drills.launch import launch, next_pow2


class BlockAllocator:
    """A pool of `num_blocks` KV-cache blocks handed out from a free list.

    allocate() -> int   takes the block at the front of the free list (a fresh pool gives 0, 1, 2, ...);
                        RuntimeError when every block is in use
    free(block)         puts an allocated block back at the end of the free list; ValueError for a block
                        that is already free (double free) or outside the pool
    num_free            how many blocks are free now
    """

    def __init__(self, num_blocks):
        raise NotImplementedError(
            "l1 is not started: fill in BlockAllocator in drills/mine/l1_paged_kv_cache.py, then delete this line (read drills/content/l1_paged_kv_cache.md)"
        )
        # TODO(section 3.1 "The allocator"): reject a num_blocks that is not a positive int (ValueError);
        # keep num_blocks, a free list that hands out 0, 1, 2, ... first (collections.deque), and the set
        # of blocks now allocated (free() needs it to recognise a double free).

    @property
    def num_free(self) -> int:
        # TODO(section 3.1 "The allocator"): how many blocks are free now.
        raise NotImplementedError("TODO(section 3.1): BlockAllocator.num_free")

    def allocate(self) -> int:
        # TODO(section 3.1 "The allocator"): RuntimeError saying the pool is out of blocks when the free
        # list is empty; otherwise take the front of the free list and remember it as allocated.
        raise NotImplementedError("TODO(section 3.1): BlockAllocator.allocate")

    def free(self, block: int) -> None:
        # TODO(section 3.1 "The allocator"): ValueError for a block outside [0, num_blocks) and for one
        # that is not allocated now (a double free); otherwise put it back at the end of the free list.
        raise NotImplementedError("TODO(section 3.1): BlockAllocator.free")


class BlockTable:
    """One sequence's block table: logical block i of the sequence lives in physical block blocks[i].

    append_tokens(n) -> list[int]   grows the sequence by n tokens, taking one more block from the
                                    allocator each time the last block is full; returns the n new
                                    tokens' slots (their slot_mapping). All or nothing: RuntimeError,
                                    with nothing allocated, when the pool cannot hold them
    blocks                          the physical block ids, logical order
    num_tokens                      tokens stored so far
    last_block_is_full              True when the last block has no free slot left
    lookup(t) -> (logical, physical, offset) where token t lives
    slot(t) -> int                  physical * block_size + offset, the token's row in the flat cache
    release()                       every block back to the allocator; the table is empty again
    """

    def __init__(self, allocator, block_size):
        raise NotImplementedError(
            "l1 is not started: fill in BlockTable in drills/mine/l1_paged_kv_cache.py, then delete this line (read drills/content/l1_paged_kv_cache.md)"
        )
        # TODO(section 3.2 "The block table"): reject a block_size that is not a positive int
        # (ValueError); keep the allocator, block_size, num_tokens = 0 and an empty list of blocks.

    @property
    def blocks(self) -> list[int]:
        # TODO(section 3.2 "The block table"): the physical block ids in logical order (return a copy).
        raise NotImplementedError("TODO(section 3.2): BlockTable.blocks")

    @property
    def last_block_is_full(self) -> bool:
        # TODO(section 2.3 "The block table lookup"): True when the table has a block and every slot of
        # the last one holds a token. append_tokens uses it to decide when to take a new block.
        raise NotImplementedError("TODO(section 2.3): BlockTable.last_block_is_full")

    def append_tokens(self, n: int) -> list[int]:
        # TODO(section 3.2 "The block table"): ValueError for a negative n. Count the new blocks the n
        # tokens need; RuntimeError, before allocating anything, when the allocator has fewer free. Then
        # token by token: a new block when there is none yet or the last is full. Return the new tokens'
        # slots (section 2.4).
        raise NotImplementedError("TODO(section 3.2): BlockTable.append_tokens")

    def lookup(self, token_index: int) -> tuple[int, int, int]:
        # TODO(section 2.3 "The block table lookup"): IndexError for a token outside [0, num_tokens);
        # otherwise (logical block, physical block, offset in the block).
        raise NotImplementedError("TODO(section 2.3): BlockTable.lookup")

    def slot(self, token_index: int) -> int:
        # TODO(section 2.4 "Slot mapping"): the token's row in the cache seen as [num_blocks * PAGE, ...].
        raise NotImplementedError("TODO(section 2.4): BlockTable.slot")

    def release(self) -> None:
        # TODO(section 3.2 "The block table"): every block back to the allocator; the table is empty.
        raise NotImplementedError("TODO(section 3.2): BlockTable.release")


def _check_lengths(lengths) -> list[int]:
    lengths = list(lengths)
    for i, n in enumerate(lengths):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"lengths[{i}] = {n!r} must be a non-negative int")
    return lengths


def waste_contiguous(lengths, reserved):
    """KV slots held when every request reserves `reserved` contiguous token slots up front.

    lengths   tokens each request really holds, e.g. [3, 5, 2]
    reserved  slots reserved per request, e.g. 8
    Returns (allocated, wasted, wasted / allocated): (24, 14, 0.5833) for the example.
    A request longer than its reservation raises ValueError: a contiguous cache must reallocate
    and copy it.
    """
    raise NotImplementedError(
        "l1 is not started: fill in waste_contiguous in drills/mine/l1_paged_kv_cache.py, then delete this line (read drills/content/l1_paged_kv_cache.md)"
    )
    lengths = _check_lengths(lengths)
    # TODO(section 2.1 "Contiguous vs paged"): ValueError for a reserved that is not a positive int, and
    # for a request longer than its reservation (name lengths[i] and say it must be reallocated). Then
    # (allocated, wasted, wasted / allocated), with 0.0 as the fraction when nothing is allocated.
    raise NotImplementedError("TODO(section 2.1): waste_contiguous")


def waste_paged(lengths, block_size):
    """KV slots held when every request takes whole blocks of `block_size` slots, as it grows.

    lengths     tokens each request really holds, e.g. [3, 5, 2]
    block_size  slots per block, e.g. 4
    Returns (allocated, wasted, wasted / allocated): (16, 6, 0.375) for the example. Only the last
    block of each request can be partly empty.
    """
    raise NotImplementedError(
        "l1 is not started: fill in waste_paged in drills/mine/l1_paged_kv_cache.py, then delete this line (read drills/content/l1_paged_kv_cache.md)"
    )
    lengths = _check_lengths(lengths)
    # TODO(section 2.1 "Contiguous vs paged"): ValueError for a block_size that is not a positive int.
    # Each request holds whole blocks; return (allocated, wasted, wasted / allocated), 0.0 when empty.
    raise NotImplementedError("TODO(section 2.1): waste_paged")


@triton.jit
def store_kvcache_kernel(
    key_ptr,  # [N, Hkv, D]
    value_ptr,  # [N, Hkv, D]
    k_cache_ptr,  # [num_blocks, PAGE, Hkv, D]
    v_cache_ptr,  # [num_blocks, PAGE, Hkv, D], k_cache's strides
    slot_mapping_ptr,  # [N] int64, -1 for a padding row
    stride_kn,
    stride_kh,
    stride_vn,
    stride_vh,
    stride_cb,
    stride_ct,
    stride_ch,
    num_slots,  # num_blocks * PAGE: the device guard's bound for slots
    err_ptr,  # [4] int64, the device error word (drills/device_errors.py)
    PAGE: tl.constexpr,
    Hkv: tl.constexpr,
    D: tl.constexpr,
    HKV_PAD: tl.constexpr,  # next_pow2(Hkv): tl.arange needs a power of two
    D_PAD: tl.constexpr,  # next_pow2(D)
    GUARD: tl.constexpr,  # section 3.8: contain bad slots (False only to time the guard's cost)
):
    # num_slots, err_ptr and GUARD serve the reference's device guard (section 3.8, read it once you
    # pass): your kernel may leave them unused; the grader gives it valid slots on the default path.
    # TODO(section 3.4 "One program per token"): which key/value row i this program owns (widen it to
    # int64), its slot from slot_mapping, and return at once for a padding row (slot -1).

    # TODO(section 3.5 "From slot to address"): the physical block and the offset inside it, from the slot.

    # TODO(section 3.6 "Masks"): offsets over HKV_PAD heads and D_PAD features, masked to the real Hkv
    # and D; load the [HKV_PAD, D_PAD] tiles of key and value and store them at the slot in both caches.
    pass


def _check_caches_apart(k_cache, v_cache):
    """Every element of k_cache and v_cache belongs to one slot of one cache: no two slots of a cache
    share memory (an expand()ed cache), and V shares none with K (v_cache is k_cache, or a shifted view).
    Both have one shape and strides, so they share an element exactly when the distance between their
    first elements is a sum of c_k * stride_k with |c_k| < size_k."""
    if k_cache.numel() == 0:
        return
    dims = sorted((s, n) for s, n in zip(k_cache.stride(), k_cache.shape) if n > 1)  # smallest stride first
    reach = 0  # the largest offset the dimensions seen so far reach
    for s, n in dims:
        if s <= reach:  # two different index tuples can land on one element
            raise ValueError(
                f"k_cache and v_cache have strides {tuple(k_cache.stride())} for shape "
                f"{tuple(k_cache.shape)}: two slots would share memory (an expand()ed cache?)"
            )
        reach += (n - 1) * s
    elt = k_cache.element_size()
    d, misaligned = divmod(v_cache.data_ptr() - k_cache.data_ptr(), elt)
    if misaligned:  # not a whole number of elements apart: apart only if the byte ranges are
        shared = abs(v_cache.data_ptr() - k_cache.data_ptr()) < (reach + 1) * elt
    else:
        # Largest stride first; each stride exceeds what the smaller ones reach, so at most two c_k
        # leave a remainder those can still cover: a handful of candidates, not a search.
        rests = [d]
        for s, n in reversed(dims):
            reach -= (n - 1) * s  # what the smaller strides reach
            rests = [
                r - c * s
                for r in rests
                for c in range(max(1 - n, -((reach - r) // s)), min(n - 1, (r + reach) // s) + 1)
            ]
        shared = 0 in rests
    if shared:
        raise ValueError(
            "v_cache shares memory with k_cache (the same tensor, or overlapping views of one "
            "buffer): the V store would overwrite K"
        )


def _check_inputs(key, value, k_cache, v_cache, slot_mapping, check=None):
    """Section 3.7 "The launcher's checks": shapes, dtypes, and the slot values themselves (those only
    where validate.device_values_checked says: reading them from a GPU is a sync, and graph capture
    forbids it)."""
    validate.tensor("key", key, 3, (torch.float16, torch.bfloat16, torch.float32))
    validate.tensor("value", value, 3, (key.dtype,))
    validate.tensor("k_cache", k_cache, 4, (key.dtype,))
    validate.tensor("v_cache", v_cache, 4, (key.dtype,))
    validate.tensor("slot_mapping", slot_mapping, 1, (torch.int64,))
    validate.same_device(key=key, value=value, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    N, Hkv, D = key.shape
    num_blocks, PAGE = k_cache.shape[:2]
    if value.shape != key.shape:
        raise ValueError(f"value shape {tuple(value.shape)} must equal key shape {tuple(key.shape)}")
    # One program stores a token's [Hkv, D] heads as one padded tile: its size is bounded, so are they.
    if not 1 <= D <= validate.HEAD_DIM_RANGE[1]:
        raise ValueError(f"head dim D = {D} (key.shape[2]) must be from 1 to {validate.HEAD_DIM_RANGE[1]}")
    if not 1 <= Hkv <= validate.STORE_MAX_KV_HEADS:
        raise ValueError(
            f"Hkv = {Hkv} KV heads (key.shape[1]) must be from 1 to {validate.STORE_MAX_KV_HEADS}"
        )
    if tuple(k_cache.shape[2:]) != (Hkv, D):
        raise ValueError(
            f"k_cache is [num_blocks, PAGE, Hkv, D] = {tuple(k_cache.shape)}, but key has "
            f"Hkv = {Hkv}, D = {D}"
        )
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError(
            f"v_cache (shape {tuple(v_cache.shape)}, strides {v_cache.stride()}) must have "
            f"k_cache's shape {tuple(k_cache.shape)} and strides {k_cache.stride()}"
        )
    validate.last_dim_contiguous(key=key, value=value, k_cache=k_cache, v_cache=v_cache)
    _check_caches_apart(k_cache, v_cache)
    if slot_mapping.shape[0] != N:
        raise ValueError(
            f"slot_mapping must have one entry per key row, N = {N}, got {slot_mapping.shape[0]}"
        )
    if N > 1 and slot_mapping.stride(0) != 1:  # the kernel reads entry i at slot_mapping_ptr + i
        raise ValueError(
            f"slot_mapping must be contiguous, got stride {slot_mapping.stride(0)} (a view such as "
            "wide[::2]?): pass slot_mapping.contiguous()"
        )

    # Value checks cost a host sync; the benchmark times _launch without them.
    if not validate.device_values_checked(check, slot_mapping):
        return
    num_slots = num_blocks * PAGE
    bad = ((slot_mapping < -1) | (slot_mapping >= num_slots)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"slot_mapping[{i}] = {int(slot_mapping[i])} is outside [-1, num_blocks * PAGE = "
            f"{num_slots}) (-1 marks a padding row)"
        )
    real = slot_mapping[slot_mapping >= 0].sort().values
    repeated = real[1:][real[1:] == real[:-1]]
    if len(repeated):
        s = int(repeated[0])
        rows = (slot_mapping == s).nonzero().flatten()[:2].tolist()
        raise ValueError(
            f"slot_mapping holds slot {s} twice (rows {rows[0]} and {rows[1]}): two tokens "
            "would race to write one slot"
        )


def _launch(key, value, k_cache, v_cache, slot_mapping, guard=True):
    """Launch without checks: the benchmark times this, the public function adds the checks. guard=False
    drops the device guard (section 3.8), only so that the benchmark can time what it costs."""
    N, Hkv, D = key.shape
    if N == 0:
        return
    # launch() calls the compiled binary directly once it has seen this specialisation (L2 section 3.6).
    launch(
        store_kvcache_kernel,
        (N,),
        (
            key,
            value,
            k_cache,
            v_cache,
            slot_mapping,
            *key.stride()[:2],
            *value.stride()[:2],
            *k_cache.stride()[:3],
            k_cache.shape[0] * k_cache.shape[1],
            error_word(key.device),
        ),
        PAGE=k_cache.shape[1],
        Hkv=Hkv,
        D=D,
        HKV_PAD=next_pow2(Hkv),
        D_PAD=next_pow2(D),
        GUARD=guard,
        num_warps=4,
    )


def store_kvcache(key, value, k_cache, v_cache, slot_mapping, check=None):
    """Write each new token's K and V into its slot of the paged cache, in place.

    key, value    [N, Hkv, D] float16, bfloat16 or float32, 1 <= Hkv <= 128 and 1 <= D <= 256, any strides
                  with the last dimension contiguous (views of a fused qkv projection, say); value's strides
                  may differ from key's
    k_cache       [num_blocks, PAGE, Hkv, D] of key's dtype (the layout L2 reads), any strides with the
                  last dimension contiguous (one layer of a larger pool, K and V pages interleaved, heads
                  before tokens); v_cache likewise, with k_cache's strides. No element may belong to two
                  slots, or to both caches.
    slot_mapping  [N] int64, contiguous: row i goes to slot s = block * PAGE + offset, that is
                  k_cache[s // PAGE, s % PAGE] = key[i]; -1 marks a padding row, which writes nothing.
                  Every other entry must lie in [0, num_blocks * PAGE) and appear once.
    check         also check slot_mapping's values (range, no slot twice): None (default) on the CPU only,
                  where it costs no device sync; True on a GPU too (not while capturing a CUDA graph);
                  False never. Without them the call can be captured in a CUDA graph and replayed.

    Returns None; k_cache and v_cache are updated.
    """
    raise NotImplementedError(
        "l1 is not started: fill in store_kvcache_kernel in drills/mine/l1_paged_kv_cache.py, then delete this line (read drills/content/l1_paged_kv_cache.md)"
    )
    _check_inputs(key, value, k_cache, v_cache, slot_mapping, check)
    _launch(key, value, k_cache, v_cache, slot_mapping)
