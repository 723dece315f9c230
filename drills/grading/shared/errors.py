"""One table of the failures a learner's code can cause, used on both sides of the process boundary.

The learner's process (serve_calls.py, instrument.py) raises these classes, sends their `kind` with the
message, and the grader's process (learner_client.py) raises the same class again from that kind: one
definition, no mapping by class names.

  the learner's own exception   re-raised as the same built-in class (ValueError, TypeError, ...),
                                with `drills_where` = "file:line" and `drills_code` = that line
  OutOfBoundsAccess             a kernel load or store outside its tensors (interpreter)
  WriteRace                     programs visited in reverse gave another result (interpreter)
  NotFromKernel                 the result did not come from a launch of the learner's kernel
  GridTooLarge                  a launch grid past CUDA's limits (launches.py), which a GPU refuses
  LearnerCrash                  the process died (a segfault, os._exit, a CUDA fault); restarted
  LearnerTimeout                a call ran past its time limit; the process is killed and restarted
  LearnerError                  any other exception (a Triton compile error, a class of the learner's)
"""

from __future__ import annotations


class LearnerFailure(AssertionError):
    """A failure of the learner's code that is not an exception it raised itself."""

    kind = "failure"


class OutOfBoundsAccess(LearnerFailure):
    """A load or store lane outside every tensor argument of the kernel."""

    kind = "out_of_bounds"


class WriteRace(LearnerFailure):
    """The same call gave different results with programs visited in another order."""

    kind = "write_race"


class NotFromKernel(LearnerFailure):
    """The call's result is not what a launch of the learner's kernel stored."""

    kind = "not_from_kernel"


class GridTooLarge(LearnerFailure):
    """A launch grid with an axis past CUDA's limit: checked before every launch, on every machine, since
    Triton's interpreter runs any grid and a GPU refuses it only at sizes the small cases never reach."""

    kind = "grid_too_large"


class LearnerCrash(LearnerFailure):
    kind = "crash"


class LearnerTimeout(LearnerFailure):
    kind = "timeout"


class LearnerError(Exception):
    """An exception of a class that is not built in (a Triton compile error, the learner's own class)."""

    kind = "exception"


class ImportFailed(Exception):
    """The learner's file does not import; `info` says how."""

    def __init__(self, info: dict):
        super().__init__(info.get("message", ""))
        self.info = info


class Refused(Exception):
    """The learner's file asks where it runs (source_check.py): refused before any check; `lines` says where."""

    def __init__(self, lines: list[str]):
        super().__init__("; ".join(lines))
        self.lines = lines


# The kinds the learner's process reports by name and the grader raises again as the same class.
BY_KIND: dict[str, type[LearnerFailure]] = {
    cls.kind: cls
    for cls in (OutOfBoundsAccess, WriteRace, NotFromKernel, GridTooLarge, LearnerCrash, LearnerTimeout)
}
RAISED_IN_KERNELS = (
    OutOfBoundsAccess,
    WriteRace,
    NotFromKernel,
    GridTooLarge,
)  # what the instrumentation raises
