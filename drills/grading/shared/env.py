"""The learner process's environment and time limits: a leaf module that pytest_run.py, learner_client.py,
process_tree.py and fork_server.py all import (it imports nothing of the harness)."""

from __future__ import annotations

import os
import signal

from drills.lessons import ROOT

CALL_TIMEOUT_ENV = "DRILLS_CALL_TIMEOUT"  # seconds one call may run (default below)
DEFAULT_CALL_TIMEOUT_S = 120.0
START_TIMEOUT_S = 120.0
AFTER_TIMEOUT_S = 15.0  # the limit of each call once one has timed out (a CPU check takes a few seconds)
MAX_TIMEOUTS = 3  # after this many, the remaining calls fail at once
LESSON_TIMEOUT_ENV = "DRILLS_LESSON_TIMEOUT"
LESSON_TIMEOUT_S = 900  # a whole lesson's grading; one call has its own limit (call_timeout)
STACK_SIGNAL = signal.SIGUSR1  # asks the learner's process for its Python stack (on a timeout)


def child_env() -> dict:
    """The environment of a process the grader starts: the repository importable, and one thread per
    math library (OpenMP, OpenBLAS, MKL). The grader and the learner's process take turns, and the
    tensors of a check are small: a second thread per library gains nothing, while idle OpenMP threads
    spin on the cores the other process needs (a T5 grading took 3.5x the CPU time on 2 cores)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


def call_timeout() -> float:
    return _seconds(CALL_TIMEOUT_ENV, DEFAULT_CALL_TIMEOUT_S)


def lesson_timeout() -> float:
    return _seconds(LESSON_TIMEOUT_ENV, LESSON_TIMEOUT_S)
