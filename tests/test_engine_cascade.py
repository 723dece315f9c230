"""The engine's cascade path: decode steps whose sequences share their first pages served by F2.

shared_prefixes finds the groups from the block tables (as vLLM's get_num_common_prefix_blocks does
from the blocks every running request holds); the engine then asks F2's planner, and a step it
cascades must give the tokens the same engine gives without cascading.
"""

from __future__ import annotations

import torch

from drills.engine.engine import shared_prefixes

PAGE = 4


def test_sequences_whose_tables_start_alike_form_one_group_cut_to_whole_filled_pages():
    tables = [[7, 8, 9, 1], [7, 8, 9, 2], [7, 8, 3]]
    lens = [15, 14, 10]  # the third has filled 2 whole pages: the group shares 2, not 3
    assert shared_prefixes(tables, lens, PAGE) == ([0, 0, 0], [2 * PAGE])


def test_two_prompts_give_two_groups_and_a_sequence_alone_shares_nothing():
    tables = [[1, 2, 5], [3, 4, 6], [1, 2, 7], [3, 9, 8], [11, 12]]
    lens = [12, 12, 12, 12, 8]
    groups, prefix_lens = shared_prefixes(tables, lens, PAGE)
    assert groups == [0, 1, 0, 1, -1]
    assert prefix_lens == [2 * PAGE, 1 * PAGE]


def test_a_group_sharing_no_whole_filled_page_is_no_group():
    # The same first block, but one member has not filled it yet: nothing is shared in whole pages.
    assert shared_prefixes([[5, 6], [5, 7]], [9, 3], PAGE) == ([-1, -1], [])
    assert shared_prefixes([[5], []], [4, 0], PAGE) == ([-1, -1], [])  # a padding row has no table


def _llm(cascade: bool):
    import drills.runtime
    from drills.engine.config import tiny_config
    from drills.engine.llm import LLM
    from drills.engine.model import random_weights

    weights = random_weights(tiny_config(), stream=3)
    return LLM(
        weights,
        attention="kernels",
        use="solutions",
        device=drills.runtime.current().device,  # the kernels' device: compiled Triton wants CUDA tensors
        block_size=16,
        num_blocks=64,
        max_model_len=256,
        cascade=cascade,
        quiet=True,
    )


def test_cascading_decode_steps_gives_the_tokens_of_the_engine_without_it():
    """Ten requests share a 96-token prompt (6 pages, past F2's smallest chunk) and hold 1 to 10 tokens of
    their own: the planner cascades their decode steps (the shared share of their tokens is past
    CASCADE_SHARE), and the greedy tokens equal those of the same engine with cascade=False."""
    from drills.solutions.c1_engine import SamplingParams

    g = torch.Generator().manual_seed(0)
    shared = torch.randint(1, 256, (96,), generator=g).tolist()
    prompts = [shared + torch.randint(1, 256, (n,), generator=g).tolist() for n in range(1, 11)]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    on, off = _llm(True), _llm(False)
    got = [o.token_ids for o in on.generate(prompts, params)]
    want = [o.token_ids for o in off.generate(prompts, params)]
    assert on.engine.stats.cascade_steps > 0, "no decode step was cascaded: F2 never ran"
    assert off.engine.stats.cascade_steps == 0
    assert got == want, f"cascade on {got}, off {want}"
