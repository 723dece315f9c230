"""F2's GPU launch paths, compiled (GPU only).

The interpreter has no streams and ignores a launch's warps and shared memory, so three things about F2's
launcher are seen only on a GPU:
- the prefix stage's two launches (`_prefix_launch`): the wide tile (up to PREFIX_N keys and 128 x 128
  elements of K, 8 warps) where the q tile is at most 128 x 128 elements, and the 16-key launch kept for
  larger q tiles; either wide launch past those bounds needs more shared memory than a block may have;
- the side stream the prefix stage runs on, which must join the caller's stream before the merge, also
  inside a CUDA graph captured on a stream of the caller's own (torch.cuda.graph captures on a side stream).
Each output is held to the fp32 oracle, and a replay to an eager call on the same values.
"""

from __future__ import annotations

import pytest
import torch

import drills.runtime
from drills.compare import assert_close

if drills.runtime.current().interpreter:
    pytest.skip(
        "F2's compiled launches and its side stream need a GPU; under the interpreter these checks are skipped",
        allow_module_level=True,
    )

from drills.solutions import f2_cascade_decode as f2  # noqa: E402 - after the GPU check
from drills.tests.paged_kv import paged_attention_reference  # noqa: E402
from drills.tests.test_f2_cascade_decode import cascade_case  # noqa: E402

DIMS = ("b", "head", "d")


@pytest.mark.parametrize(
    "Hq, Hkv, D, members_per_tile, prefix_chunks, keys",
    [
        (32, 1, 256, None, None, 16),  # 4 members x 32 heads = 128 rows at D = 256: the 16-key launch
        (32, 1, 256, 2, None, 64),  # 64 rows at D = 256, chunks of 64 tokens: the wide launch, 64 keys
        # 64 rows at D = 256, 128-token chunks: 64 keys, since 128 keys at D = 256 asked for 295 KB of
        # shared memory on an H100 (past the 227 KB a block may have) and failed to compile
        (32, 1, 256, 2, 2, 64),
        (32, 8, 128, None, None, 64),  # 6 members x 4 heads in a 32-row tile at D = 128, as the benchmark
        (32, 8, 128, None, 2, 128),  # the same at 128-token chunks: the widest tile, 128 keys
    ],
    ids=[
        "q-tile-past-128x128",
        "64-rows-d256-64-keys",
        "64-rows-d256-128-token-chunks-64-keys",
        "32-rows-d128",
        "32-rows-d128-128-keys",
    ],
)
def test_prefix_stage_launches_compile_and_match_the_oracle(
    Hq, Hkv, D, members_per_tile, prefix_chunks, keys
):
    prefix = 256
    lens = [prefix + n for n in (1, 40, 77, 128, 3, 200)] + [50]
    groups = [0] * 6 + [-1]
    case, prefix_group, prefix_lens = cascade_case(
        lens, groups, [prefix], Hq, Hkv, D, 16, device="cuda", stream=3
    )
    plan = f2.plan(
        case.context_lens,
        prefix_group,
        prefix_lens,
        Hq,
        Hkv,
        16,
        cascade=True,
        members_per_tile=members_per_tile,
        prefix_chunks=prefix_chunks,
    )
    rows = max(16, 1 << (plan.members_per_tile * (Hq // Hkv) - 1).bit_length())
    launch = f2._prefix_launch(plan.prefix_chunk, rows, D)
    assert launch["BLOCK_N"] == keys, f"{rows} rows at D = {D}, chunks of {plan.prefix_chunk} took {launch}"
    out, lse = f2.cascade_decode(
        *case.args, prefix_group, prefix_lens, plan=plan, return_lse=True, check=True
    )
    ref, ref_lse = paged_attention_reference(*case.args)
    assert_close(out, ref, DIMS)
    assert torch.allclose(lse, ref_lse, atol=2e-3, rtol=1e-3)


def test_side_stream_replays_new_values_inside_a_graph():
    """One plan for the graph (the table's capacity), captured with the prefix stage on its side stream;
    each replay on new lengths and values gives what an eager call gives, and the oracle's output."""
    Hq, Hkv, D, PAGE, prefix, max_pages = 8, 2, 64, 16, 64, 12
    capacity = max_pages * PAGE
    groups = [0, 0, 0, -1, 1, 1]

    def step(lens, stream):
        return cascade_case(
            lens,
            groups,
            [prefix, prefix],
            Hq,
            Hkv,
            D,
            PAGE,
            device="cuda",
            stream=stream,
            num_blocks=96,
            max_pages=max_pages,
        )

    captured, prefix_group, prefix_lens = step(
        [prefix + 30, prefix + 1, prefix + 90, 17, prefix, prefix + 5], 40
    )
    plan = f2.plan([capacity] * len(groups), groups, [prefix, prefix], Hq, Hkv, PAGE, cascade=True)
    assert plan.prefix_chunks >= 1 and plan.cascade
    buffers = captured.args
    out = torch.empty_like(buffers[0])
    side = torch.cuda.Stream()  # the caller's own stream, not the default one: warm-up and capture run on it
    side.wait_stream(torch.cuda.current_stream())  # the case was written on the default stream
    with torch.cuda.stream(side):
        f2.cascade_decode(*buffers, prefix_group, prefix_lens, plan=plan, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        f2.cascade_decode(*buffers, prefix_group, prefix_lens, plan=plan, out=out)
    for i, lens in enumerate(
        (
            [prefix + 100, prefix + 7, prefix, 0, prefix + 128, prefix + 60],
            [prefix] * 3 + [capacity, capacity, prefix + 1],
        )
    ):
        new, _, _ = step(lens, 50 + i)
        for buffer, value in zip(buffers, new.args):
            buffer.copy_(value)
        graph.replay()
        torch.cuda.synchronize()
        eager = f2.cascade_decode(*new.args, prefix_group, prefix_lens, plan=plan, check=True)
        assert torch.equal(out, eager), f"replay {i} (lengths {lens}) differs from an eager call"
        assert_close(out, paged_attention_reference(*new.args)[0], DIMS)
