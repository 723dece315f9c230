"""F1's bad device values (drills/tests/guards.py); its grader also runs them through a learner's file
whose kernels keep the reference's guard (`contained`), since a guard that records a value must contain it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from drills.tests.guards import GuardCase, decode_cases, paged_inputs, reference, rows_zero_else_equal


def cases(device, impl=None) -> list[GuardCase]:
    """L2's cases through both of F1's paths (one split writes the output itself; two splits write
    partials that the merge kernel combines: a bad block id seen by one split must zero the whole row),
    a length inside the table but past the plan's splits, and merge_states given a NaN or +inf lse.
    impl: the module called (default the reference; F1's grader passes the learner's)."""
    f1 = "f1_split_kv_decode"
    cases = []
    module = (lambda: impl) if impl is not None else (lambda: reference(f1))
    for splits in (1, 2):

        def planned(q, k, v, tables, lens, splits=splits):
            return dict(plan=module().plan(lens, k.shape[2], k.shape[1], num_splits=splits), return_lse=True)

        for c in decode_cases(f1, "split_kv_decode", device, extra=planned, lse_dim=1, impl=impl):
            cases.append(replace(c, name=f"{c.name}_{splits}_split{'s' if splits > 1 else ''}"))

        def past_the_plan(check, bad=True, splits=splits):
            q, k, v, tables, lens = paged_inputs(device, pages=4)  # a row holds 64 tokens
            lens.copy_(torch.tensor([20, 10, 30], dtype=torch.int32))  # planned for 30: the splits cover 32
            plan = module().plan(lens, k.shape[2], k.shape[1], num_splits=splits)
            if bad:
                lens[1] = 40  # inside the table row, past what the plan's splits read
            return module().split_kv_decode(q, k, v, tables, lens, plan=plan, return_lse=True, check=check)

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
            plan = module().plan(lens, k.shape[2], k.shape[1], num_splits=splits)
            if bad:
                tables[2, 5] = -1  # in the second tile of the row, looked up token by token
            return module().split_kv_decode(q, k, v, tables, lens, plan=plan, return_lse=True, check=check)

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
            return module().merge_states(o_a, lse_a, o_b, lse_b, check=check)

        cases.append(
            GuardCase(f1, name, argument, run, lambda: run(False, bad=False), rows_zero_else_equal([row], 1))
        )

    merge_case("merge_states_lse_a_nan", "lse_a", 2, float("nan"))
    merge_case("merge_states_lse_a_plus_inf", "lse_a", 4, float("inf"))
    merge_case("merge_states_lse_b_plus_inf", "lse_b", 1, float("inf"))
    merge_case("merge_states_lse_b_nan_beside_an_empty_part", "lse_b", 5, float("nan"))
    return cases


def contained(impl, device, names=None) -> list[tuple]:
    """Run in the learner's process (drills.tests.probe): each case's valid call, then its bad one with
    check=False, and whether a guard recorded the bad value in the device error word. A file needs no
    guard (section 3.7), so a case its kernels did not record says nothing; one they recorded must be
    contained as the reference contains it. Returns, per case, (name, what was recorded or None, what
    the bad call raised or None, valid outputs, bad outputs), the outputs as plain lists. On a GPU only a
    file whose kernels call record_error runs them: an unguarded read far past the pool there could end
    the process, where the interpreter stops it before the address is read."""
    import inspect

    from drills.device_errors import error_word, raise_device_errors

    if device != "cpu" and "record_error(" not in inspect.getsource(impl):
        return []
    results = []
    for case in cases(device, impl):
        if names is not None and case.name not in names:
            continue
        word = error_word(device)
        word.zero_()
        valid, bad, raised, recorded = None, None, None, None
        try:
            valid = case.call_valid()
            raise_device_errors(device)  # a valid call records nothing
            bad = case.call(False)
        except Exception as exc:  # noqa: BLE001 - an unguarded read past the pool, or a guard's own error
            raised = f"{type(exc).__name__}: {exc}"
        try:
            raise_device_errors(device)
        except ValueError as exc:
            recorded = str(exc)
        word.zero_()
        results.append((case.name, recorded, raised, _plain(valid), _plain(bad)))
    return results


def _plain(outputs):
    if outputs is None:
        return None
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [(str(t.dtype).removeprefix("torch."), t.float().cpu().tolist()) for t in outputs]
