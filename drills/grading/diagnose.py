"""From the set of failing and passing checks to the most likely mistake.

Each lesson's grader (drills/tests/test_<stem>.py) declares `MISTAKES`, a list of `Mistake`: the
explainer pitfall it stands for, and the pattern of results it leaves. A pattern has three kinds of
condition, all optional:

  fails     case patterns that must have a failing case: "test_scale_is_applied" (any of its cases),
            "test_kv_head_grouping_is_contiguous[group2]", or fnmatch wildcards ("test_*[bf16]")
  passes    case patterns whose every case that ran must pass: the look-alikes this mistake is not
  messages  regular expressions, each matching the message of some failing case ("NaN", "canary",
            "out of bounds store .*out")

A mistake whose every condition holds is consistent with the results; the most specific consistent
one (most conditions) is named first, and a second consistent one is named too. When none is fully
consistent, the one with the largest share of conditions holding is named as "most likely".
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mistake:
    pitfall: int  # the number of the explainer's pitfall this mistake is (its "## N. Pitfalls" item)
    fails: tuple[str, ...] = ()
    passes: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()
    question: str = ""  # the first hint: a question that points at the mistake without giving the fix
    section: str = ""  # the explainer section of the worked example to quote in the third hint ("2", "3.4")

    def __post_init__(self):
        for name in ("fails", "passes", "messages"):
            value = getattr(self, name)
            if isinstance(value, str):  # a lone string is one pattern, not a tuple of characters
                object.__setattr__(self, name, (value,))
