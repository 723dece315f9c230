"""Bad device values, one case each, for the references' device guards (drills/device_errors.py): the
shared machinery. Each guarded lesson keeps its own cases beside its grader, in
drills/tests/guards_<stem>.py, as `cases(device) -> list[GuardCase]`; `all_cases` gathers them in the
lessons' order (drills/lessons.py).

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
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

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


def reference(stem: str):
    """The lesson's reference module, imported when a case runs."""
    return importlib.import_module(f"drills.solutions.{stem}")


def rows_zero_else_equal(rows, lse_dim=None):
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


def store_cases(stem: str, store, dtype=torch.float32) -> Callable[[object], list[GuardCase]]:
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


def paged_inputs(device, dtype=torch.float16, B=3, Hq=4, Hkv=2, D=16, PAGE=16, pages=2, gen_seed=0):
    """[B] sequences of up to pages * PAGE tokens in a pool of B * pages + 2 blocks, each row its own."""
    gen = torch.Generator().manual_seed(gen_seed)
    num_blocks = B * pages + 2
    k = torch.randn(num_blocks, PAGE, Hkv, D, generator=gen).to(dtype)  # [num_blocks, PAGE, Hkv, D]
    v = torch.randn(num_blocks, PAGE, Hkv, D, generator=gen).to(dtype)
    q = torch.randn(B, Hq, D, generator=gen).to(dtype)  # [B, Hq, D]
    tables = torch.randperm(num_blocks, generator=gen)[: B * pages].view(B, pages).to(torch.int32)
    lens = torch.tensor([pages * PAGE - 3 - i for i in range(B)], dtype=torch.int32)  # [B]
    return [t.to(device) for t in (q, k, v, tables, lens)]


def decode_cases(
    stem: str, fn_name: str, device, extra=None, lse_dim=None, inputs=paged_inputs, impl=None
) -> list[GuardCase]:
    """context_lens and block_tables corrupted one value at a time, for L2, F1 and F3 (the same API).
    extra(q, k, v, tables, lens): more keyword arguments, made from the valid inputs (F1's plan, as an
    engine plans from the lengths it knows); lse_dim: which output is the lse, if one is returned;
    inputs(device): the valid inputs (F3's caches are e4m3); impl: the module called (default the
    reference; F1's grader passes the learner's, to judge a guard the learner kept)."""
    cases = []

    def case(name, argument, corrupt, rows):
        def run(check, bad=True):
            fn = getattr(impl if impl is not None else reference(stem), fn_name)
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
                rows_zero_else_equal(rows, lse_dim),
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


def lesson_cases(stem: str):
    """The lesson's `cases` function (drills/tests/guards_<stem>.py), or None when it has no guards."""
    name = f"drills.tests.guards_{stem}"
    if importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name).cases


def all_cases(device) -> list[GuardCase]:
    """Every guarded lesson's cases, in the lessons' order."""
    from drills.lessons import LESSONS

    makers = [lesson_cases(lesson.stem) for lesson in LESSONS]
    return [c for make in makers if make is not None for c in make(device)]
