"""L2's bad device values (drills/tests/guards.py): context_lens and block_tables corrupted one
value at a time.
"""

from __future__ import annotations

from drills.tests.guards import GuardCase, decode_cases


def cases(device) -> list[GuardCase]:
    return decode_cases("l2_paged_decode", "paged_decode", device)
