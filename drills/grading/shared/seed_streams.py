"""The random cases' numbering: every random case of a grader is drawn from its test's own fixed stream
number passed through `seeded`, so a default run always grades the same cases, and `SEED=7 make test
L=l2` grades other ones (the summary prints the shift, the plugin records it in the report)."""

from __future__ import annotations

import os

SEED_ENV = "SEED"


def base_seed() -> int:
    """The SEED environment variable (0 when unset): added to every test's own stream number."""
    value = os.environ.get(SEED_ENV, "").strip() or "0"
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{SEED_ENV} must be an integer, got {value!r}") from None


def seeded(stream: int) -> int:
    """A test's fixed stream number shifted by SEED: the same cases by default, others when SEED is set."""
    return stream + base_seed()
