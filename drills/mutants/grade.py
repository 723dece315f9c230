"""Grading the mutants: each mutated solution is graded as `make test` grades a learner's file, and
must fail its grader and be diagnosed as its own pitfall (`make mutants`, and `make check`)."""

from __future__ import annotations

import json
from pathlib import Path


def grade_mutants(lesson_id: str | None = None, gpu_only: bool = False, full: bool = False) -> int:
    """Grade every declared mutant of each lesson's solution: each must fail its grader AND be diagnosed
    as its own pitfall (the summary a learner with that mistake would read names it first). GPU-only
    mutants run only on a GPU; with gpu_only (make check on a GPU) only those run.

    Each mutant is graded as `make test` grades a learner's file. On the CPU the gradings are forked
    from one warm process (drills/grading/grader/fork_server.py: no second of imports per grading), and those
    of all lessons share the cores, printed lesson by lesson.

    There, each mutant runs only the checks that can see it (drills/grading/grader/selection.py: the others
    execute exactly the reference's code and keep its verdict), and one mutant per lesson is also graded
    in full, its verdict and named pitfall compared with the selected run's (every mutant with full,
    `make mutants FULL=1`): a selection that changed a verdict is a failure of make mutants."""
    import contextlib
    import tempfile
    import time
    from concurrent.futures import ThreadPoolExecutor

    import drills.runtime
    from drills.grading.grader import fork_server
    from drills.lessons import LESSONS, find
    from drills.mutants import load_mutants, mutate, pitfall_mismatches

    on_gpu = not drills.runtime.current().interpreter
    failures = graded = 0
    checks_run = [0, 0]  # checks run, checks in all (the selected gradings)
    counts = []
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="drills-mutants-")))
        forks = None if fork_server.unavailable() else stack.enter_context(fork_server.GradingPool())
        jobs = ThreadPoolExecutor(mutant_workers(on_gpu))
        stack.callback(jobs.shutdown, cancel_futures=True)  # after Ctrl-C, grade nothing more
        plans = []  # (lesson, number of mutants, lines to print first, [(mutant, its grading)])
        for lesson in [find(lesson_id)] if lesson_id else LESSONS:
            mutants = load_mutants(lesson.stem)
            if not mutants:
                continue
            lines = [
                f"  {problem}" for problem in pitfall_mismatches(lesson.stem, lesson.explainer.read_text())
            ]
            failures += len(lines)
            todo = []
            coverage = None if forks is None else jobs.submit(reference_coverage, lesson, forks, folder)
            for m, mutated, problem in mutate(lesson):
                if m.gpu_only and not on_gpu:
                    lines.append(f"  {m.name:34} skipped on the CPU: only a GPU exposes it ({m.pitfall})")
                    continue
                if gpu_only and not m.gpu_only:
                    continue
                if problem is not None:
                    lines.append(f"  {m.name:34} BROKEN: {problem}")
                    failures += 1
                    continue
                path = folder / lesson.stem / m.name / f"{lesson.stem}.py"  # named as the learner's file
                path.parent.mkdir(parents=True)
                path.write_text(mutated)
                compare = full or not any(not t[0].gpu_only for t in todo)  # the first CPU mutant: a sample
                todo.append(
                    (m, jobs.submit(grade_selected, lesson, path, mutated, forks, coverage, folder, compare))
                )
            plans.append((lesson, len(mutants), lines, todo))
        for lesson, total, lines, todo in plans:
            print(f"== {lesson.id}: {total} mutants ==", flush=True)
            for line in lines:
                print(line, flush=True)
            diagnosed = 0
            for m, grading in todo:
                result, ran, unsound = grading.result()
                verdict, ok = mutant_verdict(m, result)
                if ran is not None:
                    checks_run[0] += ran
                    checks_run[1] += len(result.cases)
                if unsound:
                    verdict, ok = f"{verdict}; SELECTION UNSOUND: {unsound}", False
                diagnosed += ok
                failures += not ok
                print(f"  {m.name:34} {verdict}", flush=True)
            graded += len(todo)
            counts.append(f"{lesson.id} {diagnosed}/{len(todo)}")
    took = time.monotonic() - began
    print("mutants diagnosed as their own pitfall: " + (", ".join(counts) or "none ran"))
    print(
        "mutants: "
        + ("every mutant killed and diagnosed" if not failures else f"{failures} problems")
        + f" ({graded} graded in {took // 60:.0f} min {took % 60:.0f} s)"
    )
    if checks_run[1]:
        print(f"checks run: {checks_run[0]} of {checks_run[1]} (the rest cannot see their mutant)")
    return 1 if failures else 0


def mutant_workers(on_gpu: bool) -> int:
    # Each grading is a pytest process plus the learner's process, one of them waiting on the other most
    # of the time, so one grading per core; on a GPU one at a time.
    import os

    return 1 if on_gpu else max(1, min(4, os.cpu_count() or 2))


ONE_SCREEN = 60  # lines: what a learner reads after make test


def mutant_verdict(m, result) -> tuple[str, bool]:
    """(the line to print, whether the mutant was killed and diagnosed as its own pitfall)."""
    import re

    own = re.match(r"(\d+)\. ", m.pitfall)
    if result.state == "passing":
        return f"SURVIVED   [{m.pitfall}]", False
    if result.state in ("not started", "grader error", "missing"):
        return (
            f"NOT GRADED ({result.state}: {result.message.splitlines()[0] if result.message else ''})",
            False,
        )
    screen = result.screen()
    if len(screen) >= ONE_SCREEN:
        return f"killed, but its summary takes {len(screen)} lines (one screen is under {ONE_SCREEN})", False
    top = result.findings[0] if result.findings else {}
    named = top.get("pitfall") or 0
    first_failed = next((c.id for c in result.cases if c.outcome == "failed"), result.state)
    if own is None:  # a mutant standing for another lesson's pitfall: being killed is enough
        return f"killed by {first_failed}   [{m.pitfall}]", True
    if named == int(own.group(1)):
        return f"killed, diagnosed as pitfall {named}   [{m.pitfall}]", True
    said = f"pitfall {named}" if named else (top.get("title") or "nothing")
    return f"killed by {first_failed} but DIAGNOSED AS {said}   [{m.pitfall}]", False


CRASHED = ("your code ended the process that runs it", "your code did not return within")


def reference_coverage(lesson, pool, folder: Path) -> dict | None:
    """The map "check -> lines of the reference it ran", from the cache or from one traced grading of
    the reference; None when the reference does not pass (then every mutant runs every check)."""
    from drills.grading.grader import pytest_run, selection

    cached = selection.load_coverage(lesson)
    if cached is not None:
        return cached
    out = folder / f"{lesson.stem}.coverage.json"
    result = pytest_run.grade(lesson, impl="solutions", pool=pool, extra=[f"--drills-coverage={out}"])
    if not result.passed or not out.exists():
        return None
    data = json.loads(out.read_text())
    selection.save_coverage(lesson, data)
    return data


def grade_selected(lesson, path: Path, mutated: str, pool, coverage, folder: Path, compare: bool):
    """(the grade, how many checks ran or None for a full run, why the selection was unsound or None).
    Graded with only the checks that can see the mutant; in full when none can be left out, when a
    selected check crashed or timed out, or on a GPU (pool None). With compare, also in full, and the
    two must agree on the verdict and the named pitfall."""
    from drills.grading.grader import pytest_run, selection

    coverage = coverage.result() if coverage is not None else None
    if coverage is None:
        return pytest_run.grade(lesson, file=path, pool=pool), None, None
    reference = lesson.solution.read_text()
    assumed = selection.assumed(coverage, selection.changed_lines(reference, mutated))
    if not assumed or len(assumed) >= len(coverage["order"]):
        # Nothing to leave out, or nothing left to run (pytest would report "no tests ran", a failure):
        # a mutant no check can see is graded in full, and survives there.
        return pytest_run.grade(lesson, file=path, pool=pool), None, None
    plan = path.with_name("assumed.json")
    plan.write_text(json.dumps(assumed))
    result = pytest_run.grade(lesson, file=path, pool=pool, extra=[f"--drills-assume={plan}"])
    broken = result.state not in ("passing", "failing") or any(
        c.outcome == "failed" and c.message.startswith(CRASHED) for c in result.cases
    )
    if broken:  # a selected check that crashed or hung could hide what the others would show
        return pytest_run.grade(lesson, file=path, pool=pool), None, None
    unsound = None
    if compare:
        whole = pytest_run.grade(lesson, file=path, pool=pool)
        unsound = disagreement(result, whole)
    return result, len(result.cases) - len(assumed), unsound


def disagreement(selected, whole) -> str | None:
    """Why a selected grading's verdict differs from the full one's, or None when they agree: the state,
    each check's outcome, and the pitfall the diagnosis names first."""
    if selected.state != whole.state:
        return f"the selected run is {selected.state}, the full run {whole.state}"
    outcomes = {c.id: c.outcome for c in whole.cases}
    for c in selected.cases:
        if outcomes.get(c.id) != c.outcome:
            return f"{c.id} {c.outcome} in the selected run, {outcomes.get(c.id)} in the full run"
    named = [
        (g.findings[0].get("pitfall"), g.findings[0].get("title")) if g.findings else None
        for g in (selected, whole)
    ]
    if named[0] != named[1]:
        return f"the selected run names {named[0]}, the full run {named[1]}"
    return None
