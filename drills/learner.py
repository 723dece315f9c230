"""The learner's commands: make progress, hint, reset, diff, watch and doctor (and the comparison that
`make bench IMPL=mine` prints).

Grading always runs the lesson's grader in a child process, exactly as `make test` does, and reads
the results it writes (`--drills-report`, drills/grading.py). Learner state (which hint comes next,
backups made by reset) lives under .drills/, which git ignores. Two environment variables point the
tools elsewhere, which is how their tests leave the real files alone: DRILLS_MINE_DIR (the folder of
the learner's files, default drills/mine) and DRILLS_STATE_DIR (default .drills).
"""

from __future__ import annotations

import datetime
import difflib
import importlib
import json
import os
import re
import shutil
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from drills import contract, explainer, grading
from drills.grading import run
from drills.lessons import LESSONS, ROOT, Lesson, find

MINE_DIR_ENV = "DRILLS_MINE_DIR"
STATE_DIR_ENV = "DRILLS_STATE_DIR"


def mine_dir() -> Path:
    return Path(os.environ.get(MINE_DIR_ENV) or ROOT / "drills" / "mine").resolve()


def mine_file(lesson: Lesson) -> Path:
    return mine_dir() / f"{lesson.stem}.py"


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV) or ROOT / ".drills").resolve()


rel = grading.relative


# --- Grading the learner's file ------------------------------------------------------------------


Grade = run.Grade


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
    return run.grade(lesson, file=None if default else mine_file(lesson), timeout=timeout)


def load_mine(lesson: Lesson):
    """The learner's module, loaded in this process (for the not-started check and the performance)."""
    return contract.load_from_file(mine_file(lesson), f"drills._learner_{lesson.stem}")


def _untouched(lesson: Lesson) -> bool:
    """The learner's file is the committed stub, byte for byte: not started, nothing to grade. (Checked
    without importing it here: the learner's code only ever runs in the grader's child process.)"""
    path = mine_file(lesson)
    if not path.exists():
        return False
    stub = contract.pristine_stub_source(lesson)
    return stub is not None and path.read_text() == stub


# --- make progress -------------------------------------------------------------------------------


def _workers(on_gpu: bool) -> int:
    # Graders on one GPU run one at a time (some allocate several GB); on a CPU, half the cores.
    return 1 if on_gpu else max(1, min(4, (os.cpu_count() or 2) // 2))


def progress_grades(on_gpu: bool = False) -> list[Grade]:
    started = [lesson for lesson in LESSONS if not _untouched(lesson)]
    with ThreadPoolExecutor(_workers(on_gpu)) as pool:
        graded = dict(zip(started, pool.map(grade, started)))
    return [graded.get(lesson) or Grade(lesson, "not started") for lesson in LESSONS]


def headline(lesson: Lesson, impl) -> tuple[float, str, str] | None:
    """The benchmark's headline for impl (value, unit, label), or None when it declares none."""
    if not lesson.benchmark.exists():
        return None
    module = importlib.import_module(f"drills.benchmarks.{lesson.stem}")
    hook = getattr(module, "headline", None)
    return hook(impl) if hook else None


def performance_line(lesson: Lesson) -> str:
    try:
        mine = headline(lesson, load_mine(lesson))
        if mine is None:
            return f"  {lesson.id:4} n/a (its benchmark has no headline)"
        reference = headline(lesson, importlib.import_module(lesson.module("solutions")))
    except Exception as exc:  # a passing kernel can still fail at benchmark sizes: say so, go on
        return grading.clip(f"  {lesson.id:4} error at benchmark size: {type(exc).__name__}: {exc}")
    (value, unit, label), (ref, _, _) = mine, reference
    return (
        f"  {lesson.id:4} {value:8.1f} {unit:8} reference {ref:8.1f} {unit:8} ({value / ref:.2f}x)  {label}"
    )


def cmd_progress(args) -> int:
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
        print(f"performance on {runtime.gpu_name}, yours beside the reference's, timed now:")
        for g in passing:
            print(performance_line(g.lesson), flush=True)
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
    "crash": "Which tl.load or tl.store can reach past the end of its tensor? Every lane of the last block, "
    "and every padding row, needs a mask.",
    "out_of_bounds": "The summary names the line and the argument: which lanes of that access point past the "
    "tensor, and which mask would switch them off?",
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
        lines = [line.rstrip() for line in section.body.splitlines() if line.strip()][:14]
        steps.append((f"{section.name} of {rel(lesson.explainer)}, its worked example", "\n".join(lines)))
    if not steps and finding.get("evidence"):
        steps.append(("the grader", " ".join(finding["evidence"])))
    return steps


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


def last_grade(lesson: Lesson) -> dict:
    """The outcome of the last grading of the file as it is now (graded again when it changed)."""
    try:
        known = json.loads(_grades_file().read_text()).get(lesson.stem)
    except (FileNotFoundError, ValueError):
        known = None
    if known and known.get("fingerprint") == _fingerprint(lesson):
        return known
    print(f"grading {rel(mine_file(lesson))} first (make test L={lesson.id} does the same)...", flush=True)
    result = grade(lesson)
    remember(result)
    return json.loads(_grades_file().read_text())[lesson.stem]


def cmd_hint(args) -> int:
    """The next hint for the mistake the grader diagnoses in the learner's file as it is now."""
    lesson = find(args.lesson)
    if _untouched(lesson):
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
    shown = 0 if args.restart else int(state.get(key, 0))
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
    for para in text.split("\n"):
        print(
            textwrap.fill(para, width=100, initial_indent="  ", subsequent_indent="  ")
            if para.strip()
            else ""
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


def cmd_reset(args) -> int:
    lesson = find(args.lesson)
    path = mine_file(lesson)
    stub = contract.pristine_stub_source(lesson, committed_only=True)
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


def cmd_diff(args) -> int:
    lesson = find(args.lesson)
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
    print(f"{lesson.id} passes. The reference beside yours: lines with - are the reference's, + yours.")
    sys.stdout.writelines(
        difflib.unified_diff(
            reference.splitlines(keepends=True),
            mine.splitlines(keepends=True),
            fromfile=f"{rel(lesson.solution)} (reference)",
            tofile=f"{rel(mine_file(lesson))} (yours)",
        )
    )
    return 0


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


def watch(
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


def cmd_watch(args) -> int:
    lesson = find(args.lesson)
    try:
        result = watch(lesson, args.interval, args.max_runs, clear=sys.stdout.isatty())
    except KeyboardInterrupt:
        print("\nwatch: stopped")
        return 0
    return 0 if result is not None and result.passed else 1


# --- make doctor ---------------------------------------------------------------------------------


def _version(module_name: str) -> str:
    try:
        return importlib.import_module(module_name).__version__
    except ImportError:
        return "not installed"


def _distribution_version(name: str) -> str:
    """An installed distribution's own version (the jupyter meta-package has no __version__)."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _older(version: str, than: tuple[int, ...]) -> bool:
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[: len(than)])
    return numbers < than


def doctor_lines() -> list[str]:
    import platform

    import torch

    import drills.runtime

    runtime = drills.runtime.current()
    numpy_version, triton_version = _version("numpy"), _version("triton")
    cuda = torch.cuda.is_available()
    lines = [
        f"python  {platform.python_version()} ({sys.executable})",
        f"torch   {torch.__version__} (CUDA build: {torch.version.cuda or 'none'})",
        f"triton  {triton_version}",
        f"numpy   {numpy_version}",
    ]
    capability = None
    if cuda:
        capability = torch.cuda.get_device_capability()
        lines.append(
            f"GPU     {torch.cuda.get_device_name()}, compute capability {capability[0]}.{capability[1]} "
            f"(sm_{capability[0]}{capability[1]}), {torch.cuda.device_count()} visible"
        )
    else:
        lines.append("GPU     none (torch.cuda.is_available() is False)")
    if runtime.interpreter:
        why = "TRITON_INTERPRET=1 is set" if cuda else "there is no CUDA GPU"
        lines.append(
            f"runtime Triton's interpreter on the CPU, because {why}: kernels run as Python, on small shapes"
        )
    else:
        lines.append(f"runtime compiled Triton on {runtime.gpu_name}")
    lines.append(
        f"extras  Jupyter (make notebooks): {_distribution_version('jupyter')} (nbclient "
        f"{_distribution_version('nbclient')}); FlashInfer (a benchmark peer): "
        f"{_version('flashinfer')}"
    )

    traps = [
        (
            "bf16 tl.dot returns garbage in the interpreter (values near 1e10; seen in Triton 3.6 and 3.9)",
            runtime.interpreter,
            "the graders skip bf16 cases on the CPU and say so; try kernels in fp16 or fp32 under the "
            "interpreter and check bf16 on a GPU",
        ),
        (
            "CUDA tensors under the interpreter give all-zero results",
            runtime.interpreter and cuda,
            "create tensors on drills.runtime.current().device (the CPU under the interpreter), or unset "
            "TRITON_INTERPRET to run compiled on this GPU",
        ),
        (
            "fp32 tl.dot runs as TF32 on GPUs (about 1e-3 relative error; the interpreter is exact fp32)",
            cuda and not runtime.interpreter and capability is not None and capability[0] >= 8,
            'pass input_precision="ieee" to tl.dot on fp32 inputs that are compared with an fp32 oracle',
        ),
        (
            "numpy 2.4 or newer breaks Triton 3.6's interpreter (int() of a 1-element array is an error)",
            not _older(numpy_version, (2, 4))
            and numpy_version != "not installed"
            and _older(triton_version, (3, 7)),
            'pip install "numpy<2.4" into this Python (the Makefile\'s .venv pins it)',
        ),
        (
            "tl.dot needs every dimension >= 16 on a GPU, which the interpreter does not check",
            runtime.interpreter,
            "pad small dimensions to 16 (as GROUP_PAD does in L2) before you trust an interpreter pass",
        ),
    ]
    lines.append("known traps:")
    for what, applies, fix in traps:
        lines.append(f"  [{'applies here' if applies else 'not here'}] {what}")
        lines.append(f"      what to do: {fix}")
    return lines


def cmd_doctor(args) -> int:
    print("\n".join(doctor_lines()))
    return 0


# --- make bench IMPL=mine: yours beside the reference -----------------------------------------


def compare_rows(
    lesson: Lesson, columns: list[tuple[str, str]], mine: list[dict], reference: list[dict]
) -> list[str]:
    """One line per benchmark row: the lesson's own columns (keys starting with its id, else every
    number), yours and the reference's, matched by position (both ran the same shape list)."""
    headers = dict(columns)
    keys = [k for k, _ in columns if k.startswith(f"{lesson.id}_")]
    lines = []
    for mine_row, ref_row in zip(mine, reference):
        label_keys = []
        for key, _ in columns:
            if isinstance(mine_row.get(key), float):
                break
            label_keys.append(key)
        label = ", ".join(f"{headers[k]} {mine_row.get(k)}" for k in label_keys[:3])
        shown = keys or [k for k, _ in columns if isinstance(mine_row.get(k), float)]
        parts = []
        for key in shown:
            yours, ref = mine_row.get(key), ref_row.get(key)
            if isinstance(yours, (int, float)) and isinstance(ref, (int, float)):
                parts.append(f"{headers[key]} {_number(yours)} (reference {_number(ref)})")
        lines.append(f"  {label}: " + "; ".join(parts))
    return lines


def _number(value: float) -> str:
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.0f}"


def reference_rows(lesson: Lesson, module) -> tuple[list[dict], str]:
    """The reference's rows: the committed JSON when it was measured on this GPU, else timed now."""
    import torch

    path = lesson.explainer.parent / f"{lesson.stem}.bench.json"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    if path.exists() and gpu is not None:  # a CPU-only lesson's JSON may come from another CPU: time it now
        data = json.loads(path.read_text())
        if data.get("meta", {}).get("gpu") == gpu:
            return data["rows"], f"the committed {rel(path)} (measured {data['meta'].get('date')} on {gpu})"
    print(f"== {lesson.id}: the reference, timed in this run for comparison ==", flush=True)
    table, _ = module.run(importlib.import_module(lesson.module("solutions")))
    return table.rows, "the reference timed in this run"


def print_bench_comparison(lesson: Lesson, module, table) -> None:
    rows, source = reference_rows(lesson, module)
    print(
        f"== {lesson.id}: yours beside the reference ({source}); the ceiling columns above are this run's =="
    )
    print("\n".join(compare_rows(lesson, module.COLUMNS, table.rows, rows)))
