"""The reverse-order run that finds write races is made only for launches whose programs touch each
other's bytes (drills/grading/learner/write_races.py): each way two programs can share memory must count as an
overlap, and programs that only touch their own bytes must not."""

from __future__ import annotations

import numpy as np
import pytest

from drills.grading.learner.write_races import AccessLog, program_number
from tests.test_grading_harness import T1_STORE, failures, grade_t1, interpreter_only, one_screen, t1_source


def addresses(*values) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


def log_of(*accesses) -> AccessLog:
    log = AccessLog()
    for what, addrs, size, program in accesses:
        log.record(what, addresses(*addrs), size, program)
    return log


@pytest.mark.parametrize(
    "accesses",
    [
        [("store", (0, 4, 8), 4, 0), ("store", (12, 16), 4, 1)],  # fp32 blocks side by side
        [("store", (0, 2), 2, 0), ("store", (4, 6), 2, 1)],  # fp16 neighbours in one 8-byte word
        [("store", (0, 4), 4, 0), ("load", (0, 4), 4, 0), ("store", (0,), 4, 0)],  # a program's own bytes
        [("load", (0, 4), 4, 0), ("load", (0, 4), 4, 1), ("store", (64,), 4, 1)],  # inputs both read
    ],
    ids=["disjoint-stores", "adjacent-fp16", "own-bytes-reread", "shared-inputs-read"],
)
def test_programs_on_their_own_bytes_do_not_overlap(accesses):
    assert not log_of(*accesses).overlapping()


@pytest.mark.parametrize(
    "accesses",
    [
        [("store", (0, 4), 4, 0), ("store", (4, 8), 4, 1)],  # one element stored by two programs
        [("store", (0, 4), 4, 0), ("load", (4,), 4, 1)],  # read after (or before) another's write
        [("store", (0,), 4, 0), ("load", (2,), 2, 1)],  # half of an fp32 read as an fp16
        [("store", (8,), 4, 0), ("atomic", (64,), 4, 1)],  # atomics: programs that share on purpose
    ],
    ids=["two-writers", "read-of-another-programs-store", "partial-bytes", "atomic"],
)
def test_programs_sharing_bytes_overlap(accesses):
    assert log_of(*accesses).overlapping()


def test_a_new_launch_starts_a_new_log():
    log = log_of(("store", (0,), 4, 0), ("store", (0,), 4, 1))
    log.reset()
    log.record("store", addresses(0), 4, 0)
    assert not log.overlapping()


def test_program_numbers_are_distinct_across_the_grid():
    grid = (3, 2, 2)
    numbers = {program_number((x, y, z), grid) for x in range(3) for y in range(2) for z in range(2)}
    assert numbers == set(range(12))


@interpreter_only
def test_reading_the_block_another_program_stored_is_a_write_race(tmp_path):
    """Each program reads back the block the previous program stored and adds the difference from what
    that block should hold: zero in forward order (the interpreter alone would pass it), the canary's
    distance in reverse order, or on a GPU. No byte is stored twice: only the read shares memory."""
    previous = (
        T1_STORE + "\n    before = (offs >= BLOCK) & (offs < n)"
        "\n    prev = tl.load(out_ptr + offs - BLOCK, mask=before, other=0.0)"
        "\n    expect = tl.load(x_ptr + offs - BLOCK, mask=before, other=0.0)"
        " + tl.load(y_ptr + offs - BLOCK, mask=before, other=0.0)"
        "\n    tl.store(out_ptr + offs, x + y + (prev - expect), mask=mask)"
    )
    result = grade_t1(tmp_path, t1_source(T1_STORE, previous), "test_by_hand_lane_11_is_masked")
    screen = one_screen(result)
    assert "write race" in failures(result).get("test_by_hand_lane_11_is_masked", ""), screen
    assert result.findings[0]["kind"] == "write_race", screen
