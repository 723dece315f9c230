"""The grading summary at the end of `make test L=...`, and the report the learner tools read.

A check is one test function, named for the mistake it catches; its cases are its parametrizations.
A check passes when none of its cases fails, and is skipped when all of them are skipped on this
machine (bf16 and GPU-only cases under the interpreter). For the first failure the summary gives the
mismatch in words (the first lines of its assertion message, which drills/compare.py writes) and the
explainer section to reread.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from drills import explainer
from drills.lessons import ROOT, Lesson

MESSAGE_LINES = 4  # of a failure's message, in the summary
WIDTH = 110


@dataclass
class Case:
    id: str  # "test_last_page_is_masked[16]"
    check: str  # "test_last_page_is_masked"
    outcome: str  # "passed", "failed" or "skipped"
    message: str = ""  # why it failed, or why it was skipped


def check_name(case_id: str) -> str:
    return case_id.split("[", 1)[0]


def failure_message(excinfo) -> str:
    """The exception in words: an assertion's own message without pytest's rewritten expression, or
    the exception type and text."""
    exc = excinfo.value
    text = str(exc).strip()
    if isinstance(exc, AssertionError):
        lines = text.splitlines()
        own = []
        for line in lines:
            if line.startswith("assert "):
                break
            own.append(line)
        return "\n".join(own).strip() or (lines[0] if lines else "assertion failed")
    if type(exc).__name__ in ("Failed", "Skipped", "XFailed"):  # pytest.fail / pytest.raises' DID NOT RAISE
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def skip_reason(longrepr) -> str:
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@dataclass
class Summary:
    checks: dict[str, list[Case]]  # check name -> its cases, in the order they ran

    @staticmethod
    def status(cases: list[Case]) -> str:
        outcomes = {c.outcome for c in cases}
        if "failed" in outcomes:
            return "fail"
        return "pass" if "passed" in outcomes else "skip"

    def count(self, status: str) -> int:
        return sum(self.status(cases) == status for cases in self.checks.values())

    @property
    def passing(self) -> int:
        return self.count("pass")

    @property
    def total(self) -> int:
        """Checks that ran here (those skipped on this machine are not counted)."""
        return self.count("pass") + self.count("fail")

    @property
    def skipped(self) -> int:
        return self.count("skip")

    @property
    def passed(self) -> bool:
        return self.total > 0 and self.passing == self.total

    def first_failure(self) -> Case | None:
        for cases in self.checks.values():
            for case in cases:
                if case.outcome == "failed":
                    return case
        return None

    def status_line(self) -> str:
        skipped = f", {self.skipped} skipped on this machine" if self.skipped else ""
        if self.passed:
            return f"passing ({self.total} of {self.total} checks{skipped})"
        return f"{self.passing} of {self.total} checks passing{skipped}"


def summarize(cases: list[Case]) -> Summary:
    checks: dict[str, list[Case]] = {}
    for case in cases:
        checks.setdefault(case.check, []).append(case)
    return Summary(checks)


def clip(text: str, width: int = WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def check_lines(summary: Summary) -> list[str]:
    """One line per check: pass / FAIL / skip, its name, and how many of its cases failed or why it
    was skipped."""
    width = max((len(name) for name in summary.checks), default=0)
    lines = []
    for name, cases in summary.checks.items():
        status = summary.status(cases)
        failed = sum(c.outcome == "failed" for c in cases)
        if status == "fail":
            note = f"{failed} of {len(cases)} cases failed" if len(cases) > 1 else ""
        elif status == "skip":
            note = next((c.message for c in cases if c.message), "skipped")
        else:
            skipped = sum(c.outcome == "skipped" for c in cases)
            note = f"{skipped} of {len(cases)} cases skipped here" if skipped else ""
        label = {"pass": "pass", "fail": "FAIL", "skip": "skip"}[status]
        lines.append(clip(f"  {label}  {name:{width}}  {note}".rstrip()))
    return lines


def failure_lines(lesson: Lesson, case: Case) -> list[str]:
    message = [line for line in case.message.splitlines() if line.strip()][:MESSAGE_LINES]
    return ([f"first failure: {case.id}"]
            + [clip("  " + line, 240) for line in message]
            + [f"  reread {explainer.where_taught(lesson, case.check)}"])


def seed_line(seed: int, lesson_id: str | None = None) -> str:
    command = f"SEED=1 make test L={lesson_id}" if lesson_id else "SEED=1 make test L=..."
    if seed == 0:
        return f"seed 0, the default; `{command}` grades other random cases"
    return f"seed {seed}, from SEED; without it the default cases (seed 0) are graded"


def render(lesson: Lesson, cases: list[Case], graded: str, seed: int, detailed: bool = True) -> list[str]:
    """The summary of one lesson: every check when detailed, else one line; then the first failure."""
    summary = summarize(cases)
    lines = []
    if detailed:
        lines.append(f"== {lesson.id} · {lesson.title}: {graded} ==")
        lines += check_lines(summary)
    lines.append(f"{lesson.id}: {summary.status_line()}" + ("" if detailed else f"  [{graded}]"))
    first = summary.first_failure()
    if first is not None:
        lines += failure_lines(lesson, first)
    if detailed:
        lines.append(seed_line(seed, lesson.id))
    return lines


# --- The report a grading run writes for the learner tools (pytest --drills-report=PATH) ----------


def write_report(path: str | Path, lessons: dict[str, dict], seed: int, exitstatus: int) -> None:
    """lessons: stem -> {"cases": [Case, ...], "not_started": str | None, "import_error": str | None}."""
    data = {"seed": seed, "exitstatus": int(exitstatus), "lessons": {
        stem: {**info, "cases": [asdict(c) for c in info.get("cases", [])]} for stem, info in lessons.items()}}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def read_report(path: str | Path) -> dict:
    data = json.loads(Path(path).read_text())
    for info in data["lessons"].values():
        info["cases"] = [Case(**c) for c in info["cases"]]
    return data


def relative(path: str | Path) -> str:
    path = Path(path).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)
