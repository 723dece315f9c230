"""Tests of the learner's tools (make progress, hint, reset, diff, watch, doctor, the grading summary,
the launch check and SEED). Not a lesson's grader: it runs in `make check`.

Every test points the tools at a temporary copy of the learner's folder (DRILLS_MINE_DIR, filled with
the committed stubs) and a temporary state folder (DRILLS_STATE_DIR), so the real drills/mine files
and .drills/ are never touched. Grading runs T1's grader in a child process (about 2 s each): the
cheapest lesson with a Triton kernel.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import drills.runtime
from drills import bench, doctor, explainer, learner, stubs
from drills.grading.grader import pytest_run, report
from drills.grading.shared.launches import count_triton_launches
from drills.lessons import LESSONS, ROOT, find
from drills.tests import seeded

T1 = find("t1")

# T1's solution with the kernel launch replaced by torch: right numbers, no Triton kernel.
TORCH_FALLBACK = """

def _launch(x, y, out, BLOCK=2048, num_warps=4):
    return torch.add(x, y, out=out)
"""


@pytest.fixture
def mine(tmp_path, monkeypatch):
    """A learner folder holding every lesson's committed stub, and an empty state folder."""
    folder = tmp_path / "mine"
    folder.mkdir()
    for lesson in LESSONS:
        (folder / f"{lesson.stem}.py").write_text(stubs.pristine_stub_source(lesson))
    monkeypatch.setenv(learner.MINE_DIR_ENV, str(folder))
    monkeypatch.setenv(learner.STATE_DIR_ENV, str(tmp_path / "state"))
    return folder


def solve_t1(folder, extra=""):
    (folder / f"{T1.stem}.py").write_text(T1.solution.read_text() + extra)


# --- make progress -----------------------------------------------------------------------------


def test_progress_shows_a_correct_kernel_as_passing(mine, capsys):
    solve_t1(mine)
    assert learner.progress() == 0
    out = capsys.readouterr().out
    t1_line = next(line for line in out.splitlines() if line.startswith("t1 "))
    assert t1_line.rstrip().endswith("passing") and "checks passing" not in t1_line, out
    assert next(line for line in out.splitlines() if line.startswith("t2 ")).rstrip().endswith("not started")
    assert "next: t2" in out
    assert "performance: needs a CUDA GPU" in out or "performance on" in out


def test_progress_counts_checks_of_a_partly_right_file(mine):
    solve_t1(mine, TORCH_FALLBACK)
    grade = learner.grade(T1)
    summary = grade.summary
    assert grade.state == "failing" and summary.total - summary.passing >= 1
    assert grade.status.startswith(f"{summary.passing} of {summary.total} checks passing")
    assert learner.next_lesson_line([grade]).startswith("next: t1")


# --- The launch check --------------------------------------------------------------------------


def test_torch_fallback_fails_the_launch_check(mine):
    solve_t1(mine, TORCH_FALLBACK)
    grade = learner.grade(T1)
    failed = {case.check for case in grade.cases if case.outcome == "failed"}
    assert "test_runs_a_triton_kernel" in failed, failed
    case = next(c for c in grade.cases if c.check == "test_runs_a_triton_kernel" and c.outcome == "failed")
    assert (
        "did not come from your kernel" in case.message
        and "without launching a Triton kernel" in case.message
    )


def test_launch_counter_counts_each_launch_and_unpatches():
    import torch
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    @triton.jit
    def fill_kernel(out_ptr, BLOCK: tl.constexpr):
        tl.store(out_ptr + tl.arange(0, BLOCK), 1.0)

    import drills.runtime

    out = torch.zeros(16, device=drills.runtime.current().device)
    run_before = JITFunction.__dict__["run"]
    with count_triton_launches() as launches:
        fill_kernel[(1,)](out, BLOCK=16)
        fill_kernel[(2,)](out, BLOCK=16)
    assert len(launches) == 2 and launches.from_module(__name__) == ["fill_kernel", "fill_kernel"]
    assert JITFunction.__dict__["run"] is run_before, "the patch must be undone after the block"
    assert (out == 1).all()


# --- make diff ---------------------------------------------------------------------------------


def test_diff_waits_for_a_pass_then_shows_the_reference(mine, capsys):
    assert learner.diff(T1) == 1
    assert "t1 must pass first (not started now)" in capsys.readouterr().out
    mine_file = mine / f"{T1.stem}.py"
    mine_file.write_text(T1.solution.read_text().replace("import torch\n", "import torch  # mine\n", 1))
    assert learner.diff(T1) == 0
    out = capsys.readouterr().out
    assert "t1 passes" in out and "--- drills/solutions/t1_vector_add.py (reference)" in out
    assert "+import torch  # mine" in out and "-import torch\n" in out


def test_diff_leaves_out_the_stub_comments_the_learner_kept(mine, capsys):
    """A learner who fills each hole under its TODO keeps the TODO: that comment came with the stub, is
    not the learner's, and must not stand as a "+ yours" line; a comment the learner wrote stays."""
    stub = stubs.pristine_stub_source(T1, committed_only=True)
    todos = [line for line in stub.splitlines(keepends=True) if line.lstrip().startswith("# TODO")]
    assert todos, "T1's stub has TODO comments"
    solution = T1.solution.read_text()
    mine_file = mine / f"{T1.stem}.py"
    mine_file.write_text("".join(todos) + solution + "# my own note\n")
    assert learner.diff(T1) == 0
    out = capsys.readouterr().out
    assert "# TODO" not in out and f"{len(todos)} comment lines of the stub" in out
    assert "+# my own note" in out


# --- make reset --------------------------------------------------------------------------------


def test_reset_leaves_the_backup_it_names(mine, tmp_path, capsys):
    if stubs.pristine_stub_source(T1, committed_only=True) is None:
        pytest.skip("not a git checkout: reset needs the committed stub")
    mine_file = mine / f"{T1.stem}.py"
    mine_file.write_text("# my work in progress\n")
    assert learner.reset(T1) == 0
    out = capsys.readouterr().out
    backups = list((tmp_path / "state" / "backups").glob("t1_vector_add-*.py"))
    assert len(backups) == 1 and backups[0].read_text() == "# my work in progress\n"
    assert report.relative(backups[0]) in out
    assert mine_file.read_text() == stubs.pristine_stub_source(T1)
    assert learner.reset(T1) == 0  # already the stub: nothing to do, nothing lost
    assert "already the untouched stub" in capsys.readouterr().out
    mine_file.write_text("# second try\n")
    learner.reset(T1)
    assert len(list((tmp_path / "state" / "backups").glob("t1_vector_add-*.py"))) == 2


# --- make hint ---------------------------------------------------------------------------------


def test_hint_on_an_untouched_stub_says_where_to_start(mine, capsys):
    assert learner.hint(find("l2")) == 0
    out = capsys.readouterr().out
    assert "l2 is not started" in out and "drills/content/l2_paged_decode.md" in out


def _mistakes(lesson):
    import importlib

    return list(getattr(importlib.import_module(f"drills.tests.test_{lesson.stem}"), "MISTAKES", []))


@pytest.mark.parametrize("lesson", LESSONS, ids=[lesson.id for lesson in LESSONS])
def test_hints_never_show_the_solution(lesson):
    """No hint for any diagnosable mistake quotes a line of the solution that neither the stub nor the
    explainer already shows the learner (the worked examples quote the lines they teach)."""
    stub = {line.strip() for line in (stubs.pristine_stub_source(lesson) or "").splitlines()}
    taught = lesson.explainer.read_text()
    solution_only = [
        line.strip()
        for line in lesson.solution.read_text().splitlines()
        if len(line.strip()) > 30
        and line.strip() not in stub
        and not line.strip().startswith("#")
        and line.strip() not in taught
    ]
    mistakes = _mistakes(lesson)
    assert mistakes, f"{lesson.id}'s grader declares no MISTAKES to diagnose"
    for m in mistakes:
        finding = {
            "pitfall": m.pitfall,
            "question": m.question,
            "section": m.section,
            "kind": "",
            "evidence": [],
        }
        steps = learner.hint_steps(lesson, finding)
        assert steps and steps[0][0] == "a question", f"{lesson.id} pitfall {m.pitfall} has no question"
        for _, text in steps:
            for line in solution_only:
                assert line not in text, f"a hint of {lesson.id} quotes the solution: {line}"


def test_todo_hints_say_where_they_sit():
    source = (
        'class Pool:\n    def take(self):\n        # TODO(section 3.1 "The pool"): pop a block;\n'
        "        # say which.\n        pass\n\n\ndef free(b):\n    # TODO(section 3.2): push it back.\n"
    )
    assert learner.todo_hints(source) == [
        'in Pool.take: TODO(section 3.1 "The pool"): pop a block; say which.',
        "in free: TODO(section 3.2): push it back.",
    ]


# --- make watch --------------------------------------------------------------------------------


def test_watch_regrades_after_each_save(mine, monkeypatch, capsys):
    mine_file = mine / f"{T1.stem}.py"
    graded = []

    def fake_grade(lesson):
        graded.append(mine_file.read_text())
        if len(graded) == 1:
            mine_file.write_text(mine_file.read_text() + "\n# saved again\n")  # a save while grading
        return learner.Grade(lesson, "not started", message="t1 is not started")

    monkeypatch.setattr(learner, "grade", fake_grade)
    learner.regrade_on_save(T1, interval=0.01, max_runs=2)
    assert len(graded) == 2 and graded[1].endswith("# saved again\n")
    assert capsys.readouterr().out.count("t1 is not started") == 2


def test_watch_grades_for_real_and_stops_on_ctrl_c(mine, monkeypatch, capsys):
    solve_t1(mine)
    assert learner.watch(T1, interval=0.01, max_runs=1) == 0
    out = capsys.readouterr().out
    assert "t1: passing" in out and "make diff L=t1" in out

    def interrupted(seconds):
        raise KeyboardInterrupt

    monkeypatch.setattr(learner.time, "sleep", interrupted)
    monkeypatch.setattr(learner, "grade", lambda lesson: learner.Grade(lesson, "not started"))
    assert learner.watch(T1, interval=0.01, max_runs=None) == 0
    assert "watch: stopped" in capsys.readouterr().out


# --- make doctor -------------------------------------------------------------------------------


def test_doctor_prints_versions_and_the_traps(capsys):
    assert doctor.main() == 0
    out = capsys.readouterr().out
    for needle in (
        "python",
        "torch",
        "triton",
        "numpy",
        "GPU",
        "runtime",
        "bf16 tl.dot",
        "CUDA tensors under the interpreter",
        "TF32",
        'input_precision="ieee"',
        "numpy 2.4",
        "what to do",
    ):
        assert needle in out, needle


# --- The grading summary of make test ----------------------------------------------------------


def run_grader(path, *extra):
    return subprocess.run(
        [sys.executable, "-m", "pytest", *pytest_run.pytest_args([T1.tests], impl_file=path), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_summary_names_each_check_and_the_first_failure(tmp_path):
    from drills.mutants import load_mutants

    grid_floor = next(m for m in load_mutants(T1.stem) if m.name == "grid_floor")
    path = tmp_path / f"{T1.stem}.py"
    path.write_text(grid_floor.apply(T1.solution.read_text()))
    proc = run_grader(path)
    assert proc.returncode == 1
    out = proc.stdout
    assert "  pass  test_by_hand_kernel_masks_lanes_10_and_11" in out
    assert "  FAIL  test_by_hand_grid_has_three_programs" in out
    if drills.runtime.current().interpreter:  # a GPU runs this check instead of skipping it
        assert "  skip  test_offsets_widened_to_int64" in out and "GPU only" in out
    else:
        assert "test_offsets_widened_to_int64" in out
    assert "likely mistake: pitfall" in out and "test_by_hand_grid_has_three_programs" in out
    assert "reread drills/content/t1_vector_add.md, section 5" in out
    assert len(out.strip().splitlines()) < 60, "one screen"
    assert "SEED=0, the default" in out


def test_untouched_stub_is_one_not_started_line(tmp_path):
    path = tmp_path / f"{T1.stem}.py"
    path.write_text(stubs.pristine_stub_source(T1))
    proc = run_grader(path)
    assert proc.returncode == pytest_run.NOT_STARTED_EXIT
    assert [line for line in proc.stdout.splitlines() if "not started" in line] == [
        stubs.not_started_message(stubs.load_from_file(path, "drills._stub_t1"))
    ]
    assert "first failure" not in proc.stdout and "checks passing" not in proc.stdout


def test_a_file_that_does_not_import_is_reported_in_one_line(mine):
    (mine / f"{T1.stem}.py").write_text("def vector_add(x, y, out=None):\n    return x +\n")
    grade = learner.grade(T1)
    assert grade.state == "does not import" and "SyntaxError" in grade.message


def test_first_failure_points_at_the_pitfall_that_names_the_test():
    where = explainer.where_taught(find("l2"), "test_last_page_is_masked")
    assert where == (
        'drills/content/l2_paged_decode.md, section 5 "Pitfalls and self-test", '
        'pitfall 2 "Unmasked last page"; also section 5 "Pitfalls and self-test", pitfall 16 "Pages '
        'counted rounding down"'
    )  # two pitfalls name that check: the first named first, the other after it
    assert "each pitfall names" in explainer.where_taught(find("l2"), "test_no_such_check")


def test_SEED_shifts_every_test_stream(monkeypatch):
    monkeypatch.delenv("SEED", raising=False)
    assert seeded(5) == 5
    monkeypatch.setenv("SEED", "3")
    assert seeded(5) == 8


# --- make bench IMPL=mine ----------------------------------------------------------------------


def test_bench_comparison_puts_yours_beside_the_reference():
    columns = [
        ("B", "B"),
        ("ctx", "ctx"),
        ("ceiling_gbs", "read ceiling GB/s"),
        ("l2_gbs", "L2 GB/s"),
        ("l2_ceiling", "L2 / ceiling"),
        ("sdpa_gbs", "SDPA GB/s"),
    ]
    mine_rows = [dict(B=64, ctx=1024, ceiling_gbs=4000.0, l2_gbs=3000.0, l2_ceiling=0.75, sdpa_gbs=2000.0)]
    ref_rows = [dict(B=64, ctx=1024, ceiling_gbs=4100.0, l2_gbs=3900.0, l2_ceiling=0.95, sdpa_gbs=2000.0)]
    [line] = bench.compare_rows(find("l2"), columns, mine_rows, ref_rows)
    assert line == "  B 64, ctx 1024: L2 GB/s 3000 (reference 3900); L2 / ceiling 0.75 (reference 0.95)"


def test_every_benchmark_with_a_headline_names_value_unit_label():
    import importlib
    import inspect

    with_headline = []
    for lesson in LESSONS:
        if lesson.benchmark.exists():
            module = importlib.import_module(f"drills.benchmarks.{lesson.stem}")
            if hasattr(module, "headline"):
                assert list(inspect.signature(module.headline).parameters) == ["impl"]
                with_headline.append(lesson.id)
    assert {"l2", "f1"} <= set(with_headline)


# --- The classic mistakes a new learner makes are graded as such -----------------------------------

# Issue-tracker reports of what learners met: each mistake made in a lesson's file must be one of that
# lesson's mutants, so that `make mutants` (part of make check) proves it is caught, diagnosed as its own
# pitfall and summarised on one screen.
CLASSIC_MISTAKES = {
    "l2": [
        "unmasked_last_page",
        "interleaved_grouping",
        "masked_scores_not_minus_inf",
        "rescale_dropped",
        "scale_missing",
        "p_not_cast_for_dot",
        "padding_rows_stored",
    ],
    "t1": ["store_unmasked"],
    "t5": ["causal_top_left", "acc_not_rescaled", "rows_past_nq_stored", "causal_shift_clamped"],
}


@pytest.mark.parametrize("lesson_id", sorted(CLASSIC_MISTAKES))
def test_classic_mistakes_are_mutants_with_their_own_pitfall(lesson_id):
    from drills.mutants import load_mutants

    lesson = find(lesson_id)
    mutants = {m.name: m for m in load_mutants(lesson.stem)}
    numbers = {p.number for p in explainer.pitfalls(lesson)}
    for name in CLASSIC_MISTAKES[lesson_id]:
        assert name in mutants, f"{lesson_id}: the classic mistake {name} has no mutant"
        assert int(mutants[name].pitfall.split(".", 1)[0]) in numbers, (
            f"{name} names no pitfall of the explainer"
        )
        assert not mutants[name].gpu_only, f"{name} must be graded on the CPU, where most learners are"


# --- The course speaks for itself ----------------------------------------------------------------

# The worked examples are the course's own: no learner-facing text may point at notes a learner has
# never seen. "SEED" (the variable that picks other random cases) and a `seed` argument in code are fine.
# The word is assembled from pieces so that this file, which must name it to look for it, does not
# itself read as learner-facing text that names the notes.
NOTES_WORD = "se" + "ed"
NAMES_NOTES = re.compile(
    rf"(?i)\b{NOTES_WORD}(?:'s|\s+notes|\s+example)|\bthe\s+{NOTES_WORD}\b|\btest_\w*{NOTES_WORD}"
)
PROSE_SEED = re.compile(rf"\b(?!SEED\b)(?i:{NOTES_WORD})(?:s|ed|'s)?\b")
# The other word for those notes (and the one for their author) has no use anywhere in the course, prose,
# code, test ids or mutants alike: assembled from pieces for the same reason.
NOTES_TALK = "lec" + "ture"
NAMES_NOTES_TALK = re.compile(NOTES_TALK, re.IGNORECASE)


def _learner_facing_text():
    """(where, text, is_prose) for every explainer, stub, notebook cell, README and lesson grader."""
    import json

    yield "README.md", (ROOT / "README.md").read_text(), True
    for lesson in LESSONS:
        yield report.relative(lesson.explainer), lesson.explainer.read_text(), True
        yield (
            report.relative(lesson.stub),
            stubs.pristine_stub_source(lesson) or lesson.stub.read_text(),
            False,
        )
        yield report.relative(lesson.tests), lesson.tests.read_text(), False
        for i, cell in enumerate(json.loads(lesson.notebook.read_text())["cells"]):
            yield (
                f"{report.relative(lesson.notebook)} cell {i}",
                "".join(cell["source"]),
                cell["cell_type"] == "markdown",
            )


def _course_text():
    """(where, text) for every text file a learner can open: drills/ (but drills/mine, whose pristine stubs
    _learner_facing_text reads), notebooks/ with their outputs, README, CONTRIBUTING and the Makefile."""
    paths = [p for top in ("drills", "notebooks") for p in sorted((ROOT / top).rglob("*"))]
    paths += [ROOT / name for name in ("README.md", "CONTRIBUTING.md", "Makefile")]
    for path in paths:
        parts = path.relative_to(ROOT).parts
        if not path.is_file() or parts[:2] == ("drills", "mine") or "__pycache__" in parts:
            continue
        try:
            yield "/".join(parts), path.read_text()
        except UnicodeDecodeError:  # images
            continue


def _lines_naming_the_notes(where, text, prose, seed_rules=True):
    """The lines of text that name the notes; seed_rules=False checks only the word that has no other use."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        words = re.sub(r"`[^`]*`", "", line)  # code spans name functions (`seeded`), not notes
        named = NAMES_NOTES.search(line) or (prose and PROSE_SEED.search(words))
        if (seed_rules and named) or NAMES_NOTES_TALK.search(line):
            found.append(f"{where}:{n}: {line.strip()}")
    return found


def test_learner_facing_text_never_names_the_source_notes():
    found = []
    for where, text, prose in _learner_facing_text():
        found += _lines_naming_the_notes(where, text, prose)
    for where, text in _course_text():
        found += [line for line in _lines_naming_the_notes(where, text, False, False) if line not in found]
    assert not found, "learner-facing text names the source notes:\n" + "\n".join(found[:20])


# Nor does any file of the course, its tools' tests included, name an issue of the project's own tracker
# or a review's point (the word and a number): it says what the code does. An upstream project is cited
# by repository and number (`sglang issue #40903`, `PR #2114`), which this does not match. The words are
# assembled from pieces so that this file does not match itself.
ISSUE = "iss" + "ue"
NAMES_AN_ISSUE = re.compile(rf"(?i)\b(?:{ISSUE}\s+\d|{ISSUE}'s\b|po" + r"ints?\s+\d)")  # "issues 499": a verb


def _lines_naming_an_issue(where, text):
    return [
        f"{where}:{n}: {line.strip()}"
        for n, line in enumerate(text.splitlines(), 1)
        if NAMES_AN_ISSUE.search(line)
    ]


def test_no_file_names_an_issue():
    found = []
    for where, text, _ in _learner_facing_text():
        found += _lines_naming_an_issue(where, text)
    tools_tests = [(f"tests/{p.name}", p.read_text()) for p in sorted((ROOT / "tests").glob("*.py"))]
    for where, text in [*_course_text(), *tools_tests]:
        found += [line for line in _lines_naming_an_issue(where, text) if line not in found]
    assert not found, "a file names an issue instead of saying what the code does:\n" + "\n".join(found[:20])


# Every module of drills/ (references, stubs, graders and their helpers, grading, mutants, benchmarks, the
# engine) and the notebooks' code are code a learner reads as the course's own: there the word is not
# used even as a name (SamplingParams takes random_state, the graders' case makers a `stream` number,
# the grade the SEED `shift`); `SEED`, `seeded` and torch's manual_seed aside. This file alone names it.
CODE_SEED = re.compile(rf"(?<![A-Za-z_]){NOTES_WORD}(?![A-Za-z_])")


def _course_code():
    """(where, text) for every piece of course code; the stubs as committed, not as a learner edited them."""
    import json

    for lesson in LESSONS:
        yield lesson.solution, None
        yield lesson.stub, stubs.pristine_stub_source(lesson)
        for i, cell in enumerate(json.loads(lesson.notebook.read_text())["cells"]):
            if cell["cell_type"] == "code":
                yield f"{report.relative(lesson.notebook)} cell {i}", "".join(cell["source"])
    for path in sorted((ROOT / "drills").rglob("*.py")):
        if path.parent.name not in ("mine", "solutions") and path.name != Path(__file__).name:
            yield path, None  # the engine, graders and their helpers, grading, mutants, benchmarks...


def test_course_code_never_uses_the_word():
    found = []
    for where, text in _course_code():
        if text is None:
            text = where.read_text()
            where = where.relative_to(ROOT)
        for n, line in enumerate(text.splitlines(), 1):
            if CODE_SEED.search(line):
                found.append(f"{where}:{n}: {line.strip()}")
    assert not found, "the word appears in code a learner reads:\n" + "\n".join(found[:20])
    assert CODE_SEED.search(f"    {NOTES_WORD}: int | None = None") and not CODE_SEED.search("seeded(5) SEED")


def test_source_notes_check_can_fail():
    for line in (
        f"## 2. By hand: the {NOTES_WORD}'s example",
        f"The {NOTES_WORD} notes measured 176 us",
        f"def test_{NOTES_WORD}_trace():",
    ):
        assert NAMES_NOTES.search(line) or PROSE_SEED.search(line), line
    assert not PROSE_SEED.search("`SEED=7 make test L=t1` grades other ones")
    planted = "\n".join(
        (
            f"The {NOTES_TALK} measured its kernel on an RTX 5090 at 176 us.",
            f"FlashAttention-2, the {NOTES_TALK.upper()}R's version and this kernel",
            f'    ids=["group4", "group4-{NOTES_TALK}", "group8"],',
            f'    Mutant("interleaved", pitfall="1. as in the {NOTES_TALK}s", old="h // G", new="h % G"),',
        )
    )
    found = _lines_naming_the_notes("drills/mutants/planted.py", planted, False, seed_rules=False)
    assert len(found) == 4, found
    issue, point = ISSUE, "po" + "int"
    planted = f"N = 60  # {issue} 10: a screen\n# --- Cheats ({issue} 11 {point} 1) ---\n(see {point} 4)"
    planted += f"\n# (M, N): the {issue}'s three shapes"
    assert len(_lines_naming_an_issue("tests/planted.py", planted)) == 4
    upstream = f"sglang {issue} #40903, PR #2114; the loop {issue}s 499 of them"
    assert _lines_naming_an_issue("x.md", upstream) == []
    assert _lines_naming_the_notes("README.md", "Measured on an RTX 5090, a kernel takes 176 us.", True) == []


# --- The notebooks: your file once it passes its grader, the reference until then ------------------


def test_notebook_imports_your_file_only_once_it_passes(mine):
    from drills.notebook import implementation

    name = f"drills._learner_{T1.stem}"  # where stubs.load_from_file puts the learner's module
    sys.modules.pop(name, None)
    module, note = implementation("t1")  # the untouched stub: not graded, not imported
    assert module.__name__ == T1.module("solutions") and "REFERENCE" in note and "not started" in note, note
    solve_t1(mine, TORCH_FALLBACK)  # right numbers, no kernel: graded failing
    module, note = implementation("t1")
    assert module.__name__ == T1.module("solutions") and "is failing: " in note, note
    assert name not in sys.modules, "a failing file was imported into the notebook's process"
    solve_t1(mine)  # a copy of the reference: graded passing, then imported from that copy
    module, note = implementation("t1")
    assert "runs YOUR" in note and module.__file__ == str(mine / f"{T1.stem}.py"), note


# --- Stages: F1 and T5 graded step by step (their graders' STAGES) -------------------------------


def test_a_case_belongs_to_the_stage_that_names_it_most_closely():
    from drills.grading.grader.report import Case, Stage, stage_line, stage_of

    stages = [
        Stage("one", ("test_a", "*noncausal*")),
        Stage("two", ("test_b", "*causal*")),
        Stage("three", ("test_c", "test_b[late]")),
    ]
    assert [stage_of(i, stages) for i in ("test_a[causal]", "test_x[noncausal]", "test_x[causal]")] == [
        0,
        0,
        1,
    ]
    assert [stage_of(i, stages) for i in ("test_c[causal]", "test_b[late]", "test_b[early]")] == [2, 2, 1]
    assert stage_of("test_unnamed", stages) == 2  # the last stage: all stages passed means all checks did
    cases = [Case("test_a", "test_a", "passed"), Case("test_b[x]", "test_b", "failed")]
    assert stage_line(cases, stages) == "Stage 2 of 3: two (stage 1 one passed)"
    cases[1].outcome = "passed"
    assert stage_line(cases + [Case("test_c", "test_c", "skipped")], stages).startswith("all 3 stages passed")


@pytest.mark.parametrize("lesson_id", ["t5", "f1"])
def test_every_stage_names_checks_its_grader_has(lesson_id):
    """A renamed check would fall silently into the last stage: every pattern without a wildcard must
    name a test of the grader."""
    import importlib

    lesson = find(lesson_id)
    grader = importlib.import_module(f"drills.tests.{lesson.tests.stem}")
    stages = report.lesson_stages(lesson)
    assert len(stages) == 3 and stages == grader.STAGES
    for stage in stages:
        for pattern in stage.patterns:
            if "*" not in pattern and "?" not in pattern:
                assert callable(getattr(grader, pattern.split("[", 1)[0], None)), f"{stage.title}: {pattern}"


def test_untouched_staged_stubs_say_stage_1_is_not_started(mine):
    grades = {g.lesson.id: g for g in learner.progress_grades()}  # untouched: nothing graded
    assert grades["t5"].status == "not started (stage 1 of 3, non-causal, comes first)"
    assert grades["f1"].status == "not started (stage 1 of 3, merge, comes first)"
    assert grades["t1"].status == "not started"  # a lesson without stages says nothing new
    result = pytest_run.grade(find("t5"), file=mine / f"{find('t5').stem}.py")  # what make test prints
    assert result.state == "not started" and "Stage 1 of 3: non-causal, not started" in result.message
    assert "next, stage 2 causal" in result.message


def _solution_with_stub_raise(lesson, function: str) -> str:
    """The lesson's solution with `function` left as the stub has it: raising its NotImplementedError."""
    import ast

    stub, source = stubs.pristine_stub_source(lesson), lesson.solution.read_text()

    def function_node(text):
        return next(
            n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == function
        )

    stub_raise = next(n for n in ast.walk(function_node(stub)) if isinstance(n, ast.Raise))
    lines = source.splitlines()
    docstring_end = function_node(source).body[0].end_lineno
    lines.insert(docstring_end, "    " + ast.get_source_segment(stub, stub_raise))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "lesson_id,partial,checks,stage",
    [
        (
            "t5",
            "causal not done",  # every call runs non-causal, as before the causal TODO
            "test_worked_example_O1 or test_last_key_block_is_masked or test_first_causal_row or group2",
            "Stage 2 of 3: causal (stage 1 non-causal passed)",
        ),
        (
            "f1",
            "plan() not started",  # merge_states and the kernels done, plan() still the stub's raise
            "test_merge_states_equals or test_lse_is_natural_log or test_plan_splits_only",
            "Stage 2 of 3: fixed splits (stage 1 merge passed)",
        ),
    ],
)
def test_a_file_that_passes_stage_1_only_is_told_so(tmp_path, lesson_id, partial, checks, stage):
    lesson = find(lesson_id)
    if lesson_id == "t5":
        source = lesson.solution.read_text()
        assert source.count("CAUSAL=causal,") == 1
        source = source.replace("CAUSAL=causal,", "CAUSAL=False,")
    else:
        source = _solution_with_stub_raise(lesson, "plan")
    path = tmp_path / f"{lesson.stem}.py"
    path.write_text(source)
    result = pytest_run.grade(lesson, file=path, extra=["-k", checks])  # a few checks of each stage
    assert result.state == "failing", (partial, result.state, result.message)
    assert stage in result.screen() and f", {stage[0].lower()}{stage[1:]}" in result.status, result.screen()
    assert any(line.startswith("  stage 2 checks ") for line in result.screen())


def test_engine_runs_a_passing_file_and_says_whose_code_runs(mine):
    """make chat and LLM(use="auto"): a lesson's file of the learner's where its last make test of the file
    as it is now passed, the reference otherwise, and the start-up lines say which and why (an untouched
    stub, a file changed since its passing grade)."""
    from drills.engine import sources

    l3 = find("l3")
    shutil.copy(l3.solution, mine / f"{l3.stem}.py")  # a finished L3, graded passing below
    learner.remember(pytest_run.Grade(l3, "passing"))
    choices = sources.choose("auto")
    assert choices[l3.stem].impl == "mine" and "passes make test" in choices[l3.stem].line
    assert choices["l1_paged_kv_cache"].impl == "solutions"
    assert "not started" in choices["l1_paged_kv_cache"].line
    with open(mine / f"{l3.stem}.py", "a") as f:
        f.write("\n# changed after its grade\n")
    choices = sources.choose("auto")
    assert choices[l3.stem].impl == "solutions", "a file changed since it passed must not be trusted"
    assert "make test L=l3" in choices[l3.stem].line
    assert all(c.impl == "solutions" for c in sources.choose("solutions").values())


def test_what_follows_a_double_dash_goes_to_pytest(monkeypatch):
    """`python -m drills test l4 --impl solutions -- --durations=10`: pytest's own options after --, which
    argparse refused as unrecognised; any other command refuses them by name."""
    import drills.__main__ as cli

    seen = {}

    def fake_test(args):
        seen["args"] = args
        return 0

    monkeypatch.setattr(cli, "cmd_test", fake_test)
    assert cli.main(["test", "t1", "--impl", "solutions", "--", "--durations=3", "-x"]) == 0
    args = seen["args"]
    assert (args.lesson, args.impl, args.pytest_args) == ("t1", "solutions", ["--durations=3", "-x"])
    with pytest.raises(SystemExit):
        cli.main(["lint", "--", "x"])
