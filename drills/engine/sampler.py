"""The sampler: one token per row of a step's logits, every row at once, on the logits' device.

A row whose SamplingParams give temperature 0 is greedy (its argmax). Every other row draws from
softmax(logits / temperature), cut to the likeliest tokens in this order, as vLLM and FlashInfer do:

    top_k  keep the k likeliest tokens (-1 or 0: all)
    top_p  of those, renormalized, keep the smallest set of the likeliest whose probabilities sum to at
           least top_p (1.0: all)
    min_p  keep the tokens whose probability is at least min_p times the likeliest's (0.0: all); the
           ratio does not change under renormalization, so its place in the order changes nothing

Each cut is a threshold on the probability: a token tied with the last one a cut keeps is kept too, so
the result never depends on how a sort orders equal values (FlashInfer's sort-free kernels cut at a
pivot value the same way). The draw among the kept tokens is the exponential race (the Gumbel-max
trick): token = argmax_i p_i / E_i with E_i = -log(u_i) exponential, which picks token i with
probability p_i / sum(kept p), with no normalization and no cumulative sum to search.

The uniform noise u is counter-based: u[r, i] is a hash of the row's 32-bit key and the vocabulary index
i, computed on the device. A request with a random_state keys its draws with (random_state, how many
tokens it has drawn): its `Stream`, kept in seq.generator (a preempted request keeps it, so its draws go
on where they stopped). Its tokens are therefore the same whatever else shares its batch, at whatever
row, and whether the engine overlaps its steps or not. A request without one takes a fresh key per draw
from the engine's generator (torch's default CPU generator when it is None).

No Python loop over rows touches the device and nothing waits for it: the rows' parameters go over in
one non-blocking copy (pinned memory on a GPU), kept there from step to step by an engine's SamplingRows
(sampling_rows.py) while its rows stay the same, and sample_on_device returns the tokens as a device
tensor. A step whose rows are all greedy is one argmax. On a GPU (draw_keyed) the probabilities are
never written out: softmax_stats_kernel takes each row's max and sum, cutoff_kernel the top_k / top_p
thresholds over the logits sorted once, and race_kernel the race with its noise made in registers, each
computing a token's probability from its logit; the cuts are thresholds on the logits, so that no
comparison depends on how a GPU rounds one probability in two kernels. Elsewhere torch ops give the same
tokens: cutoff() on the sorted rows (the definition), race() over an (R, V) tensor of noise. threshold_kernel finds the same thresholds with no
sort (each is one of the row's probabilities, searched by its float bits, several pivots a pass, as
FlashInfer's top_k_top_p_sampling_from_probs searches pivots); it is off (SORT_FREE) because it measured
slower than the sort.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from drills.engine.sampling_rows import SamplingRows, Stream, stream_key  # noqa: F401 (Stream, stream_key: API)
from drills.launch import launch

MASK32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B1  # odd: i -> i * GOLDEN32 mod 2**32 is one-to-one, and spreads the bits of i
# murmur3's fmix32 multipliers, written as C - 2**32: a product of a 32-bit value by a constant under
# 2**31 in magnitude fits int64 (torch has no uint32 arithmetic), and its low 32 bits are those of C * x.
FMIX1 = 0x85EBCA6B - (1 << 32)
FMIX2 = 0xC2B2AE35 - (1 << 32)
UNIFORM_BITS = 23  # (k + 0.5) / 2**23 for k < 2**23 is exact in float32 and lies strictly in (0, 1)


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's finalizer on int64 tensors holding 32-bit values: every input bit flips about half of
    the output bits, so neighbouring inputs give unrelated outputs."""
    x = x ^ (x >> 16)
    x = (x * FMIX1) & MASK32
    x = x ^ (x >> 13)
    x = (x * FMIX2) & MASK32
    return x ^ (x >> 16)


def uniform(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Uniform noise in (0, 1), (R, vocab) float32 on keys' device: u[r, i] = hash(keys[r], i).

    keys (R,) int64 holding 32-bit values. The same key gives the same row on every device."""
    index = (torch.arange(vocab, device=keys.device, dtype=torch.int64) * GOLDEN32) & MASK32  # (V,)
    x = _fmix32(_fmix32(index)[None, :] ^ keys[:, None])  # (R, V)
    return ((x >> (32 - UNIFORM_BITS)).float() + 0.5) * (1.0 / (1 << UNIFORM_BITS))


def cutoff(s: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row's top_k and top_p threshold on the probability, (R, 1): the tokens with probs >= it are
    kept. s (R, V) float32: each row's probabilities in descending order; top_k (R,) int64 (<= 0: off);
    top_p (R,) float32 (1.0: off)."""
    V = s.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=V), V) - 1  # (R,): the k-th likeliest, 0-based
    k_thr = s.gather(-1, k[:, None])  # (R, 1); ties with it kept
    kept = torch.where(s >= k_thr, s, 0.0)  # (R, V): top_k's tokens, in order
    total = kept.cumsum(-1)  # (R, V)
    before = total - kept  # the mass of the likelier tokens kept
    # A token is in the nucleus while the mass before it falls short of top_p of what top_k kept: a prefix
    # of the order, at least its first token.
    nucleus = (before < top_p[:, None] * total[:, -1:]) & (s >= k_thr)  # (R, V)
    last = nucleus.sum(-1, keepdim=True).clamp(min=1) - 1  # (R, 1)
    p_thr = s.gather(-1, last)  # (R, 1)
    return torch.where(top_p[:, None] < 1, p_thr, k_thr)


@triton.jit
def _keys_and_probs(row, i, inside, t, top, total, FROM_LOGITS: tl.constexpr):
    """A tile's (keys, probabilities), (BLOCK,) float32 each, 0 probability outside it: the values a cut
    compares, and the ones it sums and the race scores. FROM_LOGITS, the probabilities are softmax(x / t)
    of the row's logits x from its stats (top the max of x / t, total the sum of exp(x / t - top)),
    written as probabilities() writes it. The keys are the loaded values themselves, the logits
    (FROM_LOGITS) or the probabilities, so that a comparison with a threshold loaded from memory is
    exact: on a GPU a probability computed in one kernel, or as a scalar, need not round as the same
    probability computed elsewhere."""
    if FROM_LOGITS:
        x = tl.load(row + i, mask=inside, other=float("-inf")).to(tl.float32)
        return x, tl.exp(x / t - top) / total
    else:
        p = tl.load(row + i, mask=inside, other=0.0)
        return p, p


@triton.jit
def _row_softmax(temp_ptr, top_ptr, total_ptr, r, FROM_LOGITS: tl.constexpr):
    """Row r's temperature (1 for a greedy row) and softmax stats, read where FROM_LOGITS needs them."""
    t = 1.0
    top = 0.0
    total = 1.0
    if FROM_LOGITS:
        t = tl.load(temp_ptr + r)
        t = tl.where(t == 0, 1.0, t)
        top = tl.load(top_ptr + r)
        total = tl.load(total_ptr + r)
    return t, top, total


@triton.jit
def softmax_stats_kernel(logits_ptr, temp_ptr, top_ptr, total_ptr, V, stride_r, BLOCK: tl.constexpr):
    """Each row's softmax stats over its logits at its temperature, for _keys_and_probs: top = max(x / t)
    and total = sum(exp(x / t - top)), two passes over the row (the second mostly from L2). logits (R, V)
    any float dtype (row stride stride_r); temperature, top, total (R,) float32."""
    r = tl.program_id(0)
    row = logits_ptr + r.to(tl.int64) * stride_r
    t = tl.load(temp_ptr + r)
    t = tl.where(t == 0, 1.0, t)  # a greedy row is taken at temperature 1, as probabilities() does
    m = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        i = start + tl.arange(0, BLOCK)
        x = tl.load(row + i, mask=i < V, other=float("-inf")).to(tl.float32)
        m = tl.maximum(m, x / t)
    top = tl.max(m, 0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        i = start + tl.arange(0, BLOCK)
        x = tl.load(row + i, mask=i < V, other=float("-inf")).to(tl.float32)
        acc += tl.exp(x / t - top)
    tl.store(top_ptr + r, top)
    tl.store(total_ptr + r, tl.sum(acc, 0))


STATS_BLOCK = 2048  # logits per loop step


def softmax_stats(logits: torch.Tensor, temperature: torch.Tensor):
    """(temperature, top, total), each (R,) float32: what the kernels read to compute a row's
    probabilities from its logits, which are never written out ((R, V) float32 is twice a bf16 row)."""
    R, V = logits.shape
    top = torch.empty(R, dtype=torch.float32, device=logits.device)
    total = torch.empty(R, dtype=torch.float32, device=logits.device)
    temperature = temperature.contiguous()
    if R:
        args = (logits, temperature, top, total, V, logits.stride(0))
        launch(softmax_stats_kernel, (R,), args, BLOCK=min(STATS_BLOCK, triton.next_power_of_2(V)))
    return temperature, top, total


def _softmax_args(rows: torch.Tensor, softmax):
    """The stats arguments of a kernel that reads `rows`: dummies (the probabilities themselves) or
    softmax_stats()'s, and FROM_LOGITS."""
    if softmax is None:
        return (rows, rows, rows), False  # never read
    return tuple(softmax), True


@triton.jit
def cutoff_kernel(
    s_ptr,
    top_k_ptr,
    top_p_ptr,
    out_ptr,
    temp_ptr,
    top_ptr,
    total_ptr,
    V,
    stride_r,
    BLOCK: tl.constexpr,
    FROM_LOGITS: tl.constexpr,
):
    """cutoff() in one program per row and two passes over its sorted probabilities: the mass top_k
    keeps, then the nucleus counted with a running sum carried across tiles. s (R, V) float32, each row
    descending (row stride stride_r); top_k (R,) int64; top_p (R,) float32; out (R,) float32, the
    threshold probability. FROM_LOGITS: s holds the rows' logits sorted descending, their probabilities
    are computed here, and out is the threshold logit (the tokens with logits >= it are kept)."""
    r = tl.program_id(0)
    row = s_ptr + r.to(tl.int64) * stride_r
    t, top, total = _row_softmax(temp_ptr, top_ptr, total_ptr, r, FROM_LOGITS)
    k = tl.load(top_k_ptr + r)
    top_p = tl.load(top_p_ptr + r)
    k_key = tl.load(row + tl.where(k > 0, tl.minimum(k, V), V) - 1).to(tl.float32)  # ties with the k-th kept
    mass = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        i = start + tl.arange(0, BLOCK)
        key, p = _keys_and_probs(row, i, i < V, t, top, total, FROM_LOGITS)
        mass += tl.where(key >= k_key, p, 0.0)
    limit = top_p * tl.sum(mass, 0)
    before = tl.zeros([], tl.float32)  # the mass of the likelier kept tokens, before this tile
    count = tl.zeros([], tl.int32)
    for start in range(0, V, BLOCK):
        i = start + tl.arange(0, BLOCK)
        key, p = _keys_and_probs(row, i, i < V, t, top, total, FROM_LOGITS)
        kept = (i < V) & (key >= k_key)
        p = tl.where(kept, p, 0.0)
        running = before + tl.cumsum(p, 0) - p  # (BLOCK,): the mass before each token
        count += tl.sum(((running < limit) & kept).to(tl.int32), 0)
        before += tl.sum(p, 0)
    p_key = tl.load(row + tl.maximum(count, 1) - 1).to(tl.float32)
    tl.store(out_ptr + r, tl.where(top_p < 1, p_key, k_key))


CUTOFF_BLOCK = 2048  # a tile of sorted probabilities per loop step (8 KB of fp32)


def cutoff_rows(
    s: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, kernel: bool | None = None, softmax=None
):
    """cutoff(s, top_k, top_p), (R, 1). kernel: cutoff_kernel (None: on a GPU), one launch in place of
    some ten torch ops over (R, V); its sums run in another order, so a row whose running mass lands
    within rounding of top_p may keep one token more or less than cutoff()'s. softmax: softmax_stats()
    of the rows when s holds their logits sorted descending (a GPU's path, kernel only); the thresholds
    are then logits."""
    R, V = s.shape
    if kernel is None:
        kernel = s.device.type == "cuda"
    if not kernel:
        if softmax is not None:
            raise ValueError("cutoff_rows: softmax (thresholds on the logits) needs kernel=True")
        return cutoff(s, top_k, top_p)
    out = torch.empty(R, dtype=torch.float32, device=s.device)
    if R:
        stats, from_logits = _softmax_args(s, softmax)
        args = (s, top_k.contiguous(), top_p.contiguous(), out, *stats, V, s.stride(0))
        block = min(CUTOFF_BLOCK, triton.next_power_of_2(V))
        launch(cutoff_kernel, (R,), args, BLOCK=block, FROM_LOGITS=from_logits)
    return out[:, None]


@triton.jit
def _order_bits(v):
    """A float32's bits as an int64 that orders as the values do: a non-negative float's bits already
    do; a negative one's are flipped below them (the map is its own inverse on int32)."""
    b = v.to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def _search_bits(
    row,
    V,
    lo,
    hi,
    need,
    keep_from,
    t,
    top,
    total,
    MASS: tl.constexpr,
    BLOCK: tl.constexpr,
    PIVOTS: tl.constexpr,
    FROM_LOGITS: tl.constexpr,
):
    """The smallest order bits b in (lo, hi] whose tail, the tokens whose key has order bits > b (and
    >= keep_from), falls short of `need`: by count (MASS False) or by probability mass (MASS True). The
    keys are the probabilities, or the logits (FROM_LOGITS). The tail shrinks as b grows, and the caller
    holds tail(lo) >= need > tail(hi). Each pass over the row tries PIVOTS values of b at once and keeps
    the two around the crossing, so about 32 / log2(PIVOTS + 1) passes."""
    j = tl.arange(0, PIVOTS).to(tl.int64) + 1  # (PIVOTS,)
    while hi - lo > 1:
        pivots = lo + ((hi - lo) * j) // (PIVOTS + 1)  # (PIVOTS,), ascending, one at least inside (lo, hi)
        tail = tl.zeros([PIVOTS], tl.float32)
        for start in range(0, V, BLOCK):
            i = start + tl.arange(0, BLOCK)  # (BLOCK,)
            key, p = _keys_and_probs(row, i, i < V, t, top, total, FROM_LOGITS)
            bits = _order_bits(key)
            inside = ((i < V) & (bits >= keep_from))[:, None] & (bits[:, None] > pivots[None, :])
            if MASS:
                tail += tl.sum(tl.where(inside, p[:, None], 0.0), 0)
            else:
                tail += tl.sum(inside.to(tl.float32), 0)
        short = tail < need  # (PIVOTS,): False for a prefix of the pivots, then True
        hi = tl.min(tl.where(short, pivots, hi), 0)
        lo = tl.max(tl.where(short, lo, pivots), 0)
    return hi


@triton.jit
def threshold_kernel(
    probs_ptr,
    top_k_ptr,
    top_p_ptr,
    out_ptr,
    temp_ptr,
    top_ptr,
    total_ptr,
    V,
    stride_r,
    BLOCK: tl.constexpr,
    PIVOTS: tl.constexpr,
    FROM_LOGITS: tl.constexpr,
):
    """cutoff()'s thresholds from the rows' probabilities in vocabulary order, without sorting them.
    Each threshold is a probability of the row, so it is searched among the rows' values by their float
    bits (bit patterns order as the values do, once a negative value's are flipped): top_k's is the
    smallest p with fewer than k tokens above it, top_p's the smallest p whose likelier kept tokens hold
    less than top_p of the mass top_k kept (the token that crosses top_p is kept, with its ties). probs
    (R, V) float32 (row stride stride_r); top_k (R,) int64; top_p (R,) float32; out (R,) float32: the
    threshold probability, 0.0 where both cuts are off. FROM_LOGITS: probs holds the rows' logits, whose
    probabilities are computed here; the search runs over the logits and out is the threshold logit
    (-inf where both cuts are off), so that the race compares a logit with a logit."""
    r = tl.program_id(0)
    row = probs_ptr + r.to(tl.int64) * stride_r
    t, top_z, total = _row_softmax(temp_ptr, top_ptr, total_ptr, r, FROM_LOGITS)
    k = tl.load(top_k_ptr + r)
    top_p = tl.load(top_p_ptr + r)
    top = tl.full([], -(2**31), tl.int64)  # order bits of the row's largest key
    for start in range(0, V, BLOCK):
        i = start + tl.arange(0, BLOCK)
        key, p = _keys_and_probs(row, i, i < V, t, top_z, total, FROM_LOGITS)
        top = tl.maximum(top, tl.max(tl.where(i < V, _order_bits(key), -(2**31)), 0))
    if FROM_LOGITS:
        every = tl.full([], -(2**31), tl.int64)  # below every logit's order bits
    else:
        every = tl.zeros([], tl.int64)  # bits >= 0: every probability
    keep_from = every  # top_k off
    if (k > 0) & (k < V):
        keep_from = _search_bits(
            row,
            V,
            every - 1,
            top,
            k.to(tl.float32),
            every,
            t,
            top_z,
            total,
            False,
            BLOCK,
            PIVOTS,
            FROM_LOGITS,
        )
    thr = keep_from
    if top_p < 1:
        mass = tl.zeros([BLOCK], tl.float32)
        for start in range(0, V, BLOCK):
            i = start + tl.arange(0, BLOCK)
            key, p = _keys_and_probs(row, i, i < V, t, top_z, total, FROM_LOGITS)
            mass += tl.where(_order_bits(key) >= keep_from, p, 0.0)
        need = top_p * tl.sum(mass, 0)
        thr = _search_bits(
            row, V, keep_from - 1, top, need, keep_from, t, top_z, total, True, BLOCK, PIVOTS, FROM_LOGITS
        )
    b = thr.to(tl.int32)
    value = tl.where(b >= 0, b, b ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)  # _order_bits undone
    if FROM_LOGITS:
        value = tl.where(thr == every, float("-inf"), value)
    tl.store(out_ptr + r, value)


THRESHOLD_BLOCK = 512  # probabilities per tile; a pass compares each with PIVOTS values
THRESHOLD_PIVOTS = 8  # about 10.3 passes a search (31 bits / log2(9))


def threshold_rows(
    probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, pivots: int | None = None, softmax=None
):
    """Each row's top_k / top_p threshold, (R, 1), from probs (R, V) float32 in vocabulary order (or the
    rows' logits, with their softmax_stats() as softmax), with threshold_kernel: no sort. It keeps the
    tokens cutoff() keeps on the sorted rows, up to the order of its sums (a row whose mass lands within
    rounding of top_p may keep one token more or less). A row with both cuts off gets 0.0, which keeps
    every token, as cutoff()'s smallest probability does. With softmax the thresholds are logits (-inf:
    every token)."""
    R, V = probs.shape
    out = torch.empty(R, dtype=torch.float32, device=probs.device)
    if R:
        stats, from_logits = _softmax_args(probs, softmax)
        args = (probs, top_k.contiguous(), top_p.contiguous(), out, *stats, V, probs.stride(0))
        block = min(THRESHOLD_BLOCK, triton.next_power_of_2(V))
        launch(
            threshold_kernel,
            (R,),
            args,
            BLOCK=block,
            PIVOTS=pivots or THRESHOLD_PIVOTS,
            FROM_LOGITS=from_logits,
        )
    return out[:, None]


def probabilities(logits: torch.Tensor, temperature: torch.Tensor):
    """softmax(logits / temperature), (R, V) float32, written out as exp(z - max) / sum so that the same
    elementwise function of the sorted logits gives the sorted probabilities, bit for bit; and that
    function, for cutoff(). A row of temperature 0 (greedy) is taken at temperature 1, and never used."""
    t = torch.where(temperature == 0, 1.0, temperature)[:, None]  # (R, 1)
    z = logits.float() / t  # (R, V)
    top = z.amax(-1, keepdim=True)  # (R, 1)
    e = torch.exp(z - top)  # (R, V)
    total = e.sum(-1, keepdim=True)  # (R, 1)

    def of(x: torch.Tensor) -> torch.Tensor:  # any (R, n) of the rows' logits -> their probabilities
        return torch.exp(x.float() / t - top) / total

    return e / total, of


def _probs_and_threshold(logits, temperature, top_k, top_p, min_p, cut: bool):
    """probabilities() (R, V) and each row's threshold (R, 1): the tokens with probs >= it are kept."""
    probs, of = probabilities(logits, temperature)
    thr = min_p[:, None] * probs.amax(-1, keepdim=True)  # (R, 1)
    if cut and sort_free(probs.device):
        thr = torch.maximum(thr, threshold_rows(probs, top_k, top_p))
    elif cut:
        # The logits sort in their own dtype (bf16: 16-bit keys, half the radix passes of the fp32
        # probabilities), and a temperature > 0 keeps their order.
        s = of(logits.sort(-1, descending=True).values)  # (R, V): each row's probabilities, descending
        thr = torch.maximum(thr, cutoff_rows(s, top_k, top_p))
    return probs, thr


# On a GPU, threshold_kernel's search in place of the sort and cutoff_kernel. Off: on an H100 at 256 rows
# of 49,152 the search (one program a row, about 12 passes over it) took longer than torch's segmented
# sort and the pass over the sorted rows; a search that splits each row over several programs could win.
SORT_FREE = False


def sort_free(device: torch.device) -> bool:
    """Whether the cut thresholds come from threshold_kernel (a GPU, SORT_FREE) or from the sorted rows
    (cutoff(), the definition; always on the CPU, where torch's sort beats the interpreted search)."""
    return SORT_FREE and device.type == "cuda"


def race(probs: torch.Tensor, thr: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The exponential race among the kept tokens, (R,) int64: a cut token scores -1, below every kept
    one (>= 0); argmax takes the first of equal scores."""
    score = torch.where(probs >= thr, probs / -torch.log(u), -1.0)  # (R, V)
    return score.argmax(-1)


def draw(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    u: torch.Tensor,
    cut: bool = True,
) -> torch.Tensor:
    """The tokens (R,) int64 of every row at once, given the rows' uniform noise.

    logits (R, V) any float dtype; temperature, top_p, min_p (R,) float32 and top_k (R,) int64 on
    logits' device; u (R, V) in (0, 1). cut=False skips the sort where no row asks for top_k or top_p."""
    probs, thr = _probs_and_threshold(logits, temperature, top_k, top_p, min_p, cut)
    return torch.where(temperature == 0, logits.argmax(-1), race(probs, thr, u))


@triton.jit
def _fmix32_tl(x):
    """_fmix32 on uint32, whose products wrap modulo 2**32 by themselves."""
    x ^= x >> 16
    x *= 0x85EBCA6B
    x ^= x >> 13
    x *= 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def race_kernel(
    probs_ptr,
    thr_ptr,
    key_ptr,
    out_ptr,
    temp_ptr,
    top_ptr,
    total_ptr,
    xthr_ptr,
    lmin_ptr,
    V,
    stride_r,
    BLOCK: tl.constexpr,
    FROM_LOGITS: tl.constexpr,
):
    """race() with uniform()'s noise made in registers: one program per row walks its V probabilities in
    tiles of BLOCK, keeping the best score and its index. probs (R, V) float32 (row stride stride_r),
    thr (R,) float32, keys (R,) int64 holding 32-bit values, out (R,) int64. FROM_LOGITS: probs holds
    the rows' logits (probabilities computed here, from softmax_stats()), and a token is kept when its
    probability is >= thr (R,), its logit >= xthr (R,) (cutoff_rows' or threshold_rows' thresholds on the logits), and
    x / t - top >= lmin (R,) = log(min_p): min_p's p >= min_p * p_max with the total cancelled, so that
    min_p 1 keeps exactly the likeliest and its ties."""
    r = tl.program_id(0)
    row = probs_ptr + r.to(tl.int64) * stride_r
    t, top, total = _row_softmax(temp_ptr, top_ptr, total_ptr, r, FROM_LOGITS)
    thr = tl.load(thr_ptr + r)
    x_thr = float("-inf")
    l_min = float("-inf")
    if FROM_LOGITS:
        x_thr = tl.load(xthr_ptr + r)
        l_min = tl.load(lmin_ptr + r)
    key = tl.load(key_ptr + r).to(tl.uint32)
    best = tl.full([], -2.0, tl.float32)  # below a cut token's -1: the first tile always takes over
    best_i = tl.full([], 0, tl.int32)
    for start in range(0, V, BLOCK):
        i = start + tl.arange(0, BLOCK)  # (BLOCK,)
        inside = i < V
        x, p = _keys_and_probs(row, i, inside, t, top, total, FROM_LOGITS)
        keep = inside & (p >= thr)
        if FROM_LOGITS:
            keep = keep & (x >= x_thr) & (x / t - top >= l_min)
        h = _fmix32_tl(_fmix32_tl(i.to(tl.uint32) * 0x9E3779B1) ^ key)  # uniform()'s hash, in uint32
        u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608)  # (k + 0.5) / 2**23
        score = tl.where(keep, p / -tl.log(u), -1.0)
        tile = tl.max(score, 0)
        take = tile > best  # strictly: an earlier tile keeps a tie, as argmax keeps the first
        best_i = tl.where(take, start + tl.argmax(score, 0), best_i)
        best = tl.where(take, tile, best)
    tl.store(out_ptr + r, best_i.to(tl.int64))


RACE_BLOCK = 1024  # a tile of probabilities per loop step (4 KB of fp32)


def race_keyed(probs: torch.Tensor, thr: torch.Tensor, keys: torch.Tensor, kernel: bool | None = None):
    """race(probs, thr, uniform(keys, V)), (R,) int64. kernel: race_kernel (None: on a GPU), which makes
    the noise in registers instead of an (R, V) tensor of it; otherwise torch ops."""
    R, V = probs.shape
    if kernel is None:
        kernel = probs.device.type == "cuda"
    if not kernel:
        return race(probs, thr, uniform(keys, V))
    return _race_launch(probs, thr, keys)


def _race_launch(rows, thr, keys, softmax=None, x_thr=None, log_min_p=None):
    """race_kernel over rows (R, V): probabilities, or logits with their softmax_stats() and the
    thresholds draw_keyed passes. (R,) int64."""
    R, V = rows.shape
    out = torch.empty(R, dtype=torch.int64, device=rows.device)
    if R:
        stats, from_logits = _softmax_args(rows, softmax)
        extra = (x_thr.reshape(R).contiguous(), log_min_p.contiguous()) if from_logits else (rows, rows)
        args = (rows, thr.reshape(R).contiguous(), keys.contiguous(), out, *stats, *extra, V, rows.stride(0))
        launch(
            race_kernel, (R,), args, BLOCK=min(RACE_BLOCK, triton.next_power_of_2(V)), FROM_LOGITS=from_logits
        )
    return out


def draw_keyed(
    logits,
    temperature,
    top_k,
    top_p,
    min_p,
    keys,
    cut: bool = True,
    kernel: bool | None = None,
    greedy: bool = True,
):
    """draw() with uniform(keys, V)'s noise, (R,) int64 on logits' device. kernel (None: on a GPU): the
    probabilities are never written out. softmax_stats() takes each row's max and sum in one launch; the
    cut reads the logits sorted in their own dtype and gives its threshold as a logit, and race_kernel
    reads the logits, computing a token's probability from them as probabilities() does. Three launches
    and the sort, against some twenty torch ops over (R, V) float32. Every cut compares values loaded from memory (a
    logit with a logit), so it is exact however the GPU rounds a probability in one kernel or another;
    the kernels' exp is not torch's, so a near-tie in a cut's running sum or in the race may go the other way than
    draw()'s, and a token whose probability rounds equal to the threshold's from a smaller logit is
    not kept as a tie. greedy=False: no row has temperature 0, so no argmax is taken for one."""
    if kernel is None:
        kernel = logits.device.type == "cuda"
    if not kernel:
        probs, thr = _probs_and_threshold(logits, temperature, top_k, top_p, min_p, cut)
        tokens = race_keyed(probs, thr, keys, kernel=False)
        return torch.where(temperature == 0, logits.argmax(-1), tokens) if greedy else tokens
    R = logits.shape[0]
    softmax = softmax_stats(logits, temperature)
    p_thr = torch.zeros(R, dtype=torch.float32, device=logits.device)  # (R,): keeps every token
    x_thr = torch.full((R,), float("-inf"), dtype=torch.float32, device=logits.device)
    if cut and sort_free(logits.device):
        x_thr = threshold_rows(logits, top_k, top_p, softmax=softmax)
    elif cut:
        s = logits.sort(-1, descending=True).values  # (R, V): logits in their dtype, their order kept
        x_thr = cutoff_rows(s, top_k, top_p, kernel=True, softmax=softmax)
    tokens = _race_launch(logits, p_thr, keys, softmax, x_thr, torch.log(min_p))
    return torch.where(temperature == 0, logits.argmax(-1), tokens) if greedy else tokens


def sample_on_device(
    logits: torch.Tensor, seqs, generator: torch.Generator | None = None, rows=None
) -> torch.Tensor:
    """One token per row of logits (R, V), under each sequence's SamplingParams: (R,) int64 on
    logits.device, nothing waited for. Advances the stream of every seeded sampled row by one draw.

    rows: an engine's SamplingRows, which keeps the rows' parameters on the device from one step to the
    next (their streams' draws then lag until rows.sync()); None reads every row here, for this draw."""
    if logits.dim() != 2 or logits.shape[0] != len(seqs):
        raise ValueError(f"logits must be (len(seqs), V) = ({len(seqs)}, V), got {tuple(logits.shape)}")
    once = rows is None
    if once:
        rows = SamplingRows()
    step = rows.prepare(seqs, logits.shape[-1], logits.device, generator)
    if once:
        rows.sync()
    if step is None:  # every row greedy
        return logits.argmax(-1)
    temperature, top_k, top_p, min_p, keys, cut, greedy = step
    return draw_keyed(logits, temperature, top_k, top_p, min_p, keys, cut, greedy=greedy)


def sample(logits: torch.Tensor, seqs, generator: torch.Generator | None) -> list[int]:
    """One token per row of logits (R, V), as host ints: sample_on_device, then its one copy back."""
    return sample_on_device(logits, seqs, generator).tolist()
