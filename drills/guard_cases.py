"""Bad device values, one case each, for the references' device guards (drills/device_errors.py).

Each case builds a valid input and a copy with one bad value on the device (a length the table cannot
hold, a block id outside the pool, a slot past the cache, decreasing cu_seqlens), calls the reference
with check=False (the default GPU path, where nothing is read on the host), and says what must hold:
- every row the bad value belongs to is zeros (lse -inf), every other row is the valid call's;
- raise_device_errors() raises ValueError naming the argument;
- with check=True the launcher raises ValueError naming the same argument before launching.

tests/test_device_guards.py runs every case on the CPU (Triton's interpreter), and
drills/benchmarks/memcheck.py runs them on a GPU under compute-sanitizer, whose log shows that no
access left the tensors the kernels were given.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

GARBAGE_IDS = (2**31 - 1, -(2**31), -1, 1 << 24)


@dataclass
class GuardCase:
    lesson: str  # the stem of the lesson whose reference is called
    name: str
    argument: str  # the argument that raise_device_errors() and check=True must name
    call: Callable  # call(check) -> the outputs (a tensor or a tuple), from a fresh copy of the inputs
    call_valid: Callable  # the same with every value valid
    compare: Callable  # compare(valid_outputs, bad_outputs): raises AssertionError if the guard failed


def _reference(stem: str):
    return importlib.import_module(f"drills.solutions.{stem}")


def _rows_zero_else_equal(rows, lse_dim=None):
    """compare() for outputs whose dim 0 is the row: rows in `rows` zero (lse -inf), the rest equal."""

    def compare(valid, bad):
        valid = valid if isinstance(valid, tuple) else (valid,)
        bad = bad if isinstance(bad, tuple) else (bad,)
        for i, (v, b) in enumerate(zip(valid, bad)):
            is_lse = lse_dim is not None and i == lse_dim
            keep = torch.ones(v.shape[0], dtype=torch.bool)
            keep[list(rows)] = False
            dropped = b[~keep.to(b.device)]
            if is_lse:
                assert torch.all(dropped == float("-inf")), f"lse of invalid rows {list(rows)}: {dropped}"
            else:
                assert torch.all(dropped == 0), f"invalid rows {list(rows)} are not zero"
            assert torch.equal(v[keep.to(v.device)], b[keep.to(b.device)]), (
                f"output {i}: a valid row changed beside the invalid rows {list(rows)}"
            )

    return compare


# -------------------------------------------------------------------------------------------- L1
def _store_cases(stem: str, store, dtype=torch.float32) -> Callable[[object], list[GuardCase]]:
    """Cases for a store into a paged cache with one slot past the cache (or below -1): that token is not
    stored, every other token is, and nothing outside the caches is written. store(key, value, k_cache,
    v_cache, slots, check) stores with the lesson's reference, into caches of the dtype it needs, and
    returns them as [num_slots, Hkv, D] tensors that compare exactly (bytes, for an e4m3 cache)."""
    N, Hkv, D, PAGE, num_blocks = 6, 2, 16, 16, 4
    num_slots = num_blocks * PAGE

    def make(device) -> list[GuardCase]:
        cases = []

        def case(name, bad_slot):
            def run(check, bad=True):
                gen = torch.Generator().manual_seed(1)
                key = torch.randn(N, Hkv, D, generator=gen).to(dtype).to(device)  # [N, Hkv, D]
                value = torch.randn(N, Hkv, D, generator=gen).to(dtype).to(device)
                slots = torch.randperm(num_slots, generator=gen)[:N].to(device)  # [N] int64, distinct
                if bad:
                    slots[3] = bad_slot
                k, v = store(key, value, (num_blocks, PAGE, Hkv, D), slots, check)
                return k.view(num_slots, Hkv, D), v.view(num_slots, Hkv, D), slots

            def compare(valid, bad):
                (vk, vv, vslots), (bk, bv, _) = valid, bad
                dropped = int(vslots[3])  # the slot token 3 would have had: left as it was, zero
                for v, b in ((vk, bk), (vv, bv)):
                    assert torch.all(b[dropped] == 0), "the token with the bad slot was stored somewhere"
                    keep = torch.ones(num_slots, dtype=torch.bool)
                    keep[dropped] = False
                    assert torch.equal(v[keep.to(v.device)], b[keep.to(b.device)]), (
                        "another token's slot changed"
                    )

            cases.append(GuardCase(stem, name, "slot_mapping", run, lambda: run(False, False), compare))

        case("slot_one_past_the_cache", num_slots)
        case("slot_far_past_the_cache", 2**40)
        case("slot_below_padding", -7)
        return cases

    return make


def _l1_store(key, value, shape, slots, check):
    k_cache = torch.zeros(shape, device=key.device)
    v_cache = torch.zeros_like(k_cache)
    _reference("l1_paged_kv_cache").store_kvcache(key, value, k_cache, v_cache, slots, check=check)
    return k_cache, v_cache


l1_cases = _store_cases("l1_paged_kv_cache", _l1_store)


# ---------------------------------------------------------------------------------------------- paged
def _paged_inputs(device, dtype=torch.float16, B=3, Hq=4, Hkv=2, D=16, PAGE=16, pages=2, gen_seed=0):
    """[B] sequences of up to pages * PAGE tokens in a pool of B * pages + 2 blocks, each row its own."""
    gen = torch.Generator().manual_seed(gen_seed)
    num_blocks = B * pages + 2
    k = torch.randn(num_blocks, PAGE, Hkv, D, generator=gen).to(dtype)  # [num_blocks, PAGE, Hkv, D]
    v = torch.randn(num_blocks, PAGE, Hkv, D, generator=gen).to(dtype)
    q = torch.randn(B, Hq, D, generator=gen).to(dtype)  # [B, Hq, D]
    tables = torch.randperm(num_blocks, generator=gen)[: B * pages].view(B, pages).to(torch.int32)
    lens = torch.tensor([pages * PAGE - 3 - i for i in range(B)], dtype=torch.int32)  # [B]
    return [t.to(device) for t in (q, k, v, tables, lens)]


def _decode_cases(
    stem: str, fn_name: str, device, extra=None, lse_dim=None, inputs=_paged_inputs
) -> list[GuardCase]:
    """context_lens and block_tables corrupted one value at a time, for L2, F1 and F3 (the same API).
    extra(q, k, v, tables, lens): more keyword arguments, made from the valid inputs (F1's plan, as an
    engine plans from the lengths it knows); lse_dim: which output is the lse, if one is returned;
    inputs(device): the valid inputs (F3's caches are e4m3)."""
    cases = []

    def case(name, argument, corrupt, rows):
        def run(check, bad=True):
            fn = getattr(_reference(stem), fn_name)
            q, k, v, tables, lens = inputs(device)
            kwargs = extra(q, k, v, tables, lens) if extra else {}
            if bad:
                corrupt(tables, lens)
            return fn(q, k, v, tables, lens, check=check, **kwargs)

        cases.append(
            GuardCase(
                stem,
                name,
                argument,
                lambda check: run(check),
                lambda: run(False, bad=False),
                _rows_zero_else_equal(rows, lse_dim),
            )
        )

    def set_len(value):
        return lambda tables, lens: lens.__setitem__(1, value)

    case("context_len_one_past_the_row", "context_lens", set_len(2 * 16 + 1), [1])
    case("context_len_far_past_the_row", "context_lens", set_len(2**31 - 1), [1])
    case("context_len_negative", "context_lens", set_len(-5), [1])
    for bad_id in GARBAGE_IDS:
        case(
            f"block_id_{bad_id}",
            "block_tables",
            lambda tables, lens, bad_id=bad_id: tables.__setitem__((2, 1), bad_id),
            [2],
        )
    case("block_id_num_blocks", "block_tables", lambda tables, lens: tables.__setitem__((0, 0), 8), [0])
    return cases


def l2_cases(device) -> list[GuardCase]:
    return _decode_cases("l2_paged_decode", "paged_decode", device)


def f1_cases(device) -> list[GuardCase]:
    """L2's cases through both of F1's paths (one split writes the output itself; two splits write
    partials that the merge kernel combines: a bad block id seen by one split must zero the whole row),
    a length inside the table but past the plan's splits, and merge_states given a NaN or +inf lse."""
    f1 = "f1_split_kv_decode"
    cases = []
    for splits in (1, 2):

        def planned(q, k, v, tables, lens, splits=splits):
            return dict(
                plan=_reference(f1).plan(lens, k.shape[2], k.shape[1], num_splits=splits), return_lse=True
            )

        for c in _decode_cases(f1, "split_kv_decode", device, extra=planned, lse_dim=1):
            cases.append(replace(c, name=f"{c.name}_{splits}_split{'s' if splits > 1 else ''}"))

        def past_the_plan(check, bad=True, splits=splits):
            q, k, v, tables, lens = _paged_inputs(device, pages=4)  # a row holds 64 tokens
            lens.copy_(torch.tensor([20, 10, 30], dtype=torch.int32))  # planned for 30: the splits cover 32
            plan = _reference(f1).plan(lens, k.shape[2], k.shape[1], num_splits=splits)
            if bad:
                lens[1] = 40  # inside the table row, past what the plan's splits read
            return _reference(f1).split_kv_decode(
                q, k, v, tables, lens, plan=plan, return_lse=True, check=check
            )

        cases.append(
            GuardCase(
                f1,
                f"context_len_past_the_plan_{splits}_split{'s' if splits > 1 else ''}",
                "context_lens",
                past_the_plan,
                lambda fn=past_the_plan: fn(False, bad=False),
                _rows_zero_else_equal([1], lse_dim=1),
            )
        )

        def small_pages(check, bad=True, splits=splits):
            q, k, v, tables, lens = _paged_inputs(device, PAGE=4, pages=8)  # a tile spans 4 pages
            plan = _reference(f1).plan(lens, k.shape[2], k.shape[1], num_splits=splits)
            if bad:
                tables[2, 5] = -1  # in the second tile of the row, looked up token by token
            return _reference(f1).split_kv_decode(
                q, k, v, tables, lens, plan=plan, return_lse=True, check=check
            )

        cases.append(
            GuardCase(
                f1,
                f"block_id_-1_pages_of_4_{splits}_split{'s' if splits > 1 else ''}",
                "block_tables",
                small_pages,
                lambda fn=small_pages: fn(False, bad=False),
                _rows_zero_else_equal([2], lse_dim=1),
            )
        )

    def merge_case(name, argument, row, value):
        def run(check, bad=True):
            gen = torch.Generator().manual_seed(3)
            o_a, o_b = torch.randn(2, 6, 16, generator=gen).to(device)  # [R, D] each
            lse_a, lse_b = (torch.randn(2, 6, generator=gen) * 4).to(device)  # [R]
            lse_a[5] = lse_b[0] = float("-inf")  # an empty part beside them stays valid
            if bad:
                (lse_a if argument == "lse_a" else lse_b)[row] = value
            return _reference(f1).merge_states(o_a, lse_a, o_b, lse_b, check=check)

        cases.append(
            GuardCase(f1, name, argument, run, lambda: run(False, bad=False), _rows_zero_else_equal([row], 1))
        )

    merge_case("merge_states_lse_a_nan", "lse_a", 2, float("nan"))
    merge_case("merge_states_lse_a_plus_inf", "lse_a", 4, float("inf"))
    merge_case("merge_states_lse_b_plus_inf", "lse_b", 1, float("inf"))
    merge_case("merge_states_lse_b_nan_beside_an_empty_part", "lse_b", 5, float("nan"))
    return cases


def _f3_store(key, value, shape, slots, check):
    k_cache = torch.zeros(shape, device=key.device).to(torch.float8_e4m3fn)
    v_cache = torch.zeros_like(k_cache)
    scales = torch.tensor([0.02, 0.05], device=key.device)  # one per KV head
    _reference("f3_fp8_kv_cache").store_kvcache_fp8(
        key, value, k_cache, v_cache, slots, scales, scales, check=check
    )
    return k_cache.view(torch.uint8), v_cache.view(torch.uint8)  # bytes: torch compares no float8


def _e4m3_inputs(device):
    q, k, v, tables, lens = _paged_inputs(device)
    return q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), tables, lens


def f3_cases(device) -> list[GuardCase]:
    """F1's decode cases through fp8_decode over an e4m3 cache with per-head scales (one split and two),
    and L1's bad slots through the quantizing store."""
    f3 = "f3_fp8_kv_cache"
    cases = [replace(c, name=f"store_{c.name}") for c in _store_cases(f3, _f3_store, torch.float16)(device)]
    for splits in (1, 2):

        def planned(q, k, v, tables, lens, splits=splits):
            scales = torch.tensor([0.5, 0.25], device=q.device)  # Hkv = 2
            plan = _reference(f3).plan(lens, k.shape[2], k.shape[1], num_splits=splits)
            return dict(k_scale=scales, v_scale=scales.flip(0), plan=plan, return_lse=True)

        for c in _decode_cases(f3, "fp8_decode", device, extra=planned, lse_dim=1, inputs=_e4m3_inputs):
            cases.append(replace(c, name=f"{c.name}_{splits}_split{'s' if splits > 1 else ''}"))
    return cases


def f2_cases(device, impl=None) -> list[GuardCase]:
    """L2's cases through F2 with sequences 1 and 2 sharing their first page (group 0, a 16-token prefix)
    and sequence 0 in no group, cascading and not (the fallback is F1's split-KV); then a group id
    outside [-1, G) and prefix lengths that are no whole number of pages, past a member's context or past
    the table, which zero the rows they reach. impl: the module called (default the reference; F2's
    grader passes the learner's, for the group cases, whose guards the lesson asks for)."""
    f2 = "f2_cascade_decode"
    cases = []
    module = (lambda: impl) if impl is not None else (lambda: _reference(f2))

    def grouped(q, k, v, tables, lens, cascade=True):
        tables[2, 0] = tables[1, 0]  # sequence 2 shares sequence 1's first page
        prefix_group = torch.tensor([-1, 0, 0], dtype=torch.int32, device=q.device)
        prefix_lens = torch.tensor([16], dtype=torch.int32, device=q.device)
        plan = module().plan(
            lens, prefix_group, prefix_lens, q.shape[1], k.shape[2], k.shape[1], cascade=cascade
        )
        return dict(prefix_group=prefix_group, prefix_lens=prefix_lens, plan=plan, return_lse=True)

    for cascade in (True, False):
        extra = lambda *t, cascade=cascade: grouped(*t, cascade=cascade)  # noqa: E731
        for c in _decode_cases(f2, "cascade_decode", device, extra=extra, lse_dim=1):
            cases.append(replace(c, name=f"{c.name}_{'cascade' if cascade else 'fallback'}"))

    def group_case(name, argument, corrupt, rows):
        def run(check, bad=True):
            q, k, v, tables, lens = _paged_inputs(device)
            kwargs = grouped(q, k, v, tables, lens)
            if bad:
                corrupt(kwargs)
            return module().cascade_decode(q, k, v, tables, lens, check=check, **kwargs)

        cases.append(
            GuardCase(f2, name, argument, run, lambda: run(False, bad=False), _rows_zero_else_equal(rows, 1))
        )

    group_case("prefix_group_past_G", "prefix_group", lambda a: a["prefix_group"].__setitem__(1, 5), [1])
    group_case(
        "prefix_group_below_minus_one", "prefix_group", lambda a: a["prefix_group"].__setitem__(2, -3), [2]
    )
    group_case(
        "prefix_len_not_whole_pages", "prefix_lens", lambda a: a["prefix_lens"].__setitem__(0, 8), [1, 2]
    )
    # Contexts are 28 and 27 tokens (two pages): 32 is past both members, 48 past the table's two pages too.
    for n in (32, 48):
        group_case(
            f"prefix_len_{n}_past_the_members",
            "prefix_lens",
            lambda a, n=n: a["prefix_lens"].__setitem__(0, n),
            [1, 2],
        )
    return cases


# -------------------------------------------------------------------------------------------- L4
def l4_cases(device, stem="l4_paged_prefill", **features) -> list[GuardCase]:
    """paged_prefill with bad cu_seqlens_q, context_lens or block ids: every row of the sequence the bad
    value belongs to is zeros with an lse of -inf (the last sequence: every row up to q's end), the
    other sequences' rows are unchanged, and nothing outside q, out, lse, the caches or the table is
    touched. L5's unified_attention takes the same cases (stem, and its window, sinks or plan in
    `features`: sinks as a function of Hq)."""
    cases = []
    shape = dict(Hq=4, Hkv=2, D=16, PAGE=16, pages=3, q_lens=[5, 7, 4], ctx_lens=[20, 7, 40])

    def case(name, argument, corrupt, rows, Hq, Hkv, D, PAGE, pages, q_lens, ctx_lens):
        B = len(q_lens)

        def run(check, bad=True):
            gen = torch.Generator().manual_seed(2)
            num_blocks = B * pages + 2
            k = torch.randn(num_blocks, PAGE, Hkv, D, generator=gen).half().to(device)
            v = torch.randn(num_blocks, PAGE, Hkv, D, generator=gen).half().to(device)
            q = torch.randn(sum(q_lens), Hq, D, generator=gen).half().to(device)  # [total_q, Hq, D]
            tables = torch.randperm(num_blocks, generator=gen)[: B * pages].view(B, pages).int().to(device)
            cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32).to(device)
            lens = torch.tensor(ctx_lens, dtype=torch.int32).to(device)  # [B]
            if bad:
                corrupt(tables, cu, lens)
            if stem == "l4_paged_prefill":
                fn = _reference(stem).paged_prefill
            else:
                fn = _reference(stem).unified_attention
            extra = {k: f(Hq) if callable(f) else f for k, f in features.items()}  # sinks: [Hq] fp32
            if "sinks" in extra:
                extra["sinks"] = extra["sinks"].to(device)
            return fn(q, k, v, tables, cu, lens, return_lse=True, check=check, **extra)

        cases.append(
            GuardCase(
                stem,
                name,
                argument,
                run,
                lambda: run(False, bad=False),
                _rows_zero_else_equal(rows, lse_dim=1),
            )
        )

    seq = [list(range(0, 5)), list(range(5, 12)), list(range(12, 16))]  # each sequence's rows of q
    # cu[2] = 3 < cu[1] = 5 ends sequence 1 before it starts and starts sequence 2 inside sequence 0:
    # all three are bounded by a decreasing boundary.
    every = seq[0] + seq[1] + seq[2]
    case("cu_seqlens_decreasing", "cu_seqlens_q", lambda t, cu, n: cu.__setitem__(2, 3), every, **shape)
    case("cu_seqlens_total_short", "cu_seqlens_q", lambda t, cu, n: cu.__setitem__(3, 14), seq[2], **shape)
    case("cu_seqlens_total_long", "cu_seqlens_q", lambda t, cu, n: cu.__setitem__(3, 40), seq[2], **shape)
    case("cu_seqlens_start_not_0", "cu_seqlens_q", lambda t, cu, n: cu.__setitem__(0, 2), seq[0], **shape)
    case("q_len_past_context", "context_lens", lambda t, cu, n: n.__setitem__(1, 1), seq[1], **shape)
    case(
        "context_past_the_row", "context_lens", lambda t, cu, n: n.__setitem__(2, 3 * 16 + 1), seq[2], **shape
    )
    case("context_negative", "context_lens", lambda t, cu, n: n.__setitem__(0, -1), seq[0], **shape)
    for bad_id in GARBAGE_IDS:
        corrupt = lambda t, cu, n, bad_id=bad_id: t.__setitem__((2, 1), bad_id)  # noqa: E731
        case(f"block_id_{bad_id}", "block_tables", corrupt, seq[2], **shape)
    # FlashInfer's fully-masked-rows case: 34 new tokens over a context of 1 (Hq 32, Hkv 8, D 128, page 1),
    # beside a valid sequence. 33 of those rows see no key: FlashInfer defines them as zeros, lse -inf.
    flashinfer = dict(Hq=32, Hkv=8, D=128, PAGE=1, pages=40, q_lens=[34, 3], ctx_lens=[34, 5])
    case(
        "flashinfer_fully_masked_rows",
        "context_lens",
        lambda t, cu, n: n.__setitem__(0, 1),
        list(range(34)),
        **flashinfer,
    )
    return cases


# -------------------------------------------------------------------------------------------- L5
def l5_cases(device) -> list[GuardCase]:
    """L4's cases through unified_attention with a window, sinks and a band split in two (the merge
    must keep an invalid row's zeros and -inf)."""
    from drills.solutions.l5_unified_attention import UnifiedPlan

    sinks = lambda Hq: torch.linspace(-1.0, 2.0, Hq)  # noqa: E731
    return l4_cases(device, "l5_unified_attention", window=6, sinks=sinks, plan=UnifiedPlan(num_splits=2))


# Each lesson's cases, by stem; the test and the memcheck run iterate this.
LESSONS: dict[str, Callable[[object], list[GuardCase]]] = {
    "l1_paged_kv_cache": l1_cases,
    "l2_paged_decode": l2_cases,
    "f1_split_kv_decode": f1_cases,
    "f2_cascade_decode": f2_cases,
    "f3_fp8_kv_cache": f3_cases,
    "l4_paged_prefill": l4_cases,
    "l5_unified_attention": l5_cases,
}


def all_cases(device) -> list[GuardCase]:
    return [c for make in LESSONS.values() for c in make(device)]
