"""L4's bad device values (drills/tests/guards.py); L5 runs the same cases through unified_attention."""

from __future__ import annotations

import torch

from drills.tests.guards import GARBAGE_IDS, GuardCase, reference, rows_zero_else_equal


def cases(device, stem="l4_paged_prefill", **features) -> list[GuardCase]:
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
                fn = reference(stem).paged_prefill
            else:
                fn = reference(stem).unified_attention
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
                rows_zero_else_equal(rows, lse_dim=1),
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
