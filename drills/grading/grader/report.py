"""The grading summary at the end of `make test L=...`, and the report the learner tools read.

A check is one test function, named for the mistake it catches; its cases are its parametrizations.
A check passes when none of its cases fails, and is skipped when all of them are skipped on this
machine (bf16 and GPU-only cases under the interpreter). For the first failure the summary gives the
mismatch in words (the first lines of its assertion message, which drills/compare.py writes) and the
explainer section to reread.
"""

from __future__ import annotations

import json
import re
import textwrap
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
    where = getattr(
        exc, "drills_where", None
    )  # raised in the learner's code (drills/grading/grader/learner_client.py)
    if where and "your code raised" not in text:
        return (
            f"your code raised {type(exc).__name__} at {where} (`{getattr(exc, 'drills_code', '')}`): {text}"
        )
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


# --- Stages: a steep lesson's checks in the order its stub's TODOs are filled in ------------------


@dataclass(frozen=True)
class Stage:
    """One step of a staged lesson (a grader's module-level `STAGES`): the checks that pass once the
    TODOs of that step are done. patterns name cases as a Mistake's do (drills/grading/grader/diagnose.py): an
    exact case id, a check's name (all its cases), or an fnmatch wildcard ("*noncausal*")."""

    title: str  # "non-causal"
    patterns: tuple[str, ...]
    checks: str = ""  # what the stage checks, in a few words

    def __post_init__(self):
        if isinstance(self.patterns, str):  # a lone string is one pattern, not a tuple of characters
            object.__setattr__(self, "patterns", (self.patterns,))


def case_matches(case_id: str, pattern: str) -> bool:
    """A case id against a pattern: the exact id, or the check's name (all its cases), with * and ? as
    wildcards. Brackets are literal: "test_x[n1]" names that one case, not a character class."""
    check = case_id.split("[", 1)[0]
    regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
    return re.fullmatch(regex, case_id) is not None or (
        "[" not in pattern and re.fullmatch(regex, check) is not None
    )


def stage_of(case_id: str, stages: list[Stage]) -> int:
    """The index of the stage a case belongs to: the most specific pattern naming it wins (its exact
    id, then its check's name, then a wildcard), the earlier stage on a tie; a case no pattern names
    belongs to the last stage, so that every stage passed means every check passed."""
    check = check_name(case_id)
    for rank in (
        lambda p: p == case_id,
        lambda p: p == check,
        lambda p: ("*" in p or "?" in p) and case_matches(case_id, p),
    ):
        for i, stage in enumerate(stages):
            if any(rank(p) for p in stage.patterns):
                return i
    return len(stages) - 1


def stages_reached(cases: list[Case], stages: list[Stage]) -> list[str]:
    """Each stage's state given the cases that ran: "passed" (no case failed and one passed, or all
    were skipped on this machine), "failing", or "not graded" (none of its cases ran)."""
    outcomes: list[set] = [set() for _ in stages]
    for case in cases:
        outcomes[stage_of(case.id, stages)].add(case.outcome)
    return ["failing" if "failed" in o else "passed" if o else "not graded" for o in outcomes]


def current_stage(cases: list[Case], stages: list[Stage]) -> int | None:
    """The index of the first stage not passed yet (the one the learner is in); None once all pass."""
    return next((i for i, s in enumerate(stages_reached(cases, stages)) if s != "passed"), None)


def _named(i: int, stages: list[Stage]) -> str:
    return f"{i + 1} {stages[i].title}"


def stage_line(cases: list[Case], stages: list[Stage], started: bool = True) -> str | None:
    """Which stage the learner is in and which passed before it: "Stage 2 of 3: causal (stage 1
    non-causal passed)". None for a lesson without stages."""
    if not stages:
        return None
    n = len(stages)
    now = current_stage(cases, stages) if started else 0
    if now is None:
        return f"all {n} stages passed: " + ", ".join(_named(i, stages) for i in range(n))
    if not started:
        return f"Stage 1 of {n}: {stages[0].title}, not started"
    done = [_named(i, stages) for i in range(now)]
    if not done:
        return f"Stage 1 of {n}: {stages[0].title}"
    passed = f"stage {done[0]}" if len(done) == 1 else f"stages {', '.join(done[:-1])} and {done[-1]}"
    return f"Stage {now + 1} of {n}: {stages[now].title} ({passed} passed)"


def stage_lines(cases: list[Case], stages: list[Stage], started: bool = True) -> list[str]:
    """The summary's stage lines: stage_line, then what the current stage checks and what the next."""
    head = stage_line(cases, stages, started)
    if head is None:
        return []
    now = current_stage(cases, stages) if started else 0
    if now is None:
        return [head]
    lines = [head]
    if stages[now].checks:
        lines.append(clip(f"  stage {now + 1} checks {stages[now].checks}", 240))
    if now + 1 < len(stages):
        nxt = stages[now + 1]
        lines.append(
            clip(f"  next, stage {_named(now + 1, stages)}" + (f": {nxt.checks}" if nxt.checks else ""), 240)
        )
    return lines


def summarize(cases: list[Case]) -> Summary:
    checks: dict[str, list[Case]] = {}
    for case in cases:
        checks.setdefault(case.check, []).append(case)
    return Summary(checks)


def clip(text: str, width: int = WIDTH) -> str:
    """text cut to width, at a space: a line cut mid-word reads as a different word ("computed a len...")."""
    if len(text) <= width:
        return text
    cut = text[: width - 3]
    space = cut.rstrip().rfind(" ")
    if space > len(cut) - len(cut.lstrip()) + width // 2:  # a space in the second half of the line
        cut = cut[:space]
    return cut.rstrip(" ,;:(") + "..."


# A grader's premise that the learner's code decides (a request preempted, two sequences sharing a block)
# is the learner's to fix: the grader's "grader bug" wording for it is not shown as blame on the grader.
_GRADER_BUG = re.compile(r"\s*\(grader bug\??\)|grader bug\??:\s*|\s*\(grader bug:[^)]*\)", re.IGNORECASE)


def learner_words(line: str) -> str:
    """A failure line as the learner reads it: the grader's own "grader bug" wording taken out."""
    if not _GRADER_BUG.search(line):
        return line
    line = _GRADER_BUG.sub(" ", line).strip()
    return f"the check's scenario did not happen with your code: {line}"


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
        line = f"  {label}  {name:{width}}  {note}".rstrip()
        if status == "skip" and len(line) > WIDTH:  # a skip's reason is read whole, on lines of its own
            lines.append(f"  {label}  {name}")
            lines += textwrap.wrap(note, WIDTH, initial_indent="        ", subsequent_indent="        ")
        else:
            lines.append(clip(line))
    return lines


def failure_lines(lesson: Lesson, case: Case) -> list[str]:
    message = [learner_words(line) for line in case.message.splitlines() if line.strip()][:MESSAGE_LINES]
    return (
        [f"first failure: {case.id}"]
        + [clip("  " + line, 240) for line in message]
        + [f"  reread {explainer.where_taught(lesson, case.check)}"]
    )


# What to do about a failure that no pitfall of the lesson explains, by the kind the grader reported.
GENERIC_TODO = {
    "not_from_kernel": "compute the result inside your @triton.jit kernel and launch it from the function "
    "graded; torch may allocate and check, not compute",
    "crash": "the line that crashed is not known: look for a tl.load or tl.store without a mask, or a pointer "
    "built from an index that can run past the tensor",
    "timeout": "look for a loop whose bound or step never lets it end",
    "signature": "keep each function's signature as your file's stub gave it (its parameters' names, order "
    "and defaults): the grader calls it as the docstring says, and the quoted line names what did not fit",
    "recursion": "the quoted line is in a function that calls itself, directly or through another: a "
    "launcher calls its kernel and the helpers below it, never itself or the function that called it",
    "refused_valid": "that case is valid: read the argument's rule in the function's docstring (or the "
    "explainer's API box) and loosen the check that raised, which the quoted line shows",
    "nan": "give every masked tl.load an other= the math can absorb (-inf before a max, 0 before a sum), "
    "take every exponential as exp(x - max), and store every element of the output",
    "not_written": "write it (its TODOs name the sections to read) and delete its `raise NotImplementedError` line",
    "not_refused": "that input is bad on purpose: check the argument before any torch op or launch, and raise "
    "ValueError or TypeError naming it (the function's docstring says what it admits)",
    "returned": "return exactly what the function's docstring says, in its order (out, or (out, lse) with "
    "return_lse=True), with out allocated in the inputs' dtype: the line above names what differs",
    "stopped": "remove the sys.exit (or the raise of a BaseException) the quoted line shows: a check ends when "
    "your function returns, and bad input raises ValueError or TypeError",
    "dtype": "cast with the tensors' own dtype (p.to(v.dtype), out.to(out_ptr.dtype.element_ty)); a "
    "tl.float16 written into a kernel is right for fp16 inputs only",
}


def finding_lines(lesson: Lesson, findings: list[dict], cases: list[Case]) -> list[str]:
    """The diagnosis: the most likely mistake, its evidence, what to reread; a second one if possible."""
    if not findings:
        first = summarize(cases).first_failure()
        return failure_lines(lesson, first) if first is not None else []
    lines = []
    for i, f in enumerate(findings):
        lead = "likely mistake" if i == 0 else "or else"
        if f["pitfall"]:
            what = f"pitfall {f['pitfall']}" + (f' "{f["title"]}"' if f["title"] else "")
            sure = "" if f["consistent"] else " (the closest match to what failed)"
            lines.append(f"{lead}: {what}{sure}")
        else:
            lines.append(f"{lead}: {f['title'] or 'a check failed that no pitfall of this lesson explains'}")
        if i == 0:
            lines += [clip("  " + learner_words(e), 240) for e in f["evidence"][:3]]
        where = explainer.where_pitfall(lesson, f["pitfall"]) if f["pitfall"] else None
        todo = GENERIC_TODO.get(f.get("kind", "")) if not f["pitfall"] else None
        if todo:
            lines.append(f"  {todo}")
            continue
        if where is None and f["evidence"]:
            check = f["evidence"][0].split(" ", 1)[0].split("[", 1)[0]
            where = explainer.where_taught(lesson, check)
        if where:
            lines.append(f"  reread {where}")
    if findings[0]["pitfall"]:
        lines.append(f"stuck? make hint L={lesson.id} asks a question that leads to it")
    return lines


def random_cases_line(shift: int, lesson_id: str | None = None) -> str:
    """The closing line of a grade: which random cases ran. shift is SEED, added to every test's stream."""
    command = f"SEED=1 make test L={lesson_id}" if lesson_id else "SEED=1 make test L=..."
    if shift == 0:
        return f"SEED=0, the default; `{command}` grades other random cases"
    return f"SEED={shift}; without it the default cases (SEED=0) are graded"


def render(
    lesson: Lesson,
    cases: list[Case],
    graded: str,
    shift: int,
    detailed: bool = True,
    findings: list[dict] | None = None,
    stages: list[Stage] = (),
) -> list[str]:
    """The summary of one lesson: every check when detailed, else one line; the stage the learner is
    in, for a staged lesson; then the diagnosis."""
    summary = summarize(cases)
    lines = []
    if detailed:
        lines.append(f"== {lesson.id} · {lesson.title}: {graded} ==")
        lines += check_lines(summary)
    lines.append(f"{lesson.id}: {summary.status_line()}" + ("" if detailed else f"  [{graded}]"))
    if stages and not summary.passed:
        lines += stage_lines(cases, list(stages)) if detailed else [f"  {stage_line(cases, list(stages))}"]
    if summary.first_failure() is not None:
        lines += finding_lines(lesson, findings or [], cases)
    elif detailed and summary.passed:
        lines.append(f"every check passes: make diff L={lesson.id} shows yours beside the reference")
    if detailed:
        lines.append(random_cases_line(shift, lesson.id))
    return lines


# --- The report a grading run writes for the learner tools (pytest --drills-report=PATH) ----------


# The report's keys, written by the grader (drills/grading/grader/plugin.py) and read by the learner tools.
REPORT_SHIFT, REPORT_EXIT, REPORT_LESSONS = "shift", "exitstatus", "lessons"
CASES, FINDINGS, NOT_STARTED, IMPORT_ERROR = "cases", "findings", "not_started", "import_error"
STAGES = "stages"  # a staged lesson's Stage list, as dicts (absent for a lesson without stages)


def report_text(lessons: dict[str, dict], shift: int, exitstatus: int) -> str:
    """The report as JSON. lessons: stem -> {CASES: [Case, ...], FINDINGS: [dict], NOT_STARTED: str | None,
    IMPORT_ERROR: str | None, STAGES: [Stage, ...] (staged lessons only)}."""
    data = {
        REPORT_SHIFT: shift,
        REPORT_EXIT: int(exitstatus),
        REPORT_LESSONS: {
            stem: {
                **info,
                CASES: [asdict(c) for c in info.get(CASES, [])],
                **({STAGES: [asdict(st) for st in info[STAGES]]} if info.get(STAGES) else {}),
            }
            for stem, info in lessons.items()
        },
    }
    return json.dumps(data, indent=1) + "\n"


def parse_report(text: str) -> dict:
    """The report from its JSON; ValueError when it is not one whole report (see report_channel.py)."""
    data = json.loads(text)
    for info in data[REPORT_LESSONS].values():
        info[CASES] = [Case(**c) for c in info.get(CASES, [])]
        info.setdefault(FINDINGS, [])
        info[STAGES] = [
            Stage(st["title"], tuple(st["patterns"]), st.get("checks", "")) for st in info.get(STAGES, [])
        ]
    return data


def finding_dict(finding) -> dict:
    """A diagnose.Finding as the report stores it."""
    m = finding.mistake
    return {
        "pitfall": finding.pitfall,
        "title": finding.title,
        "evidence": list(finding.evidence),
        "consistent": finding.consistent,
        "kind": finding.kind,
        "question": m.question if m else "",
        "section": m.section if m else "",
    }


def relative(path: str | Path) -> str:
    path = Path(path).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def lesson_stages(lesson: Lesson) -> list[Stage]:
    """A lesson's stages, read from its grader's module-level STAGES (empty for a lesson without)."""
    import importlib

    return list(getattr(importlib.import_module(f"drills.tests.{lesson.tests.stem}"), "STAGES", []))
