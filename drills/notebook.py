"""What a lesson's notebook runs: the learner's own file once it passes its grader, the reference
otherwise, with one printed line saying which and why. Every notebook starts the same way:

    from drills.notebook import implementation
    impl, note = implementation("t4")
    print(note)

and then calls only `impl.<function>` (the same names the grader calls), so every worked example of the
notebook goes through the learner's code as soon as it passes.

The learner's file runs in the notebook's own process, unlike in `make test` (where it runs in a
process of its own), so it is imported only after it passed its grader, as it is now: the outcome of the
last grading is kept per file content (`.drills/last-grades.json`, shared with `make hint`), and a file
changed since is graded again first, in a child process, exactly as `make test` grades it. An untouched
stub is never graded: it is "not started". DRILLS_MINE_DIR points all of this at another folder (the
tests use a copy of a solution there).
"""

from __future__ import annotations

import hashlib
import importlib
from types import ModuleType

from drills import learner, stubs
from drills.grading.grader import report
from drills.lessons import find

NOT_STARTED = "not started (fill in its TODOs)"


def implementation(lesson_id: str) -> tuple[ModuleType, str]:
    """(the module the notebook runs, the line saying which file it is and why)."""
    lesson = find(lesson_id)
    path = learner.mine_file(lesson)
    yours, reference = report.relative(path), report.relative(lesson.solution)

    def fallback(why: str) -> tuple[ModuleType, str]:
        return importlib.import_module(lesson.module("solutions")), (
            f"{lesson.id} runs the REFERENCE {reference}: your {yours} is {why}. "
            f"Once make test L={lesson.id} passes, this notebook runs yours."
        )

    if not path.exists():
        return fallback(f"missing (make reset L={lesson.id} restores the stub)")
    if path.read_text() == stubs.pristine_stub_source(lesson):
        return fallback(NOT_STARTED)
    known = learner.last_grade(lesson)  # grades the file first when it changed since its last grading
    if known["state"] == "not started":  # the same words as for the untouched stub
        return fallback(NOT_STARTED)
    if known["state"] == "failing":
        return fallback(f"failing: {known['status']} (make hint L={lesson.id})")
    if known["state"] != "passing":
        return fallback(f"{known['state']}: {first_line(known.get('message'))}")
    module = stubs.load_from_file(path, f"drills._learner_{lesson.stem}")
    if hashlib.sha256(path.read_bytes()).hexdigest() != known.get("fingerprint"):
        return fallback("changed while it was being graded (run this cell again)")
    return module, f"{lesson.id} runs YOUR {yours}: it passes its grader."


def first_line(text: str | None) -> str:
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else "no message"
