"""The references' device guards, on the CPU (Triton's interpreter) or a GPU: every bad device value of
drills/tests/guards_<stem>.py is contained (invalid rows zero, lse -inf, valid rows unchanged), recorded in
the device error word and raised by raise_device_errors() naming the argument, and refused by check=True
before any launch. On a GPU the same cases run under compute-sanitizer (drills/benchmarks/memcheck.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import drills.runtime
from drills import device_errors
from drills.tests import guards

# The interpreter reads CPU tensors, compiled Triton CUDA ones: the cases run where the kernels do.
DEVICE = "cpu" if drills.runtime.current().interpreter else "cuda"
CASES = guards.all_cases(DEVICE)


@pytest.fixture(autouse=True)
def _clean_word():
    device_errors.error_word(DEVICE).zero_()
    yield
    device_errors.error_word(DEVICE).zero_()


@pytest.mark.parametrize("case", CASES, ids=[f"{c.lesson}-{c.name}" for c in CASES])
def test_bad_device_value_is_contained_and_named(case):
    valid = case.call_valid()
    device_errors.raise_device_errors(DEVICE)  # a valid call records nothing
    bad = case.call(False)
    case.compare(valid, bad)
    with pytest.raises(ValueError, match=case.argument):
        device_errors.raise_device_errors(DEVICE)
    device_errors.raise_device_errors(DEVICE)  # read once, then cleared


@pytest.mark.parametrize("case", CASES, ids=[f"{c.lesson}-{c.name}" for c in CASES])
def test_check_true_still_refuses_before_launch(case):
    with pytest.raises(ValueError, match=case.argument):
        case.call(True)
    device_errors.raise_device_errors(DEVICE)  # nothing was launched, so nothing was recorded


def test_every_error_code_a_kernel_records_is_described():
    """A code a kernel passes to record_error must be in CODES, or the learner reads 'error code N'."""
    root = Path(device_errors.__file__).parent / "solutions"
    used = set()
    for path in root.glob("*.py"):
        used |= {int(n) for n in re.findall(r"record_error\([^,]+,[^,]+,\s*(\d+)\s*,", path.read_text())}
    assert used, "no reference kernel records a device error"
    assert used <= set(device_errors.CODES), f"codes without a description: {used - set(device_errors.CODES)}"


def test_first_error_is_described_and_later_ones_counted():
    word = device_errors.error_word(DEVICE)
    word.copy_(word.new_tensor([21, 4, 99, 3]))
    with pytest.raises(ValueError, match=r"context_lens\[4\] = 99.*2 more programs"):
        device_errors.raise_device_errors(DEVICE)
    assert word.tolist() == [0, 0, 0, 0]


def test_the_word_keeps_its_address():
    """CUDA-graph replays record into the address captured: the word is allocated once per device."""
    assert device_errors.error_word(DEVICE).data_ptr() == device_errors.error_word(DEVICE).data_ptr()


def test_a_guard_that_fires_on_valid_input_fails_as_a_check_not_as_an_exception():
    """The graders pass bad values only with check=True, so a word set after a grader's call is a guard
    (the learner's copy of the reference's) that fired on values the launcher accepted: the kernel
    computed a wrong length, boundary or block id. That must read as a failed check whose message names
    the argument, so that the diagnosis goes on to the pitfall the failing checks share, and not as
    "your code raised an exception", which would stop it there."""
    from drills.grading.grader.diagnose import generic_kind
    from drills.grading.learner import run_call

    device_errors.error_word(DEVICE).copy_(device_errors.error_word(DEVICE).new_tensor([41, 1, 9, 1]))
    with pytest.raises(AssertionError) as failed:
        run_call._raise_device_errors()
    message = str(failed.value)
    assert "cu_seqlens_q" in message and "device guard fired" in message
    assert generic_kind(message) is None, "read as a generic failure, the pitfall is never named"
    run_call._raise_device_errors()  # read once, then cleared
