"""Running a lesson's grader on a file: the one place that builds the pytest command, knows the
not-started exit status, and turns what happened into a `Grade` (read from the report the grader
writes, never from its printed output).

The grader runs as `python -m pytest drills/tests/test_<stem>.py --impl...` in a child process with a
time limit; inside it, the learner's code runs in a process of its own
(drills/grading/grader/learner_client.py). A missing or partial report is a result too ("grader error"), never
a crash of the caller.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from drills.grading.grader import fork_server, process_tree, report, report_channel
from drills.grading.shared.env import LESSON_TIMEOUT_ENV, child_env, lesson_timeout
from drills.lessons import ROOT, Lesson

NOT_STARTED_EXIT = 10  # `make test` on an untouched stub: non-zero, unlike any pytest exit status
VERBOSE_ENV = "VERBOSE"


def verbose_requested() -> bool:
    return os.environ.get(VERBOSE_ENV, "").strip() not in ("", "0", "no", "false")


def pytest_args(
    tests: list[str | Path],
    impl: str = "mine",
    impl_file: str | Path | None = None,
    report_path: str | Path | None = None,
    verbose: bool = False,
    extra: list[str] = (),
) -> list[str]:
    """The arguments after `python -m pytest`: one screen by default, pytest's own output with verbose."""
    args = [str(t) for t in tests]
    args.append(f"--impl-file={impl_file}" if impl_file else f"--impl={impl}")
    args += ["-p", "no:cacheprovider"]
    args += ["-v", "-rs", "--tb=short"] if verbose else ["-q", "--tb=no", "--no-header", "-rN"]
    if report_path:
        args.append(f"--drills-report={report_path}")
    return args + list(extra)


@dataclass
class Grade:
    lesson: Lesson
    state: (
        str  # "not started", "passing", "failing", "does not import", "timed out", "grader error", "missing"
    )
    cases: list = field(default_factory=list)  # report.Case
    message: str = ""  # the not-started or import-error line, or what went wrong with the grader
    shift: int = 0  # SEED of the run: added to every test's stream number
    findings: list = field(default_factory=list)  # report.finding_dict entries, best first
    graded: str = ""  # the file graded, relative to the repository
    stages: list = field(default_factory=list)  # report.Stage, for a staged lesson (its grader's STAGES)

    @property
    def summary(self) -> report.Summary:
        return report.summarize(self.cases)

    @property
    def passed(self) -> bool:
        return self.state == "passing"

    @property
    def status(self) -> str:
        """One phrase for make progress: not started, k of n checks passing, passing, ..."""
        if self.state in ("passing", "failing"):
            if self.passed:
                return "passing"
            text = f"{self.summary.passing} of {self.summary.total} checks passing"
            stage = report.stage_line(self.cases, self.stages)
            if stage:
                text += f", {stage[0].lower()}{stage[1:]}"
            top = self.findings[0] if self.findings else None
            if top and top.get("pitfall"):
                text += f" (likely pitfall {top['pitfall']}: {top.get('title')})"
            elif top and top.get("title"):
                text += f" ({top['title']})"
            return text
        if self.state == "not started" and self.stages:
            return f"not started (stage 1 of {len(self.stages)}, {self.stages[0].title}, comes first)"
        return self.state

    def screen(self) -> list[str]:
        """The one screen `make test`, `make watch` and `make hint` print."""
        if self.state in ("passing", "failing"):
            return report.render(
                self.lesson, self.cases, self.graded, self.shift, True, self.findings, self.stages
            )
        head = f"== {self.lesson.id} · {self.lesson.title}: {self.graded} =="
        if self.message.startswith(f"{self.lesson.id}: ") or self.message.startswith(f"{self.lesson.id} is"):
            return [head, self.message]  # the grader's own line already says the state
        return [head, f"{self.lesson.id}: {self.state}"] + ([self.message] if self.message else [])


def grade(
    lesson: Lesson,
    file: str | Path | None = None,
    impl: str = "mine",
    timeout: float | None = None,
    extra: list[str] = (),
    pool=None,
) -> Grade:
    """Grade one lesson in a child process and read its report. file: a learner file elsewhere than
    drills/mine (make progress with DRILLS_MINE_DIR, make mutants); impl: "mine" or "solutions";
    pool: a fork_server.GradingPool that forks the child instead of starting it (make mutants)."""
    graded = report.relative(file) if file else f"drills/{impl}/{lesson.stem}.py"
    if file is not None and not Path(file).exists():
        return Grade(
            lesson,
            "missing",
            message=f"{graded} does not exist: make reset L={lesson.id} restores the stub",
            graded=graded,
        )
    timeout = lesson_timeout() if timeout is None else timeout
    if pool is not None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "report.json"
            try:
                proc = pool.run(pytest_args([lesson.tests], impl, file, path, extra=extra), timeout)
            except subprocess.TimeoutExpired:
                return _timed_out(lesson, graded, timeout)
            text = path.read_text() if path.exists() else None
    else:
        try:
            proc, text = _run_grader(pytest_args([lesson.tests], impl, file, extra=extra), timeout)
        except subprocess.TimeoutExpired:
            return _timed_out(lesson, graded, timeout)
    data = None
    if text:
        try:
            data = report.parse_report(text)
        except (ValueError, KeyError, TypeError):
            data = None
    if data is None:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-12:])
        what = "without a report" if not text else "with a report that is not one whole report"
        return Grade(
            lesson,
            "grader error",
            graded=graded,
            message=f"the grader stopped {what} (exit {proc.returncode}):\n{tail}",
        )
    if proc.returncode != data[report.REPORT_EXIT]:  # the report must be the grader's own account
        return Grade(
            lesson,
            "grader error",
            graded=graded,
            message=f"the grader exited with {proc.returncode}, its report says {data[report.REPORT_EXIT]}",
        )
    info = data[report.REPORT_LESSONS].get(lesson.stem, {report.CASES: []})
    shift = data[report.REPORT_SHIFT]
    stages = info.get(report.STAGES, [])
    if info.get(report.IMPORT_ERROR):
        return Grade(lesson, "does not import", message=info[report.IMPORT_ERROR], shift=shift, graded=graded)
    if info.get(report.NOT_STARTED):
        message = "\n".join([info[report.NOT_STARTED], *report.stage_lines([], stages, started=False)])
        return Grade(lesson, "not started", message=message, shift=shift, graded=graded, stages=stages)
    cases = info[report.CASES]
    passed = report.summarize(cases).passed and data[report.REPORT_EXIT] == 0
    return Grade(
        lesson,
        "passing" if passed else "failing",
        cases,
        shift=shift,
        findings=info.get(report.FINDINGS, []),
        graded=graded,
        stages=stages,
    )


def _timed_out(lesson: Lesson, graded: str, timeout: float) -> Grade:
    return Grade(
        lesson,
        "timed out",
        graded=graded,
        message=f"grading took more than {timeout:.0f} s in all (the limit is {LESSON_TIMEOUT_ENV})",
    )


def _run_grader(args: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, str | None]:
    """`python -m pytest ARGS` with the report coming back over a pipe (report_channel.py); every process the
    grading left behind is ended before the report is read (process_tree.py)."""
    process_tree.become_subreaper()
    process_tree.harden()
    pipe = report_channel.ResultPipe()
    warm = fork_server.start_warm_learner()  # its imports overlap pytest's start
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", *args, f"--drills-report-fd={pipe.fd}"],
        cwd=ROOT,
        env=warm[1] if warm else child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=(pipe.fd,),
    )
    process_tree.OWN.add(child.pid)
    pipe.started()
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise
    finally:
        process_tree.OWN.discard(child.pid)
        if warm:
            fork_server.stop_warm_learner(*warm)
        process_tree.end_strays(process_tree.OWN)
    return subprocess.CompletedProcess(child.args, child.returncode, out, err), pipe.text()


def run_pytest_here(
    tests: list[str | Path], impl: str = "mine", verbose: bool = False, extra: list[str] = ()
) -> int:
    """pytest in this process (make check, make test V=1): its output streams as it runs."""
    import pytest
    import torch

    import drills.runtime

    torch.set_num_threads(1)  # this process and the learner's take turns: see env.child_env
    print(drills.runtime.current().banner, flush=True)
    return pytest.main(pytest_args(tests, impl, verbose=verbose, extra=list(extra)))


def run_pytest_side_by_side(groups: list[list[str | Path]], impl: str, extra: list[str] = ()) -> int:
    """Each group of test files in a pytest process of its own, all at once (make check: one grading
    keeps about one core busy, the grader and the learner's process taking turns), each group's output
    printed whole once it ends. The largest exit status."""
    import drills.runtime

    print(drills.runtime.current().banner, flush=True)
    with tempfile.TemporaryDirectory(prefix="drills-check-") as tmp:
        started = []
        for i, tests in enumerate(groups):
            log = open(Path(tmp) / f"group-{i}.log", "w+")
            args = [sys.executable, "-m", "pytest", *pytest_args(tests, impl, extra=list(extra))]
            env = dict(os.environ, OMP_NUM_THREADS="1")  # as run_pytest_here: the processes take turns
            proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            started.append((proc, log))
        status = 0
        for proc, log in started:
            status = max(status, proc.wait())
            log.seek(0)
            print(log.read(), end="", flush=True)
            log.close()
    return status
