"""L1's bad device values (drills/tests/guards.py): a slot past the cache or below -1, one token
at a time: that token is not stored, every other token is, nothing outside the caches is written.
"""

from __future__ import annotations

import torch

from drills.tests.guards import reference, store_cases


def _l1_store(key, value, shape, slots, check):
    k_cache = torch.zeros(shape, device=key.device)
    v_cache = torch.zeros_like(k_cache)
    reference("l1_paged_kv_cache").store_kvcache(key, value, k_cache, v_cache, slots, check=check)
    return k_cache, v_cache


cases = store_cases("l1_paged_kv_cache", _l1_store)
