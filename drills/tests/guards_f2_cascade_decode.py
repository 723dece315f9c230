"""F2's bad device values (drills/tests/guards.py); its grader runs the group cases on the learner's
file too.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from drills.tests.guards import GuardCase, decode_cases, paged_inputs, reference, rows_zero_else_equal


def cases(device, impl=None) -> list[GuardCase]:
    """L2's cases through F2 with sequences 1 and 2 sharing their first page (group 0, a 16-token prefix)
    and sequence 0 in no group, cascading and not (the fallback is F1's split-KV); then a group id
    outside [-1, G) and prefix lengths that are no whole number of pages, past a member's context or past
    the table, which zero the rows they reach. impl: the module called (default the reference; F2's
    grader passes the learner's, for the group cases, whose guards the lesson asks for)."""
    f2 = "f2_cascade_decode"
    cases = []
    module = (lambda: impl) if impl is not None else (lambda: reference(f2))

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
        for c in decode_cases(f2, "cascade_decode", device, extra=extra, lse_dim=1):
            cases.append(replace(c, name=f"{c.name}_{'cascade' if cascade else 'fallback'}"))

    def group_case(name, argument, corrupt, rows):
        def run(check, bad=True):
            q, k, v, tables, lens = paged_inputs(device)
            kwargs = grouped(q, k, v, tables, lens)
            if bad:
                corrupt(kwargs)
            return module().cascade_decode(q, k, v, tables, lens, check=check, **kwargs)

        cases.append(
            GuardCase(f2, name, argument, run, lambda: run(False, bad=False), rows_zero_else_equal(rows, 1))
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
