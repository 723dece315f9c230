"""The learner's commands: make progress, hint, reset, diff and watch (make doctor is drills/doctor.py;
the comparison of the learner's numbers with the reference's, drills/bench.py). Each command is a
function taking its arguments (`hint(lesson, restart=True)`) and returning the exit status; the
argparse wiring lives in drills/__main__.py.

Grading always runs the lesson's grader in a child process, exactly as `make test` does, and reads
the results it writes (`--drills-report`, drills/report.py). Learner state (which hint comes next,
backups made by reset) lives under .drills/, which git ignores. Two environment variables point the
tools elsewhere, which is how their tests leave the real files alone: DRILLS_MINE_DIR (the folder of
the learner's files, default drills/mine) and DRILLS_STATE_DIR (default .drills).
"""

from __future__ import annotations

import datetime
import difflib
import json
import os
import re
import shutil
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from drills import explainer, stubs
from drills.grading.grader import pytest_run, report
from drills.lessons import LESSONS, ROOT, Lesson

MINE_DIR_ENV = "DRILLS_MINE_DIR"
STATE_DIR_ENV = "DRILLS_STATE_DIR"


def mine_dir() -> Path:
    return Path(os.environ.get(MINE_DIR_ENV) or ROOT / "drills" / "mine").resolve()


def mine_file(lesson: Lesson) -> Path:
    return mine_dir() / f"{lesson.stem}.py"


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or ROOT / ".drills").resolve()


rel = report.relative


# --- Grading the learner's file ------------------------------------------------------------------


Grade = pytest_run.Grade


def grade(lesson: Lesson, timeout: float | None = None) -> Grade:
    """Grade the learner's file for a lesson (drills/mine, or DRILLS_MINE_DIR) in a child process."""
    default = mine_dir() == (ROOT / "drills" / "mine").resolve()
    if not mine_file(lesson).exists():
        return Grade(
            lesson,
            "missing",
            graded=rel(mine_file(lesson)),
            message=f"{rel(mine_file(lesson))} does not exist: make reset L={lesson.id} restores the stub",
        )
    return pytest_run.grade(lesson, file=None if default else mine_file(lesson), timeout=timeout)


def load_mine(lesson: Lesson):
    """The learner's module, loaded in this process (for the not-started check and the performance)."""
    return stubs.load_from_file(mine_file(lesson), f"drills._learner_{lesson.stem}")


def is_untouched_stub(lesson: Lesson) -> bool:
    """The learner's file is the committed stub, byte for byte: not started, nothing to grade. (Checked
    without importing it here: the learner's code only ever runs in the grader's child process.)"""
    path = mine_file(lesson)
    if not path.exists():
        return False
    stub = stubs.pristine_stub_source(lesson)
    return stub is not None and path.read_text() == stub


# --- make progress -------------------------------------------------------------------------------


def _workers(on_gpu: bool) -> int:
    # Graders on one GPU run one at a time (some allocate several GB); on a CPU, half the cores.
    return 1 if on_gpu else max(1, min(4, (os.cpu_count() or 2) // 2))


def progress_grades(on_gpu: bool = False) -> list[Grade]:
    started = [lesson for lesson in LESSONS if not is_untouched_stub(lesson)]
    with ThreadPoolExecutor(_workers(on_gpu)) as pool:
        graded = dict(zip(started, pool.map(grade, started)))
    return [
        graded.get(lesson) or Grade(lesson, "not started", stages=report.lesson_stages(lesson))
        for lesson in LESSONS
    ]


def progress() -> int:
    """make progress: every lesson's status for the learner's files, on a GPU the performance of each
    passing one beside the reference's, and the next lesson to take."""
    import drills.runtime

    runtime = drills.runtime.current()
    print(runtime.banner, flush=True)
    print(f"grading your files in {rel(mine_dir())} (untouched stubs are not graded)...", flush=True)
    grades = progress_grades(on_gpu=not runtime.interpreter)
    width = max(len(lesson.title) for lesson in LESSONS)
    print(f"{'id':4} {'track':5} {'lesson':{width}}  status")
    for g in grades:
        print(f"{g.lesson.id:4} {g.lesson.track:5} {g.lesson.title:{width}}  {g.status}")
    passing = [g for g in grades if g.passed]
    if runtime.interpreter:
        print(
            "performance: needs a CUDA GPU (none here); on a GPU, make progress shows your GB/s or "
            "TFLOP/s beside the reference's for every passing lesson"
        )
    elif passing:
        from drills import bench  # torch: only on a GPU, where there is something to time

        print(f"performance on {runtime.gpu_name}, yours beside the reference's, timed now:")
        for g in passing:
            print(bench.performance_line(g.lesson, lambda lesson=g.lesson: load_mine(lesson)), flush=True)
    print(next_lesson_line(grades))
    return 0


def next_lesson_line(grades: list[Grade]) -> str:
    todo = next((g for g in grades if not g.passed), None)
    if todo is None:
        return (
            "next: nothing left, every lesson passes. make diff L=<id> shows yours beside the reference; "
            "on a GPU, make bench L=<id> IMPL=mine times yours"
        )
    lesson = todo.lesson
    if todo.state == "not started":
        return (
            f"next: {lesson.id} ({lesson.title}): read {rel(lesson.explainer)}, fill in "
            f"{rel(mine_file(lesson))}, grade it with make test L={lesson.id}"
        )
    return f"next: {lesson.id} ({lesson.title}), {todo.status}: make test L={lesson.id}; make hint L={lesson.id} for a hint"


# --- make hint -----------------------------------------------------------------------------------

_DEF = re.compile(r"^(\s*)(?:def|class)\s+(\w+)")


def todo_hints(source: str) -> list[str]:
    """Each `# TODO(...)` comment of the stub, with its continuation lines and where it sits."""
    hints, current, owner, where = [], None, None, None
    for line in source.splitlines():
        found = _DEF.match(line)
        if found:
            indent, name = found.groups()
            if not indent:
                owner = name if line.lstrip().startswith("class") else None
                where = name
            elif owner and line.lstrip().startswith("def"):
                where = f"{owner}.{name}"
        stripped = line.strip()
        if stripped.startswith("# TODO("):
            current = [stripped[2:]]
            hints.append((where, current))
        elif current is not None and stripped.startswith("#"):
            current.append(stripped.lstrip("#").strip())
        else:
            current = None
    return [f"in {where}: " + " ".join(lines) if where else " ".join(lines) for where, lines in hints]


def _plain(text: str) -> str:
    return re.sub(r"(?<![\w*])\*(\S.*?\S)\*(?![\w*])", r"\1", text.replace("**", ""))  # no markdown emphasis


# What to ask first about a failure no pitfall of the lesson explains, by the kind the grader reported.
GENERIC_QUESTIONS = {
    "dtype": "Only the bf16 cases fail: where does your code name a dtype (tl.float16, torch.float16) "
    "instead of taking it from a tensor (v.dtype, out_ptr.dtype.element_ty)?",
    "crash": "Which tl.load or tl.store can reach past the end of its tensor? Every lane of the last block, "
    "and every padding row, needs a mask.",
    "out_of_bounds": "The summary names the line and the argument: which lanes of that access point past the "
    "tensor, and which mask would switch them off?",
    "grid_too_large": "Which dimension of the problem sets the grid axis the summary names, and how large can it "
    "get? Axes 1 and 2 stop at 65535 programs: the large dimension belongs on axis 0.",
    "write_race": "Could two programs store to the same element? Which rows does each program own, and does "
    "its store mask keep it to them?",
    "not_from_kernel": "Where is the result computed? It must come out of your @triton.jit kernel, launched by "
    "the function the grader calls.",
    "timeout": "Does every loop of your kernel end? Check the loop bound and the step, and what happens when a "
    "length is 0 or 1.",
    "exception": "Read the line the summary names: what does the error say about the values on that line?",
}


def hint_steps(lesson: Lesson, finding: dict) -> list[tuple[str, str]]:
    """The hints for one diagnosed mistake, gentlest first: a question that points at it, then the pitfall
    (which names its section), then the lines of the explainer's worked example it concerns."""
    steps = []
    number = finding.get("pitfall") or 0
    question = finding.get("question") or GENERIC_QUESTIONS.get(finding.get("kind"), "")
    if question:
        steps.append(("a question", question))
    pitfall = next((p for p in explainer.pitfalls(lesson) if p.number == number), None)
    if pitfall is not None:
        steps.append((f"{pitfall.name} of {rel(lesson.explainer)}", _plain(pitfall.text)))
    section = next((sec for sec in explainer.sections(lesson) if sec.number == finding.get("section")), None)
    if section is not None:
        steps.append(
            (f"{section.name} of {rel(lesson.explainer)}, its worked example", _opening_blocks(section.body))
        )
    if not steps and finding.get("evidence"):
        steps.append(("the grader", " ".join(finding["evidence"])))
    return steps


def _blocks(body: str) -> list[list[str]]:
    """The body of a section as blocks: paragraphs, tables, lists and fenced code, each a list of lines."""
    blocks, current, fenced = [], [], False
    for line in body.splitlines():
        if line.strip().startswith("```"):
            current.append(line.rstrip())
            fenced = not fenced
            if not fenced:
                blocks.append(current)
                current = []
            continue
        if not fenced and not line.strip():
            if current:
                blocks.append(current)
            current = []
            continue
        current.append(line.rstrip())
    if current:
        blocks.append(current)
    return blocks


def _opening_blocks(body: str, lines: int = 14) -> str:
    """The first whole blocks of a section, about `lines` long, never cut inside a block, and never
    ending on a sentence that announces what follows (one ending in ':'): its table or code comes too."""
    out: list[str] = []
    for block in _blocks(body):
        if out and len(out) >= lines and not out[-1].rstrip().endswith(":"):
            break
        if out:
            out.append("")
        out += block
    return "\n".join(out)


def _verbatim(block: list[str]) -> bool:
    """Tables, fenced code, lists and indented lines keep their own line breaks."""
    first = block[0].lstrip()
    return (
        first.startswith(("|", "```", "- ", "* ", "    "))
        or first[:2].rstrip(".").isdigit()
        or block[0].startswith("  ")
    )


def _hint_state() -> Path:
    return state_dir() / "hints.json"


def _read_hint_state() -> dict:
    try:
        return json.loads(_hint_state().read_text())
    except (FileNotFoundError, ValueError):
        return {}


def _fingerprint(lesson: Lesson) -> str:
    import hashlib

    path = mine_file(lesson)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else ""


def _grades_file() -> Path:
    return state_dir() / "last-grades.json"


def remember(result: Grade) -> None:
    """Keep a grading's outcome, so `make hint` on an unchanged file does not grade it again."""
    try:
        data = json.loads(_grades_file().read_text())
    except (FileNotFoundError, ValueError):
        data = {}
    data[result.lesson.stem] = {
        "fingerprint": _fingerprint(result.lesson),
        "state": result.state,
        "findings": result.findings,
        "message": result.message,
        "status": result.status,
    }
    _grades_file().parent.mkdir(parents=True, exist_ok=True)
    _grades_file().write_text(json.dumps(data, indent=1) + "\n")


def known_grade(lesson: Lesson) -> dict | None:
    """The outcome of the last grading when it graded the file as it is now, else None (never grades)."""
    try:
        known = json.loads(_grades_file().read_text()).get(lesson.stem)
    except (FileNotFoundError, ValueError):
        known = None
    if known and known.get("fingerprint") == _fingerprint(lesson):
        return known
    return None


def last_grade(lesson: Lesson) -> dict:
    """The outcome of the last grading of the file as it is now (graded again when it changed)."""
    known = known_grade(lesson)
    if known:
        return known
    print(f"grading {rel(mine_file(lesson))} first (make test L={lesson.id} does the same)...", flush=True)
    result = grade(lesson)
    remember(result)
    return json.loads(_grades_file().read_text())[lesson.stem]


def hint(lesson: Lesson, restart: bool = False) -> int:
    """make hint: the next hint for the mistake the grader diagnoses in the learner's file as it is now;
    restart starts again from the first hint."""
    if is_untouched_stub(lesson):
        print(
            f"{lesson.id} is not started: read {rel(lesson.explainer)} and fill in the TODOs of "
            f"{rel(mine_file(lesson))} in order (each names the section that teaches it); once a check "
            f"fails, make hint L={lesson.id} follows what went wrong"
        )
        return 0
    known = last_grade(lesson)
    if known["state"] == "passing":
        print(f"{lesson.id} passes: no hint needed. make diff L={lesson.id} shows yours beside the reference")
        return 0
    findings = known.get("findings") or []
    if not findings:
        print(f"{lesson.id}: {known['status']}. {known.get('message') or ''}".strip())
        print(f"make test L={lesson.id} shows the whole grading")
        return 0
    finding = findings[0]
    key = f"{lesson.stem}:{finding.get('pitfall') or finding.get('kind')}"
    steps = hint_steps(lesson, finding)
    state = _read_hint_state()
    shown = 0 if restart else int(state.get(key, 0))
    what = (
        f'pitfall {finding["pitfall"]} "{finding.get("title")}"'
        if finding.get("pitfall")
        else finding.get("title")
    )
    if shown >= len(steps):
        print(
            f"no more hints for {what}: all {len(steps)} shown. make hint L={lesson.id} RESTART=1 starts over; "
            f"{rel(lesson.explainer)} has the whole story"
        )
        return 0
    source, text = steps[shown]
    print(
        f"hint {shown + 1} of {len(steps)} for {lesson.id}, about the likely mistake ({what}), from {source}:"
    )
    for i, block in enumerate(_blocks(text)):
        if i:
            print("")
        if _verbatim(block):
            print("\n".join("  " + line for line in block))
        else:  # one paragraph, filled as a whole: its sentences are never broken at the file's line ends
            print(
                textwrap.fill(
                    " ".join(line.strip() for line in block),
                    width=100,
                    initial_indent="  ",
                    subsequent_indent="  ",
                )
            )
    state[key] = shown + 1
    _hint_state().parent.mkdir(parents=True, exist_ok=True)
    _hint_state().write_text(json.dumps(state, indent=1) + "\n")
    left = len(steps) - shown - 1
    print(f"({left} more: make hint L={lesson.id})" if left else "(that was the last one for this mistake)")
    return 0


# --- make reset ----------------------------------------------------------------------------------


def backup(path: Path, stem: str) -> Path:
    """Copy path to .drills/backups/<stem>-<timestamp>.py (never over an earlier backup)."""
    folder = state_dir() / "backups"
    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    target, n = folder / f"{stem}-{stamp}.py", 1
    while target.exists():
        n += 1
        target = folder / f"{stem}-{stamp}-{n}.py"
    shutil.copy2(path, target)
    if target.read_bytes() != path.read_bytes():
        raise SystemExit(f"reset: the backup {target} does not match {path}; nothing was restored")
    return target


def reset(lesson: Lesson) -> int:
    """make reset: back the learner's file up under .drills/backups, then restore the committed stub."""
    path = mine_file(lesson)
    stub = stubs.pristine_stub_source(lesson, committed_only=True)
    if stub is None:
        print(
            f"reset: cannot read the committed stub of {lesson.id} (git show HEAD:{rel(lesson.stub)} failed; "
            "is this a git clone?); nothing was changed"
        )
        return 1
    if path.exists() and path.read_text() == stub:
        print(f"{rel(path)} is already the untouched stub: nothing to back up or restore")
        return 0
    saved = backup(path, lesson.stem) if path.exists() else None
    path.write_text(stub)
    if saved:
        print(f"your {rel(path)} is saved as {rel(saved)}; to get it back: cp {rel(saved)} {rel(path)}")
    print(f"{rel(path)} is the stub again, as committed; make test L={lesson.id} now says not started")
    return 0


# --- make diff -----------------------------------------------------------------------------------


def diff(lesson: Lesson) -> int:
    """make diff: once the learner's file passes, the reference beside it."""
    result = grade(lesson)
    if not result.passed:
        print(
            f"{lesson.id} must pass first ({result.status} now): make test L={lesson.id} says what fails. "
            "The reference is shown once your own kernel passes."
        )
        return 1
    mine, reference = mine_file(lesson).read_text(), lesson.solution.read_text()
    if mine == reference:
        print(f"{lesson.id} passes, and {rel(mine_file(lesson))} is identical to {rel(lesson.solution)}")
        return 0
    stub = stubs.pristine_stub_source(lesson, committed_only=True)  # never the learner's own file
    mine_lines, hidden = without_stub_comments(mine, stub, reference)
    print(f"{lesson.id} passes. The reference beside yours: lines with - are the reference's, + yours.")
    if hidden:
        print(
            f"({hidden} comment lines of the stub that you kept, its TODOs, are left out: they are not yours, "
            "and the reference has its own comments there.)"
        )
    sys.stdout.writelines(
        difflib.unified_diff(
            reference.splitlines(keepends=True),
            mine_lines,
            fromfile=f"{rel(lesson.solution)} (reference)",
            tofile=f"{rel(mine_file(lesson))} (yours)",
        )
    )
    return 0


def without_stub_comments(mine: str, stub: str | None, reference: str) -> tuple[list[str], int]:
    """The learner's lines without the comment lines that came with the stub and that the reference
    does not have (the TODOs, kept or half-kept): those are not the learner's lines, and in a diff they
    would stand as "+ yours" beside every hole the learner filled. A comment line the learner wrote, or
    one the reference has too, stays. Returns (lines, how many were left out)."""
    if stub is None:
        return mine.splitlines(keepends=True), 0
    comment = lambda line: line.lstrip().startswith("#")  # noqa: E731
    stub_only = {line.strip() for line in stub.splitlines() if comment(line)} - {
        line.strip() for line in reference.splitlines() if comment(line)
    }
    kept = [
        line for line in mine.splitlines(keepends=True) if not (comment(line) and line.strip() in stub_only)
    ]
    return kept, len(mine.splitlines()) - len(kept)


# --- make watch ----------------------------------------------------------------------------------


def screen(result: Grade) -> list[str]:
    """The one screen `make watch` prints after each grading: the same as `make test`'s, stamped."""
    now = datetime.datetime.now().strftime("%H:%M:%S")
    return [f"[{now}]"] + result.screen()


def _stamp(path: Path):
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def regrade_on_save(
    lesson: Lesson, interval: float = 1.0, max_runs: int | None = None, clear: bool = False
) -> Grade | None:
    """Grade now and after every save of the learner's file; stop after max_runs gradings (None: never)."""
    path, last, runs, result = mine_file(lesson), object(), 0, None
    while max_runs is None or runs < max_runs:
        stamp = _stamp(path)
        if stamp != last:
            last = stamp
            if clear:
                print("\033[2J\033[H", end="")
            print(f"watching {rel(path)}: each save re-grades {lesson.id} (Ctrl-C stops)", flush=True)
            result = grade(lesson)
            print("\n".join(screen(result)), flush=True)
            runs += 1
            continue
        time.sleep(interval)
    return result


def watch(lesson: Lesson, interval: float = 1.0, max_runs: int | None = None) -> int:
    """make watch: grade now and after every save until Ctrl-C (or max_runs gradings); the exit status
    is the last grading's."""
    try:
        result = regrade_on_save(lesson, interval, max_runs, clear=sys.stdout.isatty())
    except KeyboardInterrupt:
        print("\nwatch: stopped")
        return 0
    return 0 if result is not None and result.passed else 1
