"""Every bad device value of drills/tests/guards_<stem>.py on a GPU, for `make guards`, which runs this module
under `compute-sanitizer --tool memcheck` and writes its log to drills/content/device_guards.memcheck.log.

Each case calls the reference with check=False (the default GPU path: nothing read on the host) and
checks what tests/test_device_guards.py checks on the CPU: the invalid rows are zeros (lse -inf), the
valid rows are the valid call's, raise_device_errors() names the argument, and check=True refuses the
same input before launching. The sanitizer adds what the CPU cannot show: that no load or store of
any kernel left the memory it was given. Nothing runs on import.
"""

from __future__ import annotations

import sys

import torch

from drills import device_errors
from drills.tests import guards


def run_case(case) -> str | None:
    """None if the case holds, else what failed."""
    valid = case.call_valid()
    device_errors.raise_device_errors("cuda")  # a valid call must record nothing
    bad = case.call(False)
    torch.cuda.synchronize()
    try:
        case.compare(valid, bad)
    except AssertionError as exc:
        return f"rows not contained: {exc}"
    try:
        device_errors.raise_device_errors("cuda")
        return "raise_device_errors() raised nothing"
    except ValueError as exc:
        if case.argument not in str(exc):
            return f"raise_device_errors() named the wrong argument: {exc}"
    try:
        case.call(True)
        return "check=True accepted the bad value"
    except ValueError as exc:
        if case.argument not in str(exc):
            return f"check=True named the wrong argument: {exc}"
    return None


def main() -> int:
    if not torch.cuda.is_available():
        print("make guards needs a CUDA GPU (compute-sanitizer watches GPU memory)")
        return 2
    cases = guards.all_cases("cuda")
    failed = 0
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {len(cases)} cases", flush=True)
    for case in cases:
        problem = run_case(case)
        failed += problem is not None
        print(
            f"{'FAIL' if problem else 'ok  '} {case.lesson} {case.name}: {problem or case.argument}",
            flush=True,
        )
    print(f"{len(cases) - failed} of {len(cases)} cases contained and named", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
