"""The grading pytest plugin (loaded by `-p drills.grading.grader.plugin`, pyproject's addopts):
`--impl=mine|solutions` picks the module under test, served by its own process (learner_client.py) once the
static check (source_check.py) lets it through; the banner says which runtime runs it; a lesson whose
stub is untouched is reported as "not started" in one line; and the run ends with a grading summary
(report.py): a line per check, the first failure in words, the explainer section to reread, and the
SEED line. The report goes to the result channel (report_channel.py) after every stray process is ended. Test
files that are not a lesson's grader (test_<stem>.py for a stem in drills/lessons.py), such as the learner
tools' own tests, are run as plain tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import drills.runtime
from drills import stubs
from drills.grading.grader import process_tree
from drills.grading.grader import report as summary
from drills.grading.grader.pytest_run import NOT_STARTED_EXIT
from drills.grading.grader.report import STAGES, report_text, stage_lines
from drills.grading.grader.report_channel import write_to_fd
from drills.grading.grader.source_check import check_file, kernel_names
from drills.grading.shared.bigmem import release_device_cache
from drills.grading.shared.errors import Refused
from drills.grading.shared.seed_streams import base_seed
from drills.lessons import LESSONS, find


def pytest_addoption(parser):
    parser.addoption(
        "--impl",
        choices=("mine", "solutions"),
        default="mine",
        help="grade the learner's drills/mine (default) or the reference drills/solutions",
    )
    parser.addoption(
        "--impl-file",
        default=None,
        help="grade this file instead (how `make mutants` grades a mutated copy of a solution)",
    )
    parser.addoption(
        "--drills-skip-source-check",
        action="store_true",
        default=False,
        help="the harness's own tests of the sandbox: grade a file that the static check would refuse",
    )
    parser.addoption(
        "--drills-report",
        default=None,
        help="also write the grading results as JSON here (make mutants' forked gradings)",
    )
    parser.addoption(
        "--drills-coverage",
        default=None,
        help="make mutants: trace the graded file and write which of its lines each check ran, as JSON here",
    )
    parser.addoption(
        "--drills-assume",
        default=None,
        help="make mutants: a JSON list of the reference's cases that cannot see the mutant (not run; "
        "recorded with the reference's outcome; drills/grading/grader/selection.py)",
    )
    parser.addoption(
        "--drills-report-fd",
        type=int,
        default=None,
        help="write the grading results as JSON to this inherited pipe (grader/report_channel.py)",
    )


LOADED = pytest.StashKey[dict]()  # stem -> LearnerProcess
NOT_STARTED = pytest.StashKey[list]()
IMPORT_ERRORS = pytest.StashKey[list]()
RESULTS = pytest.StashKey[dict]()
FINDINGS = pytest.StashKey[dict]()  # stem -> the diagnosis, as the report stores it
ORDER = pytest.StashKey[list]()  # case ids in the grader's order (when some were left out: make mutants)
GENERATION = pytest.StashKey[int]()  # the learner process's generation when its trace started
COVERAGE = pytest.StashKey[dict]()  # case id -> lines of the graded file it ran (None: unknown)
# RESULTS: stem -> {case id: summary.Case}, in the order the cases ran
# NOT_STARTED and IMPORT_ERRORS hold (stem, the one line to print) pairs
LESSON_STEMS = {lesson.stem for lesson in LESSONS}


def _graded_file(config, stem: str) -> tuple[Path, str, bool]:
    """(the file graded, the module name it is loaded as, whether it is a reference solution)."""
    path = config.getoption("--impl-file")
    lesson = find(stem)
    if path:
        return Path(path), f"drills._graded_{stem}", False
    impl = config.getoption("--impl")
    file = lesson.solution if impl == "solutions" else lesson.stub
    return file, lesson.module(impl), impl == "solutions"


def _load(config, stem: str):
    """The module under test, living in its own process (drills/grading/grader/learner_client.py): the
    grader's oracle and comparisons stay out of its reach, and a crash or a hang is a failed check, not a dead
    run."""
    from drills.grading.grader.learner_client import LearnerProcess

    processes = config.stash.setdefault(LOADED, {})
    if stem not in processes:
        file, name, reference = _graded_file(config, stem)
        if not reference and not config.getoption("drills_skip_source_check"):
            # Code that asks where it runs is refused before it runs (source_check.py).
            refused = check_file(file, find(stem).solution)
            if refused:
                raise Refused(refused)
        learner = LearnerProcess(file, name, reference=reference)
        processes[stem] = learner
        learner.start()  # raises ImportFailed / LearnerCrash / LearnerTimeout for the collection hook
        if not reference and learner.ready.get("not_started") is None:
            _require_kernels(learner.module, find(stem).solution)
    return processes[stem].module


def _require_kernels(module, solution) -> None:
    """Every kernel of the reference is a Triton kernel in the learner's file too: a grader that launches
    impl.kernel[grid](...) by hand must reach a real launch, not an object that adds with torch."""
    not_kernels = []
    for name in kernel_names(solution):
        try:
            kind = getattr(module, name)._kind
        except Exception:  # noqa: BLE001 - missing: the contract and the checks that use it say so
            continue
        if kind != "kernel":
            not_kernels.append(name)
    if not_kernels:
        raise Refused(
            [f"`{n}` must be a @triton.jit kernel, as the lesson's stub declares it" for n in not_kernels]
        )


def _graded_path(config, stem: str) -> str:
    path = config.getoption("--impl-file")
    return summary.relative(path) if path else f"drills/{config.getoption('--impl')}/{stem}.py"


def pytest_report_header(config):
    return [drills.runtime.current().banner, f"grading: drills/{config.getoption('--impl')}"]


def _stem(path) -> str | None:
    """The lesson a test file grades, or None for a test file that is not a lesson's grader."""
    stem = Path(str(path)).stem.removeprefix("test_")
    return stem if stem in LESSON_STEMS else None


def pytest_collection_modifyitems(session, config, items):
    """Stop before running anything when a lesson's stub has not been started (one line, not a wall of
    NotImplementedError tracebacks), or when the file under test does not even import."""
    lines, errors = [], []  # (stem, the line to print)
    from drills.grading.grader.learner_client import ImportFailed, LearnerFailure

    for stem in sorted({_stem(item.path) for item in items} - {None}):
        graded = _graded_path(config, stem)
        try:
            _load(config, stem)
        except ImportFailed as exc:  # a syntax error or a failing import in the learner's file
            info = exc.info
            where = f" (at {info['where']}: {info['code']})" if info.get("where") else ""
            errors.append(
                (
                    stem,
                    f"{find(stem).id}: {graded} does not import: "
                    f"{info.get('type')}: {info.get('message')}{where}",
                )
            )
            continue
        except Refused as exc:
            errors.append(
                (
                    stem,
                    f"{find(stem).id}: {graded} refused before grading: "
                    + (
                        "it uses something a kernel launcher never needs, or that could tell a grading from "
                        "a plain run (a graded file must do the same everywhere); each line says what, and "
                        "what to do instead:"
                        if not exc.lines[0].startswith("`")
                        else "its kernels must be Triton's:"
                    )
                    + "\n  "
                    + "\n  ".join(exc.lines),
                )
            )
            continue
        except LearnerFailure as exc:  # os._exit() at import, a crash or a hang while importing
            errors.append((stem, f"{find(stem).id}: {graded} could not be imported: {exc}"))
            continue
        message = config.stash[LOADED][stem].ready.get("not_started")
        # A function still raising, with another's raise deleted, is a staged lesson begun at its first stage.
        if message is not None and not stubs.deleted_a_stub_raise(_graded_file(config, stem)[0], find(stem)):
            lines.append((stem, message))
    if lines or errors:
        config.stash[NOT_STARTED] = lines
        config.stash[IMPORT_ERRORS] = errors
        items.clear()
        return
    if config.getoption("drills_coverage"):
        config.stash[COVERAGE] = {}
        for learner in config.stash.get(LOADED, {}).values():
            learner.request("coverage", "start")
            config.stash[GENERATION] = learner.generation
    if config.getoption("drills_assume"):
        _leave_out_assumed(config, items)


def _leave_out_assumed(config, items) -> None:
    """Deselect the checks that cannot see the mutant graded (selection.py) and record each with the
    reference's outcome, so that the diagnosis reads the same pattern as a full run."""
    assumed = {case["id"]: case for case in json.loads(Path(config.getoption("drills_assume")).read_text())}
    config.stash[ORDER] = [item.nodeid.split("::")[-1] for item in items]
    keep, dropped = [], []
    for item in items:
        case = assumed.get(item.nodeid.split("::")[-1])
        stem = _stem(item.path)
        if case is None or stem is None:
            keep.append(item)
            continue
        dropped.append(item)
        config.stash.setdefault(RESULTS, {}).setdefault(stem, {})[case["id"]] = summary.Case(
            case["id"], case["check"], case["outcome"], case.get("message", "")
        )
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """After each check: a large case's GPU memory goes back (bigmem.release_device_cache); with
    --drills-coverage, which lines of the graded file the check ran."""
    yield
    release_device_cache()
    coverage = item.config.stash.get(COVERAGE, None)
    if coverage is None or _stem(item.path) is None:
        return
    learner = item.config.stash.get(LOADED, {}).get(_stem(item.path))
    case_id = item.nodeid.split("::")[-1]
    try:
        if learner is None or not learner.alive() or learner.generation != item.config.stash[GENERATION]:
            raise RuntimeError("the learner's process was restarted: its trace is incomplete")
        coverage[case_id] = learner.request("coverage", "take")
    except Exception:  # noqa: BLE001 - unknown coverage: the check always runs
        coverage[case_id] = None
        if learner is not None and learner.alive():
            learner.request("coverage", "start")
            item.config.stash[GENERATION] = learner.generation


def _write_coverage(config) -> None:
    path = config.getoption("drills_coverage")
    coverage = config.stash.get(COVERAGE, None)
    if not path or coverage is None:
        return
    order, cases = [], {}
    for stem_cases in config.stash.get(RESULTS, {}).values():
        for case_id, case in stem_cases.items():
            order.append(case_id)
            cases[case_id] = {
                "id": case.id,
                "check": case.check,
                "outcome": case.outcome,
                "message": case.message,
                "lines": coverage.get(case_id),
            }
    Path(path).write_text(json.dumps({"order": order, "cases": cases}))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        report.drills_message = summary.failure_message(call.excinfo)


class Recorder:
    """Collects each lesson case's outcome as it is reported (the hook is not given the config)."""

    def __init__(self, config):
        self.cases = config.stash[RESULTS] = {}

    def pytest_runtest_logreport(self, report):
        stem = _stem(report.nodeid.split("::", 1)[0])
        if stem is None or (report.when != "call" and report.passed):
            return
        case_id = report.nodeid.split("::")[-1]
        cases = self.cases.setdefault(stem, {})
        if report.failed:
            message = getattr(report, "drills_message", None) or str(report.longrepr).strip().splitlines()[-1]
            if report.when != "call":
                message = f"(in {report.when}) {message}"
            if case_id not in cases or cases[case_id].outcome != "failed":
                cases[case_id] = summary.Case(case_id, summary.check_name(case_id), "failed", message)
        elif report.skipped:
            cases[case_id] = summary.Case(
                case_id, summary.check_name(case_id), "skipped", summary.skip_reason(report.longrepr)
            )
        elif case_id not in cases:
            cases[case_id] = summary.Case(case_id, summary.check_name(case_id), "passed")


def pytest_configure(config):
    config.pluginmanager.register(Recorder(config), "drills-grading-recorder")
    # A process the learner's file starts and detaches is adopted here (not by init), so that
    # pytest_sessionfinish can end it; and no process of the learner's may read this one's memory.
    process_tree.become_subreaper()
    process_tree.harden()


def _module_attr(session, stem: str, name: str, default=()):
    """A module-level attribute of a lesson's grader (MISTAKES, STAGES): from a collected test, or, when
    no test ran (a stub not started), from the grader module itself."""
    import importlib

    for item in session.items:
        if _stem(item.path) == stem:
            return getattr(item.module, name, default)
    return getattr(importlib.import_module(f"drills.tests.test_{stem}"), name, default)


def findings_for(session, stem: str, cases: list) -> list[dict]:
    """The diagnosis of one lesson's results: its grader's MISTAKES against the pattern of failures."""
    from drills import explainer
    from drills.grading.grader import diagnose

    mistakes = list(_module_attr(session, stem, "MISTAKES"))
    lesson = find(stem)
    titles = {p.number: p.title for p in explainer.pitfalls(lesson)}
    stages = list(_module_attr(session, stem, "STAGES"))  # which stage a function not written yet is in
    return [summary.finding_dict(f) for f in diagnose.diagnose(cases, mistakes, titles, stages=stages)]


def _findings(session) -> dict:
    config = session.config
    if FINDINGS not in config.stash:
        config.stash[FINDINGS] = {
            stem: findings_for(session, stem, list(cases.values()))
            for stem, cases in config.stash.get(RESULTS, {}).items()
        }
    return config.stash[FINDINGS]


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    for learner in config.stash.get(LOADED, {}).values():
        learner.close()
    # Whatever the learner's file started and detached was adopted by this process (pytest_configure):
    # it ends here, before the report exists, so nothing of it can rewrite the report or the screen.
    process_tree.end_strays(process_tree.OWN)
    not_started, errors = config.stash.get(NOT_STARTED, []), config.stash.get(IMPORT_ERRORS, [])
    if errors:
        session.exitstatus = 1  # the file under test does not import: it does not pass
    elif not_started:
        session.exitstatus = NOT_STARTED_EXIT  # non-zero, and unlike pytest's own codes
    _write_coverage(config)
    order = config.stash.get(ORDER, None)
    if order is not None:  # checks left out were recorded first: put every case back in the grader's order
        rank = {case_id: n for n, case_id in enumerate(order)}
        for stem, cases in config.stash.get(RESULTS, {}).items():
            config.stash[RESULTS][stem] = dict(
                sorted(cases.items(), key=lambda kv: rank.get(kv[0], len(rank)))
            )
    path, fd = config.getoption("--drills-report"), config.getoption("--drills-report-fd")
    if path or fd is not None:
        findings = _findings(session)
        lessons = {
            stem: {summary.CASES: list(cases.values()), summary.FINDINGS: findings.get(stem, [])}
            for stem, cases in config.stash.get(RESULTS, {}).items()
        }
        for key, found in ((summary.NOT_STARTED, not_started), (summary.IMPORT_ERROR, errors)):
            for stem, line in found:
                lessons.setdefault(stem, {summary.CASES: []})[key] = line
        for stem, info in lessons.items():  # a staged lesson's stages (drills/grading/grader/report.py)
            info[STAGES] = list(_module_attr(session, stem, "STAGES"))
        text = report_text(lessons, base_seed(), session.exitstatus)
        if fd is not None:
            write_to_fd(fd, text)
        else:
            Path(path).write_text(text)


def pytest_report_teststatus(report, config):
    """No progress dots unless asked (-v): the grading summary is the one screen a learner reads."""
    if config.getoption("verbose") <= 0 and _stem(report.nodeid.split("::", 1)[0]) is not None:
        if report.when == "call" or report.skipped or report.failed:
            return report.outcome, "", ""
    return None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for _, line in config.stash.get(IMPORT_ERRORS, []):
        terminalreporter.write_line(line, red=True, bold=True)
    for stem, line in config.stash.get(NOT_STARTED, []):
        terminalreporter.write_line(line, yellow=True, bold=True)
        stages = list(_module_attr(terminalreporter._session, stem, "STAGES"))
        for stage in stage_lines([], stages, started=False):
            terminalreporter.write_line(stage)
    results = {stem: cases for stem, cases in config.stash.get(RESULTS, {}).items() if cases}
    if not results:
        return
    findings = _findings(terminalreporter._session)
    detailed = len(results) == 1
    terminalreporter.write_line("")
    for stem, cases in results.items():
        lesson = find(stem)
        for line in summary.render(
            lesson,
            list(cases.values()),
            _graded_path(config, stem),
            base_seed(),
            detailed,
            findings.get(stem),
            list(_module_attr(terminalreporter._session, stem, "STAGES")),
        ):
            terminalreporter.write_line(
                line,
                red=line.startswith(("  FAIL", "likely mistake")),
                bold=line.startswith(f"{lesson.id}: "),
            )
    if not detailed:
        terminalreporter.write_line(summary.random_cases_line(base_seed()))


@pytest.fixture(scope="module")
def impl(request):
    """The lesson module under test (drills.mine.<stem> or drills.solutions.<stem>)."""
    stem = _stem(request.path)
    if stem is None:
        pytest.fail(f"{request.path.name} is not a lesson's grader (test_<stem>.py), so it has no `impl`")
    return _load(request.config, stem)


@pytest.fixture(scope="session")
def runtime():
    return drills.runtime.current()
