"""F3's bad device values (drills/tests/guards.py)."""

from __future__ import annotations

from dataclasses import replace

import torch

from drills.tests.guards import GuardCase, decode_cases, paged_inputs, reference, store_cases


def _f3_store(key, value, shape, slots, check):
    k_cache = torch.zeros(shape, device=key.device).to(torch.float8_e4m3fn)
    v_cache = torch.zeros_like(k_cache)
    scales = torch.tensor([0.02, 0.05], device=key.device)  # one per KV head
    reference("f3_fp8_kv_cache").store_kvcache_fp8(
        key, value, k_cache, v_cache, slots, scales, scales, check=check
    )
    return k_cache.view(torch.uint8), v_cache.view(torch.uint8)  # bytes: torch compares no float8


def _e4m3_inputs(device):
    q, k, v, tables, lens = paged_inputs(device)
    return q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), tables, lens


def cases(device) -> list[GuardCase]:
    """F1's decode cases through fp8_decode over an e4m3 cache with per-head scales (one split and two),
    and L1's bad slots through the quantizing store."""
    f3 = "f3_fp8_kv_cache"
    cases = [replace(c, name=f"store_{c.name}") for c in store_cases(f3, _f3_store, torch.float16)(device)]
    for splits in (1, 2):

        def planned(q, k, v, tables, lens, splits=splits):
            scales = torch.tensor([0.5, 0.25], device=q.device)  # Hkv = 2
            plan = reference(f3).plan(lens, k.shape[2], k.shape[1], num_splits=splits)
            return dict(k_scale=scales, v_scale=scales.flip(0), plan=plan, return_lse=True)

        for c in decode_cases(f3, "fp8_decode", device, extra=planned, lse_dim=1, inputs=_e4m3_inputs):
            cases.append(replace(c, name=f"{c.name}_{splits}_split{'s' if splits > 1 else ''}"))
    return cases
