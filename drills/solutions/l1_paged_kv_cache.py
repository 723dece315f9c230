"""L1 reference: the paged KV cache. An allocator hands out fixed-size blocks, a block table per
sequence maps its logical blocks to physical ones, and `store_kvcache` writes each new token's K and V
into the slot the table gives it. L2 then reads the same cache through the same tables.

`store_kvcache` is a pure copy, so its time is bytes / bandwidth:

    bytes = 2 (K and V) * N * Hkv * D * elt read + the same written   # N=32768, Hkv=8, D=128, fp16: 268 MB

Read top to bottom: the allocator, the block table, the waste statistics (all plain Python), then the
kernel (grid (N,), one program per token) and the launcher that validates and launches.
Explainer: drills/content/l1_paged_kv_cache.md.
"""

from __future__ import annotations

import math
from collections import deque

import torch
import triton
import triton.language as tl

from drills import validate
from drills.device_errors import error_word, record_error
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
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._free = deque(range(num_blocks))  # FIFO, like nano-vllm: a freed block is reused last
        self._allocated = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError(f"out of KV blocks: all {self.num_blocks} blocks are in use")
        block = self._free.popleft()
        self._allocated.add(block)
        return block

    def free(self, block: int) -> None:
        # A bool is an int to isinstance: free(True) would free block 1.
        if isinstance(block, bool) or not (isinstance(block, int) and 0 <= block < self.num_blocks):
            raise ValueError(f"block {block!r} is not a block of this pool [0, {self.num_blocks})")
        if block not in self._allocated:
            raise ValueError(f"block {block} is already free: double free")
        self._allocated.discard(block)
        self._free.append(block)


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
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.allocator = allocator
        self.block_size = block_size
        self.num_tokens = 0
        self._blocks = []

    @property
    def blocks(self) -> list[int]:
        return list(self._blocks)  # a copy: only append_tokens and release change the table

    @property
    def last_block_is_full(self) -> bool:
        return len(self._blocks) > 0 and self.num_tokens == len(self._blocks) * self.block_size

    def append_tokens(self, n: int) -> list[int]:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        needed = math.ceil((self.num_tokens + n) / self.block_size) - len(self._blocks)
        if needed > self.allocator.num_free:
            raise RuntimeError(
                f"out of KV blocks: {n} more tokens need {needed} new blocks, "
                f"{self.allocator.num_free} are free"
            )
        first = self.num_tokens
        for _ in range(n):
            if not self._blocks or self.last_block_is_full:  # the next token starts a new block
                self._blocks.append(self.allocator.allocate())
            self.num_tokens += 1
        return [self.slot(t) for t in range(first, self.num_tokens)]

    def lookup(self, token_index: int) -> tuple[int, int, int]:
        if not 0 <= token_index < self.num_tokens:
            raise IndexError(f"token {token_index} is outside this sequence's {self.num_tokens} tokens")
        logical, offset = divmod(token_index, self.block_size)
        return logical, self._blocks[logical], offset

    def slot(self, token_index: int) -> int:
        _, physical, offset = self.lookup(token_index)
        return physical * self.block_size + offset

    def release(self) -> None:
        for block in reversed(self._blocks):
            self.allocator.free(block)
        self._blocks.clear()
        self.num_tokens = 0


def _check_lengths(lengths) -> list[int]:
    lengths = list(lengths)
    for i, n in enumerate(lengths):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"lengths[{i}] = {n!r} must be a non-negative int")
    return lengths


def _waste(allocated: int, used: int) -> tuple[int, int, float]:
    return allocated, allocated - used, (allocated - used) / allocated if allocated else 0.0


def waste_contiguous(lengths, reserved):
    """KV slots held when every request reserves `reserved` contiguous token slots up front.

    lengths   tokens each request really holds, e.g. [3, 5, 2]
    reserved  slots reserved per request, e.g. 8
    Returns (allocated, wasted, wasted / allocated): (24, 14, 0.5833) for the example.
    A request longer than its reservation raises ValueError: a contiguous cache must reallocate
    and copy it.
    """
    lengths = _check_lengths(lengths)
    if isinstance(reserved, bool) or not isinstance(reserved, int) or reserved < 1:
        raise ValueError(f"reserved must be a positive int, got {reserved!r}")
    for i, n in enumerate(lengths):
        if n > reserved:
            raise ValueError(
                f"lengths[{i}] = {n} exceeds the {reserved} reserved slots: a contiguous cache "
                "must reallocate a larger region and copy the tokens it holds over"
            )
    return _waste(len(lengths) * reserved, sum(lengths))


def waste_paged(lengths, block_size):
    """KV slots held when every request takes whole blocks of `block_size` slots, as it grows.

    lengths     tokens each request really holds, e.g. [3, 5, 2]
    block_size  slots per block, e.g. 4
    Returns (allocated, wasted, wasted / allocated): (16, 6, 0.375) for the example. Only the last
    block of each request can be partly empty.
    """
    lengths = _check_lengths(lengths)
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return _waste(sum(math.ceil(n / block_size) for n in lengths) * block_size, sum(lengths))


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
    # Section 3.4 "One program per token": row i of key/value goes to slot slot_mapping[i].
    i = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + i)  # int64, so every product below is int64 too
    if GUARD:
        # Section 3.8 "A kernel that trusts nothing": a slot past the cache would be a store into
        # whatever memory follows it. Record it, and treat it as padding: the token is not stored.
        record_error(err_ptr, (slot >= num_slots) | (slot < -1), 11, i, slot)
        slot = tl.where(slot >= num_slots, -1, slot)
    if slot < 0:  # a padding row (batch padded to a fixed size): nothing to store
        return

    # Section 3.5 "From slot to address": the inverse of slot = block * PAGE + offset.
    block = slot // PAGE
    offset = slot % PAGE

    # Section 3.6 "Masks": Hkv and D need not be powers of two; padded lanes touch nothing.
    # int64: heads may lie 2**31 elements apart (a head-major pool), so h * stride_ch needs it too.
    offs_h = tl.arange(0, HKV_PAD).to(tl.int64)
    offs_d = tl.arange(0, D_PAD)
    mask = (offs_h < Hkv)[:, None] & (offs_d < D)[None, :]
    k = tl.load(key_ptr + i * stride_kn + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(
        value_ptr + i * stride_vn + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask
    )  # [HKV_PAD, D_PAD]
    dst = block * stride_cb + offset * stride_ct + offs_h[:, None] * stride_ch + offs_d[None, :]
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


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
    _check_inputs(key, value, k_cache, v_cache, slot_mapping, check)
    _launch(key, value, k_cache, v_cache, slot_mapping)
