"""The diagnosis's general rules, which hold in every lesson (drills/grading/grader/diagnose.py, report.py):

- NaN or inf in a result is read as its symptom (a masked load without other=, or an exponential without
  its max shift), before a pitfall that leaves finite values;
- a function still raising the stub's NotImplementedError is "stage N not written yet: function X";
- "did not come from your kernel" is not said of a bad-input check the learner's code let through;
- no line blames the grader ("grader bug") for what the learner's code decides;
- no line is cut mid-word.

The first half feeds diagnose() results by hand (no grading); the second plants each mistake in a
reference as a mutant's token edit and grades a few checks of it, as `make test` would (a few seconds to
half a minute each, under the interpreter).
"""

from __future__ import annotations

import pytest

from drills.grading.grader import diagnose, pytest_run, report
from drills.grading.grader.diagnose import Mistake
from drills.grading.grader.report import Case, Stage
from drills.lessons import find
from drills.mutants import Mutant
from tests.test_learner_tools import _solution_with_stub_raise


def case(case_id, outcome="failed", message=""):
    return Case(case_id, case_id.split("[", 1)[0], outcome, message)


NAN_MESSAGE = "12 NaN/inf values where the reference is finite; first at [row=0, d=0] = nan"
WRONG = "relative error ||out - ref|| / ||ref|| = 0.4 (allowed 0.01); ||out|| / ||ref|| = 1.1"


# --- The rules, on results given by hand ------------------------------------------------------------


def test_nan_is_read_before_a_pitfall_that_leaves_finite_values():
    mistakes = [Mistake(5, fails=("test_merge",))]  # a merge without lse: wrong, finite values
    found = diagnose.diagnose(
        [case("test_merge", message=NAN_MESSAGE), case("test_other", "passed")], mistakes
    )
    assert [f.kind for f in found] == ["nan", ""] and found[1].pitfall == 5, found
    assert "without other=" in found[0].title and "max shift" in found[0].title
    # The same pitfall with finite wrong values is named first, as before.
    found = diagnose.diagnose([case("test_merge", message=WRONG)], mistakes)
    assert found[0].pitfall == 5 and found[0].consistent


def test_a_pitfall_that_claims_nan_is_still_named_first():
    mistakes = [Mistake(5, fails=("test_merge",)), Mistake(10, fails=("test_empty",), messages=("NaN",))]
    cases = [case("test_merge", message=NAN_MESSAGE), case("test_empty", message=NAN_MESSAGE)]
    assert diagnose.diagnose(cases, mistakes)[0].pitfall == 10


def test_a_pitfall_whose_look_alikes_pass_keeps_its_nan():
    # Its look-alike passed: the NaN is this pitfall's own (an overflow only its check provokes).
    mistakes = [Mistake(4, fails=("test_lse_beyond_exp_range",), passes=("test_merge",))]
    cases = [case("test_lse_beyond_exp_range", message=NAN_MESSAGE), case("test_merge", "passed")]
    assert diagnose.diagnose(cases, mistakes)[0].pitfall == 4


def test_nan_with_no_pitfall_consistent_is_named_as_nan():
    mistakes = [Mistake(3, fails=("test_big",), passes=("test_small",))]
    cases = [case("test_big", message=NAN_MESSAGE), case("test_small", message=NAN_MESSAGE)]
    found = diagnose.diagnose(cases, mistakes)
    assert found[0].kind == "nan", found


RACE = (
    "write race: the same call gave different results with the kernel's programs run in reverse order "
    "(argument `out`: 64 elements differ)"
)


def test_a_write_race_a_pitfall_names_is_that_pitfall_first():
    """A write race is the harness's sight of a mistake: where no pitfall is consistent but one's own
    messages name the race (an lse stored over out when none was asked for), that pitfall comes first and
    the race after it; with the race's message kept as the pitfall's evidence."""
    mistakes = [
        Mistake(7, fails=("test_shapes",)),
        Mistake(23, fails=("test_lse_not_stored",), messages=(r"write race|WRITE_LSE = False",)),
    ]
    cases = [
        case("test_split_ranges", message=RACE),
        case("test_lse_not_stored", "passed"),
        case("test_shapes", "passed"),
    ]
    found = diagnose.diagnose(cases, mistakes)
    assert [f.pitfall for f in found] == [23, 0] and found[1].kind == "write_race", found
    assert any("write race" in line for line in found[0].evidence), found
    # No pitfall names the race: the race is the finding, as before.
    found = diagnose.diagnose(cases, [Mistake(7, fails=("test_shapes",))])
    assert found[0].kind == "write_race", found


NOT_STARTED = (
    "your code raised NotImplementedError at {path}:{line} (`raise NotImplementedError(`): f2 is not "
    "started: fill in plan() and the kernels in drills/mine/f2_cascade_decode.py, then delete this line"
)


def test_a_stage_not_written_names_the_stage_and_the_function(tmp_path):
    path = tmp_path / "f2_cascade_decode.py"
    path.write_text(
        "def merge():\n    return 1\n\n\ndef plan(x):\n    '''doc'''\n    raise NotImplementedError('no')\n"
    )
    raised = NOT_STARTED.format(path=path, line=7)
    stages = [
        Stage("merge", ("test_merge*",)),
        Stage("cuts", ("test_plan*",)),
        Stage("planner", ("test_auto",)),
    ]
    cases = [
        case("test_merge_a", "passed"),
        case("test_plan_a", message=raised),
        case("test_auto", message=raised),
    ]
    mistakes = [Mistake(5, fails=("test_plan_a",))]  # it fits the pattern, and says nothing here
    found = diagnose.diagnose(cases, mistakes, stages=stages)
    assert [(f.kind, f.title) for f in found] == [("not_written", "stage 2 not written yet: function plan")]
    # Unstaged: the same words without a stage; and a real failure beside it is diagnosed first.
    assert diagnose.diagnose(cases, [])[0].title == "not written yet: function plan"
    cases.append(case("test_merge_b", message=WRONG))
    assert diagnose.diagnose(cases, [Mistake(1, fails=("test_merge_b",))])[0].pitfall == 1


FLOATS = (
    "the output did not come from your kernel: torch computed floats during the call (torch's max); the "
    "launcher may allocate, view, copy and convert tensors, and the kernel computes"
)


def test_bad_input_let_through_is_a_missing_check_not_a_kernel_that_is_not_yours():
    cases = [
        case("test_plan_rejects_bad_arguments[lengths_float_tensor]", message=FLOATS),
        case("test_x", "passed"),
    ]
    found = diagnose.diagnose(cases, [])
    assert [f.kind for f in found] == ["not_refused"], found
    assert not any("did not come from your kernel" in line for line in (found[0].title, *found[0].evidence))
    # On a check that passes valid input, torch computing the answer is still said to be that.
    found = diagnose.diagnose([case("test_worked_example", message=FLOATS)], [])
    assert found[0].kind == "not_from_kernel"


def test_a_return_that_is_not_the_specs_is_named_as_such():
    import torch

    out, lse = torch.zeros(3, 2, 4, dtype=torch.float16), torch.zeros(3, 2)
    spec = (("out", (3, 2, 4), torch.float16), ("lse", (3, 2), torch.float32))
    assert diagnose.returned_problem("f", (out, lse), spec) is None
    assert "(lse, out) where (out, lse) belongs" in diagnose.returned_problem("f", (lse, out), spec)
    assert "None as lse" in diagnose.returned_problem("f", (out, None), spec)
    assert "as float32 where float16" in diagnose.returned_problem("f", out.float(), spec[:1])
    assert "a tuple (" in diagnose.returned_problem("f", (out, None), spec[:1])
    # Named before a pitfall whose checks it fails too, and never as "did not come from your kernel".
    wrong = diagnose.returned_problem("softmax", (out, None), spec[:1])
    mistakes = [Mistake(5, fails=("test_rows",))]
    found = diagnose.diagnose([case("test_rows", message=wrong), case("test_x", "passed")], mistakes)
    assert [f.kind for f in found] == ["returned"] and wrong in found[0].evidence, found


def test_a_launcher_that_returns_other_than_out_is_named_as_such():
    import torch

    out = torch.zeros(10)
    assert diagnose.returned_out_problem("vector_add", out, out) is None
    assert "returned None where the `out`" in diagnose.returned_out_problem("vector_add", None, out)
    fresh = diagnose.returned_out_problem("vector_add", out.clone(), out)
    assert "a float32 tensor of shape (10,) at other memory than out's" in fresh
    # The launcher's forgotten return fails the by-hand grid check too: the return is named, not the grid.
    mistakes = [Mistake(2, fails=("test_grid",), passes=("test_kernel",))]
    cases = [
        case("test_grid", message=fresh),
        case("test_rows", message=fresh),
        case("test_kernel", "passed"),
    ]
    found = diagnose.diagnose(cases, mistakes)
    assert [f.kind for f in found] == ["returned"], found


@pytest.mark.parametrize(
    "message",
    [
        "your code did not return within 120 s during this check (an endless loop?), in x.py line 3",
        "your code raised RecursionError at mine/t1.py:51 (`n = x.numel()`): maximum recursion depth exceeded",
        "your code ended the process that runs it (signal 11)",
    ],
)
def test_a_check_the_code_never_came_back_from_names_no_pitfall(message):
    # Every launch stops the same way: the pitfall whose checks happen to be among them is not the
    # finding (the kernel-only check it needs to pass passes, since it never calls the launcher).
    mistakes = [Mistake(2, fails=("test_grid",), passes=("test_kernel",))]
    cases = [case(f"test_{n}", message=message) for n in ("grid", "rows", "dtypes")]
    found = diagnose.diagnose(cases + [case("test_kernel", "passed")], mistakes)
    assert found and found[0].pitfall == 0 and found[0].kind in ("timeout", "recursion", "crash"), found
    assert found[0].kind in report.GENERIC_TODO, found  # what to do, not a section of another mistake
    # A pitfall whose own messages name the stop is still named.
    named = [Mistake(2, fails=("test_grid",), messages=(message.split(" (")[0][:25],))]
    assert diagnose.diagnose(cases, named)[0].pitfall == 2
    # One check stopping among many wrong values says nothing against the pitfall they show.
    mixed = [case("test_grid", message=message)] + [case(f"test_{n}", message=WRONG) for n in ("a", "b")]
    assert diagnose.diagnose(mixed + [case("test_kernel", "passed")], mistakes)[0].pitfall == 2


@pytest.mark.parametrize(
    "message",
    [
        "TypeError: softmax() got an unexpected keyword argument 'out'",
        "TypeError: softmax() missing 1 required positional argument: 'x'",
        "TypeError: softmax() takes 1 positional argument but 2 were given",
    ],
)
def test_a_call_that_does_not_fit_the_signature_names_the_signature(message):
    # The dropped `out` parameter fails the by-hand check of a pitfall too: the signature is named.
    mistakes = [Mistake(5, fails=("test_hand",), passes=("test_kernel",))]
    cases = [case(f"test_{n}", message=message) for n in ("hand", "rows", "dtypes")]
    found = diagnose.diagnose(cases + [case("test_kernel", "passed")], mistakes)
    assert [f.kind for f in found] == ["signature"] and found[0].kind in report.GENERIC_TODO, found
    # A TypeError the learner's own line raised is not the signature's.
    own = "your code raised TypeError at mine/t2.py:9 (`x = y + 1`): unsupported operand"
    cases = [case(f"test_{n}", message=own) for n in ("hand", "rows", "dtypes")]
    assert diagnose.diagnose(cases + [case("test_kernel", "passed")], mistakes)[0].kind != "signature"


def test_no_line_blames_the_grader_for_the_learners_code():
    lesson = find("c1")
    failed = case("test_preemption", message="no request was preempted (grader bug?)")
    found = [report.finding_dict(f) for f in diagnose.diagnose([failed], [])]
    screen = report.render(lesson, [failed], "drills/mine/c1_engine.py", 0, True, found)
    assert not any("grader bug" in line for line in screen), screen
    assert any("no request was preempted" in line for line in screen), screen


def test_lines_are_cut_at_a_word_boundary():
    text = "  " + " ".join(["the kernel computed a length"] * 12)
    cut = report.clip(text, 100)
    assert len(cut) <= 100 and cut.endswith("...")
    assert text.startswith(cut[:-3]) and text[len(cut) - 3] == " ", cut  # the next character is a space


# --- The rules, on planted mistakes graded as `make test` grades a learner's file ------------------------


def plant(lesson_id, tmp_path, *edits, source=None):
    """The lesson's reference (or `source`) with each (old, new) token edit applied, as a learner's file."""
    lesson = find(lesson_id)
    text = source if source is not None else lesson.solution.read_text()
    for i, (old, new) in enumerate(edits):
        text = Mutant(f"planted{i}", "0. planted", old, new).apply(text)
    path = tmp_path / f"{lesson.stem}.py"
    path.write_text(text)
    return lesson, path


F2_LSE_LOAD = (
    'lse = tl.load(lse_part_ptr + b * stride_lb + h * stride_lh + slot, mask=s_mask, other=float("-inf"))'
)


@pytest.mark.parametrize(
    "lesson_id,edits,checks",
    [
        (  # the merge's lse loaded without other=: the masked-off slots read NaN
            "f2",
            [(F2_LSE_LOAD, F2_LSE_LOAD.replace(', other=float("-inf")', ""))],
            "test_merge_states_equals_one_shot_softmax",
        ),
        (  # the merge weighs each part by e^lse itself: fp32 overflows past lse = 88
            "f2",
            [
                (
                    'm_ref = tl.where(m_new == float("-inf"), 0.0, m_new)',
                    'm_ref = tl.where(m_new == float("-inf"), 0.0, 0.0)',
                ),
                (
                    'lse_out = tl.where(seen, m + tl.log(w_safe), float("-inf"))',
                    'lse_out = tl.where(seen, tl.log(w_safe), float("-inf"))',
                ),
            ],
            "test_merge_states_lse_beyond_fp32_exp_range or test_merge_states_equals_one_shot_softmax",
        ),
    ],
    ids=["f2_load_without_other", "f2_merge_without_max_shift"],
)
def test_planted_nan_is_named_as_nan(tmp_path, lesson_id, edits, checks):
    lesson, path = plant(lesson_id, tmp_path, *edits)
    result = pytest_run.grade(lesson, file=path, extra=["-k", checks])
    assert result.state == "failing", (result.state, result.message)
    assert result.findings[0]["kind"] == "nan", result.screen()
    assert any("a masked tl.load without other=" in line for line in result.screen())


def test_planted_stage_not_written_is_named_with_its_function(tmp_path):
    lesson = find("f2")
    path = tmp_path / f"{lesson.stem}.py"
    path.write_text(_solution_with_stub_raise(lesson, "plan"))
    result = pytest_run.grade(lesson, file=path, extra=["-k", "test_lse_is_natural_log"])  # a stage 2 check
    screen = result.screen()
    assert "likely mistake: stage 2 not written yet: function plan" in screen, screen
    assert not any("pitfall" in line for line in screen if line.startswith(("likely", "or else"))), screen


def test_planted_float_lengths_let_through_are_a_missing_check(tmp_path):
    lesson, path = plant(
        "f1",
        tmp_path,
        (
            "    max_len = max(lens)\n",
            "    max_len = int(context_lens.max()) if torch.is_tensor(context_lens) else max(lens)\n",
        ),
        (
            "lens = validate.decode_plan_args(\n        context_lens, num_kv_heads, page_size, num_sms, num_splits\n    )",
            "lens = validate.decode_plan_args(\n        context_lens.long() if torch.is_tensor(context_lens) else "
            "context_lens, num_kv_heads, page_size, num_sms, num_splits\n    )",
        ),
    )
    result = pytest_run.grade(lesson, file=path, extra=["-k", "test_plan_rejects_bad_arguments"])
    screen = result.screen()
    assert result.findings[0]["kind"] == "not_refused", screen
    assert not any("did not come from your kernel" in line for line in screen), screen


# --- The same classes in T4, a lesson without stages, whose pitfall 7 is the masked load's -------------


T4_ROW_LOAD = 'x = tl.load(x_row + cols, mask=cols < hi, other=float("-inf"))'


def test_planted_t4_load_without_other_is_its_masking_pitfall(tmp_path):
    lesson, path = plant("t4", tmp_path, (T4_ROW_LOAD, T4_ROW_LOAD.replace(', other=float("-inf")', "")))
    checks = "test_last_block_is_masked or test_worked_example_final_state or test_first_block_starts"
    result = pytest_run.grade(lesson, file=path, extra=["-k", checks])
    assert result.findings[0]["pitfall"] == 7, result.screen()


def test_planted_t4_function_not_written_is_named(tmp_path):
    lesson = find("t4")
    path = tmp_path / f"{lesson.stem}.py"
    path.write_text(_solution_with_stub_raise(lesson, "merge_stats"))
    result = pytest_run.grade(
        lesson, file=path, extra=["-k", "test_merge_shifts or test_worked_example_final_state"]
    )
    assert "likely mistake: not written yet: function merge_stats" in result.screen(), result.screen()


def test_bad_input_that_launched_or_refused_unnamed_is_a_missing_check():
    """A bad-input check that fails because nothing raised (a kernel ran on it), or because the error does
    not name the argument, is the launcher's check, whoever wrote its first version (a stub's given
    overlap check the learner edited): never "a check failed that no pitfall explains"."""
    launched = "Failed: DID NOT RAISE <class 'ValueError'>"
    found = diagnose.diagnose(
        [case("test_launcher_rejects_bad_input[out_partly_overlaps_x]", message=launched)], []
    )
    assert [(f.kind, f.title) for f in found] == [("not_refused", diagnose.NOT_REFUSED_TITLE)], found
    unnamed = "AssertionError: Regex pattern did not match.\n Regex: 'out overlaps x'\n Input: 'bad out'"
    found = diagnose.diagnose([case("test_launcher_rejects_bad_input[out_at_x]", message=unnamed)], [])
    assert [(f.kind, f.title) for f in found] == [("not_refused", diagnose.UNNAMED_REFUSAL_TITLE)], found
    # Beside a failing check of valid input, the kernel's failure is the finding, not the missing check.
    found = diagnose.diagnose(
        [
            case("test_launcher_rejects_bad_input[x]", message=launched),
            case("test_rows_sum_to_one", message=WRONG),
        ],
        [],
    )
    assert "not_refused" not in [f.kind for f in found], found
