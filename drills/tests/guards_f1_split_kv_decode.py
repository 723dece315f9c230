"""F1's bad device values (drills/tests/guards.py)."""

from __future__ import annotations

from dataclasses import replace

import torch

from drills.tests.guards import GuardCase, decode_cases, paged_inputs, reference, rows_zero_else_equal


def cases(device) -> list[GuardCase]:
    """L2's cases through both of F1's paths (one split writes the output itself; two splits write
    partials that the merge kernel combines: a bad block id seen by one split must zero the whole row),
    a length inside the table but past the plan's splits, and merge_states given a NaN or +inf lse."""
    f1 = "f1_split_kv_decode"
    cases = []
    for splits in (1, 2):

        def planned(q, k, v, tables, lens, splits=splits):
            return dict(
                plan=reference(f1).plan(lens, k.shape[2], k.shape[1], num_splits=splits), return_lse=True
            )

        for c in decode_cases(f1, "split_kv_decode", device, extra=planned, lse_dim=1):
            cases.append(replace(c, name=f"{c.name}_{splits}_split{'s' if splits > 1 else ''}"))

        def past_the_plan(check, bad=True, splits=splits):
            q, k, v, tables, lens = paged_inputs(device, pages=4)  # a row holds 64 tokens
            lens.copy_(torch.tensor([20, 10, 30], dtype=torch.int32))  # planned for 30: the splits cover 32
            plan = reference(f1).plan(lens, k.shape[2], k.shape[1], num_splits=splits)
            if bad:
                lens[1] = 40  # inside the table row, past what the plan's splits read
            return reference(f1).split_kv_decode(
                q, k, v, tables, lens, plan=plan, return_lse=True, check=check
            )

        cases.append(
            GuardCase(
                f1,
                f"context_len_past_the_plan_{splits}_split{'s' if splits > 1 else ''}",
                "context_lens",
                past_the_plan,
                lambda fn=past_the_plan: fn(False, bad=False),
                rows_zero_else_equal([1], lse_dim=1),
            )
        )

        def small_pages(check, bad=True, splits=splits):
            q, k, v, tables, lens = paged_inputs(device, PAGE=4, pages=8)  # a tile spans 4 pages
            plan = reference(f1).plan(lens, k.shape[2], k.shape[1], num_splits=splits)
            if bad:
                tables[2, 5] = -1  # in the second tile of the row, looked up token by token
            return reference(f1).split_kv_decode(
                q, k, v, tables, lens, plan=plan, return_lse=True, check=check
            )

        cases.append(
            GuardCase(
                f1,
                f"block_id_-1_pages_of_4_{splits}_split{'s' if splits > 1 else ''}",
                "block_tables",
                small_pages,
                lambda fn=small_pages: fn(False, bad=False),
                rows_zero_else_equal([2], lse_dim=1),
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
            return reference(f1).merge_states(o_a, lse_a, o_b, lse_b, check=check)

        cases.append(
            GuardCase(f1, name, argument, run, lambda: run(False, bad=False), rows_zero_else_equal([row], 1))
        )

    merge_case("merge_states_lse_a_nan", "lse_a", 2, float("nan"))
    merge_case("merge_states_lse_a_plus_inf", "lse_a", 4, float("inf"))
    merge_case("merge_states_lse_b_plus_inf", "lse_b", 1, float("inf"))
    merge_case("merge_states_lse_b_nan_beside_an_empty_part", "lse_b", 5, float("nan"))
    return cases
