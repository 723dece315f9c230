"""Tests of the grading harness (drills/grading): the learner's code runs in a process of its own, every
kernel launch is checked there (bounds, program order, provenance), and what a learner reads is one
screen that names the mistake. Not a lesson's grader: it runs in `make check`.

Each test writes a learner file into tmp_path, built from T1's solution with a small edit (L3's where a
pure-Python lesson is needed), and grades it as `make test` does, in a child pytest, with `-k` narrowed
to the checks the test needs: a whole T1 grading takes tens of seconds under the interpreter. The real
drills/mine and drills/solutions files are never written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from drills import learner
from drills.grading.grader import diagnose, fork_server, pytest_run
from drills.grading.grader.learner_client import ImportFailed, LearnerProcess, RemoteObject
from drills.grading.grader.report import Case
from drills.lessons import ROOT, find
from drills.mutants import load_mutants
from tests import markers

T1, L3 = find("t1"), find("l3")
SCREEN_LINES = 60  # the summary fits on one screen
CANARY = 1234.5  # exactly representable in fp32
T1_STORE = "tl.store(out_ptr + offs, x + y, mask=mask)"  # the store of T1's kernel
RUNTIME = markers.RUNTIME
# The harness checks every load and store lane and visits programs in reverse only in the interpreter;
# on a GPU the same kernels write past their tensors, or hang the device, for real.
interpreter_only = markers.interpreter_only(
    "the harness checks bounds, program order and endless kernels only under the Triton interpreter (CPU)"
)


# --- Building and grading learner files --------------------------------------------------------


def t1_source(old: str | None = None, new: str = "", extra: str = "") -> str:
    """T1's solution with `old` replaced by `new`, and `extra` appended."""
    source = T1.solution.read_text()
    if old is not None:
        assert source.count(old) == 1, f"T1's solution no longer holds {old!r} exactly once: update this test"
        source = source.replace(old, new)
    return source + extra


def t1_mutant(name: str) -> tuple[str, int]:
    """(T1's solution with the named mutant applied, the number of the pitfall it stands for)."""
    mutant = next(m for m in load_mutants(T1.stem) if m.name == name)
    return mutant.apply(T1.solution.read_text()), int(mutant.pitfall.split(".", 1)[0])


def write_learner_file(folder, source: str, stem: str = T1.stem):
    path = folder / f"{stem}.py"
    path.write_text(source)
    return path


def grade_t1(folder, source: str, *checks: str, checked: bool = False) -> pytest_run.Grade:
    """Grade `source` as the learner's T1 file, running only the named checks (a -k expression each).
    The static check (source_check.py), which refuses open(), os and ctypes before anything runs, is
    passed by unless `checked`: these tests are about the layers behind it (the sandbox, the recorder,
    the evidence), which must hold on their own."""
    extra = ["-k", " or ".join(checks)] + ([] if checked else ["--drills-skip-source-check"])
    result = pytest_run.grade(T1, file=write_learner_file(folder, source), extra=extra)
    if result.state in ("passing", "failing"):
        ran = {c.id for c in result.cases} | {c.check for c in result.cases}
        missing = [c for c in checks if c not in ran]
        assert not missing, f"no such check in T1's grader any more: {missing}; update this test"
    return result


def one_screen(result: pytest_run.Grade) -> str:
    lines = result.screen()
    assert len(lines) < SCREEN_LINES, f"the summary takes {len(lines)} lines:\n" + "\n".join(lines)
    return "\n".join(lines)


def failures(result: pytest_run.Grade) -> dict[str, str]:
    """case id -> failure message, for the cases that failed."""
    return {c.id: c.message for c in result.cases if c.outcome == "failed"}


def outcome(result: pytest_run.Grade, check: str) -> set[str]:
    return {c.outcome for c in result.cases if c.check == check}


def words(text: str) -> str:
    """Whitespace collapsed, so text wrapped for the terminal compares with the text it came from."""
    return " ".join(text.split())


# --- Cheats: each must fail with a message a learner understands ---------------------------------

SOLUTION = str(T1.solution)
CHEATS_AT_IMPORT = {
    # The reference re-exported: the import itself is refused, before any relabelling could run.
    "imports_the_reference": (
        "from drills.solutions.t1_vector_add import *  # noqa: F401,F403\n",
        "imports drills.solutions",
    ),
    # The reference's source read and run from the learner's file.
    "execs_the_reference_source": (f"exec(open({SOLUTION!r}).read())\n", "calls exec()"),
    # The same through a name the static check cannot read: refused when it opens the file.
    "reads_the_reference_source": (f"_text = open({SOLUTION!r}).read()\n", "may not read"),
    # Another program asked for the reference.
    "cats_the_reference": (
        t1_source(extra=f"\nimport subprocess\nsubprocess.run(['cat', {SOLUTION!r}])\n"),
        "may not start programs",
    ),
    # The process ended before any check could run: once graded as passing with only the banner printed.
    "os_exit_0": (t1_source(extra="\nimport os\nos._exit(0)\n"), "ended the process"),
    "sys_exit_0": (t1_source(extra="\nimport sys\nsys.exit(0)\n"), "sys.exit(0)"),
}


@pytest.mark.parametrize("cheat", list(CHEATS_AT_IMPORT))
def test_cheat_at_import_does_not_import(tmp_path, cheat):
    source, says = CHEATS_AT_IMPORT[cheat]
    # The first two are the static check's to refuse, with its words; the others the sandbox's.
    static = cheat in ("imports_the_reference", "execs_the_reference_source")
    result = grade_t1(tmp_path, source, "test_by_hand_lane_11_is_masked", checked=static)
    screen = one_screen(result)
    assert result.state == "does not import", screen
    assert not result.passed and not result.cases
    assert says in result.message and str(tmp_path) in result.message, screen


def test_hard_link_to_the_reference_is_refused(tmp_path):
    """The reference read through a hard link made next to the learner's file (the path differs, the file
    is the same), then run under the learner file's name so its kernel counts as the learner's."""
    source = (
        "import os\n"
        "_link = os.path.join(os.path.dirname(__file__), 'reference_link.py')\n"
        f"os.link({SOLUTION!r}, _link)\n"
        "exec(compile(open(_link).read(), __file__, 'exec'))\n"
    )
    process = LearnerProcess(write_learner_file(tmp_path, source), f"drills._graded_{T1.stem}")
    try:
        with pytest.raises(ImportFailed, match="may not"):
            process.start()
    finally:
        process.close()


def test_torch_answer_beside_a_decoy_kernel_did_not_come_from_your_kernel(tmp_path):
    """Right numbers from torch, and a kernel of the learner's file launched to look like work."""
    decoy = """

@triton.jit
def _decoy_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n)  # reads, writes nothing


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    _decoy_kernel[(1,)](x, x.numel(), BLOCK=BLOCK)
    return torch.add(x, y, out=out)
"""
    result = grade_t1(tmp_path, t1_source(extra=decoy), "test_runs_a_triton_kernel")
    screen = one_screen(result)
    assert result.state == "failing", screen
    assert "did not come from your kernel" in failures(result)["test_runs_a_triton_kernel"]
    assert result.findings[0]["kind"] == "not_from_kernel" and "did not come from your kernel" in screen


def test_torch_answer_beside_a_copy_kernel_did_not_come_from_your_kernel(tmp_path):
    """A kernel that really stores (x copied into a scratch tensor), and torch computing the answer from
    the copy: turning launches off changes the result, but what the call returns is not what a launch
    stored. Also the same answer behind a kernel that only checks whether launches run."""
    copy = """

@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    scratch = torch.empty_like(x)
    _copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, scratch, x.numel(), BLOCK=1024)
    return torch.add(scratch, y, out=out)
"""
    result = grade_t1(tmp_path, t1_source(extra=copy), "test_runs_a_triton_kernel")
    screen = one_screen(result)
    assert result.state == "failing", screen
    message = failures(result)["test_runs_a_triton_kernel"]
    assert "does not hold what a launch stored" in message or "torch computed floats" in message, screen
    assert result.findings[0]["kind"] == "not_from_kernel", screen


def test_wrong_kernel_fails_with_the_comparison_helpers_replaced(tmp_path):
    """x - y, and drills.compare's helpers replaced by no-ops from the learner's file: the comparison runs
    in the grader's process, which the learner's file never reaches."""
    forge = """
import drills.compare
drills.compare.mismatch = lambda *args, **kwargs: None
drills.compare.assert_close = lambda *args, **kwargs: None
"""
    source = t1_source(T1_STORE, T1_STORE.replace("x + y", "x - y"), extra=forge)
    result = grade_t1(tmp_path, source, "test_out_is_allocated_when_not_given")
    screen = one_screen(result)
    assert result.state == "failing", screen
    assert "relative error" in failures(result)["test_out_is_allocated_when_not_given"], screen


# --- Kernels that crash, hang, race or write out of bounds: graded, never fatal ------------------


def test_store_without_a_mask_is_graded_on_one_screen(tmp_path):
    source, pitfall = t1_mutant("store_unmasked")
    result = grade_t1(
        tmp_path,
        source,
        "test_by_hand_lane_11_is_masked",
        "test_by_hand_store_stops_at_element_9",
        "test_last_block_is_masked[n1]",
    )
    screen = one_screen(result)
    assert result.state == "failing", screen
    assert failures(result) and all(
        re.search(r"canary|out of bounds|past n", m) for m in failures(result).values()
    ), screen
    assert result.findings[0]["pitfall"] == pitfall, screen
    assert f"likely mistake: pitfall {pitfall}" in screen


@interpreter_only
def test_store_past_the_end_names_the_learner_line(tmp_path):
    """Every store shifted one block on: the last program writes past the end of an `out` that has no
    canary around it. The interpreter checks every lane, so this is a failed check naming the line, not
    a write into whatever memory follows."""
    source = t1_source(T1_STORE, T1_STORE.replace("out_ptr + offs", "out_ptr + offs + BLOCK"))
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "out_ptr + offs + BLOCK" in text)
    result = grade_t1(tmp_path, source, "test_by_hand_lane_11_is_masked")
    screen = one_screen(result)
    message = failures(result)["test_by_hand_lane_11_is_masked"]
    assert "out of bounds store of out_ptr" in message, screen
    assert f"{tmp_path / T1.stem}.py:{line}" in message, message
    assert result.findings[0]["kind"] == "out_of_bounds" and "out of bounds store" in screen


def test_crash_fails_its_check_and_the_next_checks_still_run(tmp_path):
    """vector_add kills its own process (as a wild store does on a GPU) after validating its arguments;
    the kernel and _launch are right, so the checks that call them after the crash must pass."""
    crash = "    import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)\n    return _launch(x, y, out)\n"
    source = t1_source("    return _launch(x, y, out)\n", crash)
    result = grade_t1(
        tmp_path,
        source,
        "test_out_is_allocated_when_not_given",
        "test_launch_rejects_block_not_a_power_of_two",
    )
    screen = one_screen(result)
    message = failures(result).get("test_out_is_allocated_when_not_given", "")
    assert "ended the process" in message and "SIGSEGV" in message, screen
    assert outcome(result, "test_launch_rejects_block_not_a_power_of_two") == {"passed"}, screen
    assert result.findings[0]["kind"] == "crash", screen


@interpreter_only
def test_endless_loop_times_out_and_the_next_checks_still_run(tmp_path, monkeypatch):
    monkeypatch.setenv("DRILLS_CALL_TIMEOUT", "5")
    source = t1_source(
        "    mask = offs < n  # [BLOCK]\n",
        "    mask = offs < n  # [BLOCK]\n    while n > 0:  # never ends\n        pass\n",
    )
    result = grade_t1(
        tmp_path, source, "test_by_hand_lane_11_is_masked", "test_launch_rejects_block_not_a_power_of_two"
    )
    screen = one_screen(result)
    message = failures(result).get("test_by_hand_lane_11_is_masked", "")
    assert "did not return within 5 s" in message, screen
    assert "`while n > 0:  # never ends`" in message, screen  # the line that loops, from the process's stack
    assert outcome(result, "test_launch_rejects_block_not_a_power_of_two") == {"passed"}, screen
    assert result.findings[0]["kind"] == "timeout", screen


@interpreter_only
def test_zeroing_the_next_block_is_a_write_race(tmp_path):
    """Each program stores its block and zeros the next one: in forward order the next program repairs
    the damage (the interpreter alone would pass it); in reverse order, or on a GPU, it does not."""
    clobber = T1_STORE + "\n    tl.store(out_ptr + offs + BLOCK, tl.zeros_like(x), mask=offs + BLOCK < n)"
    result = grade_t1(tmp_path, t1_source(T1_STORE, clobber), "test_by_hand_lane_11_is_masked")
    screen = one_screen(result)
    assert "write race" in failures(result).get("test_by_hand_lane_11_is_masked", ""), screen
    assert result.findings[0]["kind"] == "write_race", screen


# --- make mutants: gradings forked from a warm process report what a fresh one does ---------------


def reported(result: pytest_run.Grade, path) -> tuple:
    """Everything a grading reports, with the learner file's own path left out."""
    cases = [(c.id, c.outcome, c.message.replace(str(path), "<file>")) for c in result.cases]
    return result.state, cases, result.findings, result.message


@pytest.mark.skipif(
    fork_server.unavailable() is not None,
    reason=f"make mutants forks no gradings here: {fork_server.unavailable()}",
)
def test_warm_gradings_report_what_fresh_ones_do(tmp_path, monkeypatch):
    """make mutants forks each grading, and each learner process, from warm processes that imported
    torch and Triton once (drills/grading/grader/fork_server.py). A mistake and a crash must be reported
    exactly as a fresh `make test` reports them; an endless loop times out, and the next check runs in a
    new process."""
    crash = "    import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)\n    return _launch(x, y, out)\n"
    endless = "    mask = offs < n  # [BLOCK]\n    while n > 0:  # never ends\n        pass\n"
    files = {
        "grid_floor": (t1_mutant("grid_floor")[0], "test_by_hand_grid_has_three_programs"),
        "crash": (
            t1_source("    return _launch(x, y, out)\n", crash),
            "test_out_is_allocated_when_not_given",
        ),
        "endless": (t1_source("    mask = offs < n  # [BLOCK]\n", endless), "test_by_hand_lane_11_is_masked"),
    }
    with fork_server.GradingPool() as pool:
        for name, (source, check) in files.items():
            # The short limit is for the endless loop alone: on a loaded 2-core machine a correct call's
            # first interpretation can take longer than 3 s. The pool passes each grading's environment on.
            if name == "endless":
                monkeypatch.setenv("DRILLS_CALL_TIMEOUT", "3")
            else:
                monkeypatch.delenv("DRILLS_CALL_TIMEOUT", raising=False)
            folder = tmp_path / name
            folder.mkdir()
            path = write_learner_file(folder, source)
            checks = ["-k", f"{check} or test_launch_rejects_block_not_a_power_of_two"]
            checks.append("--drills-skip-source-check")  # the crash imports signal, which it refuses
            forked = pytest_run.grade(T1, file=path, extra=checks, pool=pool)
            assert outcome(forked, check) == {"failed"}, one_screen(forked)
            assert outcome(forked, "test_launch_rejects_block_not_a_power_of_two") == {"passed"}, name
            if name != "endless":  # the fresh grading of a hang is test_endless_loop_times_out_...
                assert reported(forked, path) == reported(
                    pytest_run.grade(T1, file=path, extra=checks), path
                ), name
    assert pool.proc.returncode == 0, "the warm process did not end cleanly"
    message = failures(forked)["test_by_hand_lane_11_is_masked"]
    assert "did not return within 3 s" in message, message


# --- What the learner reads: one screen by default, pytest's own lines with VERBOSE --------------


def test_verbose_prints_pytest_lines_and_the_default_one_screen():
    check = "test_by_hand_lane_11_is_masked"
    env = dict(os.environ, PYTEST_ADDOPTS=f"-k {check}")  # the whole T1 grader is tens of seconds here
    env.pop(pytest_run.VERBOSE_ENV, None)
    cmd = [sys.executable, "-m", "drills", "test", "t1", "--impl", "solutions"]
    runs = {
        "default": subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ),
        "VERBOSE=1": subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=dict(env, **{pytest_run.VERBOSE_ENV: "1"}),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        ),
    }
    out = {name: proc.communicate(timeout=300)[0] for name, proc in runs.items()}
    assert runs["default"].returncode == 0, out["default"]
    assert f"pass  {check}" in out["default"] and "t1: passing" in out["default"], out["default"]
    assert "PASSED" not in out["default"] and len(out["default"].splitlines()) < SCREEN_LINES, out["default"]
    assert runs["VERBOSE=1"].returncode == 0, out["VERBOSE=1"]
    assert re.search(rf"{check} PASSED", out["VERBOSE=1"]), out["VERBOSE=1"]


# --- make hint follows the diagnosed mistake -----------------------------------------------------


def test_hint_follows_the_diagnosed_mistake(tmp_path, monkeypatch, capsys):
    """A T1 file with the grid rounded down: the first hint is the diagnosed pitfall's question, the
    second goes on from it without grading again, and RESTART goes back to the first."""
    source, pitfall = t1_mutant("grid_floor")
    mine = tmp_path / "mine"
    mine.mkdir()
    write_learner_file(mine, source)
    monkeypatch.setenv(learner.MINE_DIR_ENV, str(mine))
    monkeypatch.setenv(learner.STATE_DIR_ENV, str(tmp_path / "state"))
    # The two checks that tell this mistake from an unmasked kernel; the whole grader takes far longer.
    monkeypatch.setenv(
        "PYTEST_ADDOPTS",
        "-k 'test_by_hand_grid_has_three_programs or test_by_hand_kernel_masks_lanes_10_and_11'",
    )

    def hint(restart=False):
        assert learner.hint(T1, restart=restart) == 0
        return capsys.readouterr().out

    first = hint()
    finding = learner.last_grade(T1)["findings"][0]  # the file is unchanged: the grading just remembered
    assert finding["pitfall"] == pitfall and finding["question"], finding
    assert "hint 1 of" in first and f"pitfall {pitfall}" in first, first
    assert words(finding["question"]) in words(first), first
    second = hint()
    assert "hint 2 of" in second and f"pitfall {pitfall}" in second, second
    assert "does the same" not in second, "an unchanged file must not be graded again:\n" + second
    assert "hint 1 of" in hint(restart=True)


# --- The proxy: the learner's module in its own process behaves as if it were here ---------------


@pytest.fixture
def remote(tmp_path):
    """start(lesson) -> the lesson's solution, copied as a learner file, served by its own process."""
    processes = []

    def start(lesson, extra=""):
        path = write_learner_file(tmp_path, lesson.solution.read_text() + extra, lesson.stem)
        process = LearnerProcess(path, f"drills._graded_{lesson.stem}")
        processes.append(process)
        process.start()
        return process.module, path

    yield start
    for process in processes:
        process.close()


def test_proxy_writes_into_views_of_the_graders_tensors(remote):
    impl, _ = remote(T1)
    n = 10
    x = torch.arange(n, dtype=torch.float32, device=RUNTIME.device)  # [n]
    y = 10 * x  # [n]
    buffer = torch.full((3, n + 4), CANARY, device=RUNTIME.device)  # [3, n + 4]
    out = buffer[1, 2 : 2 + n]  # [n], a view into the middle of the buffer: storage offset n + 6
    returned = impl.vector_add(x, y, out=out)
    assert returned.data_ptr() == out.data_ptr(), "a returned view of `out` must be the caller's own `out`"
    assert out.tolist() == [11.0 * i for i in range(n)], (
        "the learner's write into out did not reach the grader"
    )
    around = buffer.clone()
    around[1, 2 : 2 + n] = CANARY
    assert (around == CANARY).all(), "memory around out changed"
    # The kernel launched by hand on a view, and in place on an input: the same writes come back.
    impl.vector_add_kernel[(3,)](x, y, x, n, BLOCK=4)
    assert x.tolist() == [11.0 * i for i in range(n)]
    fresh = impl.vector_add(y, y)  # allocated in the learner's process: comes back by value
    assert fresh.tolist() == [20.0 * i for i in range(n)] and fresh.data_ptr() != y.data_ptr()


def test_proxy_raises_the_learners_value_error_naming_its_line(remote):
    impl, path = remote(T1)
    x = torch.arange(8, dtype=torch.float32, device=RUNTIME.device)  # [8]
    with pytest.raises(ValueError, match=r"y must have x's shape \(8,\), got \(7,\)") as info:
        impl.vector_add(x, x[:-1].clone())
    assert info.value.drills_where.startswith(f"{path}:"), info.value.drills_where
    # [8], stride 2: the stride travels with the view, and the learner's launcher rejects it.
    strided = torch.arange(16, dtype=torch.float32, device=RUNTIME.device)[::2]
    with pytest.raises(ValueError, match="x must be contiguous"):
        impl.vector_add(strided, x)


def test_proxy_calls_back_the_graders_hash_fn(remote):
    impl, _ = remote(L3)
    calls = []

    def hash_fn(prev_hash, token_ids):  # runs here, in the grader's process
        calls.append((prev_hash, token_ids))
        return hash((prev_hash, token_ids))

    manager = impl.BlockManager(8, 4, hash_fn=hash_fn)
    assert isinstance(manager, RemoteObject) and manager.block_size == 4
    table = manager.allocate("a", list(range(9)))  # two full blocks and one partial
    assert type(table) is list and table == [0, 1, 2]
    # Each full block is keyed from the key of the block before it (the order of the calls is the learner's).
    assert (None, (0, 1, 2, 3)) in calls and (hash((None, (0, 1, 2, 3))), (4, 5, 6, 7)) in calls, calls
    shared = manager.allocate("b", list(range(8)) + [99])  # the same two full blocks, then its own
    assert shared[:2] == table[:2] and manager.ref_count(table[0]) == 2
    with pytest.raises(ValueError, match="already allocated"):
        manager.allocate("a", [1])


USES_A_LENT_MANAGER = """

def use_lent(manager):
    # Learner code driving a block manager the grader lent: reads, calls, and the manager's own errors.
    seen = [manager.block_size, manager.num_free_blocks, manager.allocate("a", list(range(6)))]
    try:
        manager.allocate("b", list(range(100)))
    except ValueError as exc:
        seen.append(("ValueError", str(exc)))
    try:
        manager.block_table("nobody")
    except KeyError:
        seen.append("KeyError")
    seen.append(manager.allocate == manager.allocate)
    return seen, manager


def looks(manager):
    # What learner code can ask of an object's kind, without a dunder: the same for the grader's
    # lent manager as for a real one (a file that branched on it would be graded on another path).
    made = type(manager)(4, 4)
    refs = manager._ref
    counts = list(refs)
    manager.allocate("z", [1, 2, 3])
    return [
        refs is manager._ref,
        refs != counts,
        type(manager).__name__,
        str(type(manager)),
        repr(manager).split(" object at ")[0],
        type(manager.allocate).__name__,
        repr(manager.allocate).split(" of ")[0],
        manager.allocate is manager.allocate,
        hasattr(manager, "events"),
        hasattr(type(manager), "allocate"),
        str(type(made)),
        made.num_free_blocks,
        (manager._hash_fn.__name__, manager._hash_fn.__qualname__, manager._hash_fn.__module__),
    ]
"""


def test_lent_object_lives_in_the_grader_and_raises_built_in_errors(remote):
    """wire.Lent: C1's scheduler drives the grader's L3 manager, since the learner's process may not
    import the reference. Every read and call runs on the grader's own object, and the manager's
    ValueError (out of blocks) and KeyError reach the learner's `except` as themselves."""
    from drills.grading.shared import wire
    from drills.solutions.l3_prefix_cache import BlockManager

    impl, _ = remote(L3, USES_A_LENT_MANAGER)
    manager = BlockManager(8, 4)
    seen, returned = impl.use_lent(wire.Lent(manager))
    assert seen[:3] == [4, 8, [0, 1]], seen
    assert seen[3][0] == "ValueError" and "out of KV blocks" in seen[3][1], seen
    assert seen[4:] == ["KeyError", True], (
        "a method read twice is the same method; KeyError arrives as itself"
    )
    assert returned is manager, "a lent object sent back is the grader's own object"
    assert manager.block_table("a") == [0, 1] and manager.num_free_blocks == 6, "the calls ran on it"


def test_lent_object_looks_like_the_object_it_poses_as(remote):
    """A grader's recording wrapper lent as L3's BlockManager (wire.Lent(wrapper, like=manager)) reads,
    to learner code, as a real BlockManager in its process would: its type's name and text, its repr,
    its methods' type, the names it has and lacks, and its class builds a new manager."""
    from drills.grading.shared import wire
    from drills.solutions.l3_prefix_cache import BlockManager

    class Recording:  # the grader's wrapper: names of its own the learner's code must not see
        def __init__(self, manager):
            self.manager, self.events = manager, []

        def allocate(self, seq_id, token_ids):
            self.events.append(seq_id)
            return self.manager.allocate(seq_id, token_ids)

    impl, _ = remote(L3, USES_A_LENT_MANAGER)
    real = BlockManager(8, 4)
    wrapper = Recording(real)
    got = impl.looks(wire.Lent(wrapper, like=real))
    made = BlockManager(4, 4)
    want = [
        True,  # the manager's own list, the same object on every read
        True,  # and what it holds now, after a call changed it
        "BlockManager",
        str(BlockManager),
        repr(real).split(" object at ")[0],
        "method",
        repr(real.allocate).split(" of ")[0],
        False,
        False,
        True,
        str(BlockManager),
        made.num_free_blocks,
        (real._hash_fn.__name__, real._hash_fn.__qualname__, real._hash_fn.__module__),  # a function it holds
    ]
    assert got == want, (got, want)
    assert impl.use_lent(wire.Lent(wrapper, like=real))[0][2] == [1, 2] and wrapper.events == ["z", "a", "b"]


def test_lent_object_names_the_module_it_is_served_from(remote):
    """Lent with module= (C1: L3's reference lent where the engine serves with the learner's own
    BlockManager), its class, its repr and a class built from it name that module, so learner code
    cannot find the reference's module name in the grader's pool (a function's module is a dunder, which
    the source check refuses)."""
    from drills.grading.shared import wire
    from drills.solutions.l3_prefix_cache import BlockManager

    impl, _ = remote(L3, USES_A_LENT_MANAGER)
    real = BlockManager(8, 4)
    got = impl.looks(wire.Lent(real, module="drills.mine.l3_prefix_cache"))
    mine = "<class 'drills.mine.l3_prefix_cache.BlockManager'>"
    assert got[3] == mine and got[10] == mine, (got[3], got[10])
    assert got[4] == "<drills.mine.l3_prefix_cache.BlockManager", got[4]


KEEPS_ANSWERS = """
import functools

_ONES = torch.ones(4)  # a constant made at import: no call left it
_MEMO = {}


def memo_add(x, y):
    # An answer kept by shape: a later call with the same shapes would return it without computing.
    key = tuple(x.shape)
    if key not in _MEMO:
        _MEMO[key] = vector_add(x, y)
    return _MEMO[key]


def default_add(x, y, _kept=[]):
    _kept.append(vector_add(x, y))
    return _kept[-1]


def plain_add(x, y):
    return vector_add(x, y)


@functools.lru_cache(maxsize=None)
def _cached(shape, box):
    return box[0]


def lru_add(x, y):
    return _cached(tuple(x.shape), (vector_add(x, y),))


_DEEP = [[[[[[[[[[{}]]]]]]]]]]


def deep_add(x, y):
    _DEEP[0][0][0][0][0][0][0][0][0][0][tuple(x.shape)] = vector_add(x, y)
    return _DEEP[0][0][0][0][0][0][0][0][0][0][tuple(x.shape)]


def kernel_add(x, y):
    vector_add_kernel.kept = vector_add(x, y)
    return vector_add_kernel.kept


def attribute_add(x, y):
    x.kept = vector_add(x, y)
    return x.kept
"""


def test_a_tensor_kept_between_calls_is_not_from_the_kernel(remote):
    """A call that leaves a tensor in the module's state (a dict of answers, a default argument) fails:
    a later call with the same shapes could return it without computing. A constant made at import, and
    a call that keeps nothing, are fine."""
    import torch

    from drills.grading.shared.errors import NotFromKernel

    x, y = torch.randn(8), torch.randn(8)
    impl, _ = remote(T1, KEEPS_ANSWERS)
    assert torch.equal(impl.plain_add(x, y), x + y)
    with pytest.raises(NotFromKernel, match="set .kept"):
        impl.attribute_add(torch.randn(8), y)
    for fn, name in (
        ("memo_add", "_MEMO"),
        ("default_add", "default_add"),
        ("lru_add", "_cached"),
        ("deep_add", "_DEEP"),  # past any depth a walk could stop at
        ("kernel_add", "vector_add_kernel"),
    ):
        impl, _ = remote(T1, KEEPS_ANSWERS)  # a process of its own: the first kept tensor is the one named
        for _ in range(2):  # the call that keeps it, and the later one that could return it
            with pytest.raises(NotFromKernel, match=f"a call left a tensor in `{name}`"):
                getattr(impl, fn)(x, y)


COUNTS_CALLS = """
import itertools

_CALLS = [0]  # a list: no `global` statement needed
_SEEN = {"n": 0}
_TICKS = itertools.count()
_FLAG = torch.zeros(1, dtype=torch.int64)
_CACHE = {}  # a cache keyed by shapes: gains keys, never changes one


def _counted(x, y):
    _CALLS[0] += 1
    # right for the grader's first calls, something else later (or only on the call a check watches)
    return vector_add(x, y) if _CALLS[0] < 3 else vector_add(x, x)


def dict_counted(x, y):
    _SEEN["n"] += 1
    return vector_add(x, y)


def ticked(x, y):
    next(_TICKS)
    return vector_add(x, y)


def tensor_counted(x, y):
    _FLAG.add_(1)  # an int tensor: no float computed
    return vector_add(x, y)


def cached(x, y):
    _CACHE.setdefault(tuple(x.shape), 2048)
    return vector_add(x, y)


def keyed_by_call(x, y):
    _SEEN[len(_SEEN)] = 1  # a dict that gains a key on every call, alike or not: a counter
    return vector_add(x, y)


_BY = {}


def keyed_by_shape_and_count(x, y):
    _BY[(x.shape[0], len(_BY))] = 1  # a shape, and a count no argument made
    return vector_add(x, y)


def defaulted(x, y, _n=[]):
    _n.append(1)
    return vector_add(x, y)
"""


def test_a_call_that_changes_the_modules_state_is_refused(remote):
    """A launcher that counts its calls (in a list, a dict, an itertools.count, a tensor, a default
    argument) can be right for the grader's first calls and wrong later, or wrong only where no check
    compares values (a check of its loads or launches watches one call): after a first call, a call that
    changes the module's state fails, as state that lasts from one call to the next. A cache that gains
    a key per shape, and the first call's own changes (a table built lazily), are allowed."""
    import torch

    from drills.grading.shared.errors import NotFromKernel

    x, y = torch.randn(8), torch.randn(8)
    for fn, name in (
        ("_counted", "_CALLS[0]"),
        ("dict_counted", "_SEEN['n']"),
        ("ticked", "_TICKS"),
        ("tensor_counted", "_FLAG"),
        ("defaulted", "defaulted.__defaults__"),
        ("keyed_by_call", "_SEEN"),
    ):
        impl, _ = remote(T1, COUNTS_CALLS)
        getattr(impl, fn)(x, y)  # the first call may set what it sets once
        with pytest.raises(NotFromKernel, match=rf"the call changed `{re.escape(name)}"):
            getattr(impl, fn)(x, y)
    impl, _ = remote(T1, COUNTS_CALLS)
    for n in (8, 8, 16, 8, 16, 32):  # a cache keyed by the call's shapes
        assert torch.equal(impl.cached(torch.ones(n), torch.ones(n)), torch.full((n,), 2.0))
    # A key per call, a shape of its call beside a count: refused once the count is no value of the call
    # (counts 0 and 1 are a stride or a dim of these calls too)
    with pytest.raises(NotFromKernel, match=r"the call changed `_BY`"):
        for n in (8, 16, 32, 64):
            impl.keyed_by_shape_and_count(torch.ones(n), torch.ones(n))


def test_another_modules_globals_reached_through_a_kernel_are_not_kept_by_the_file():
    """On a GPU, Triton records on each compiled @triton.jit function the globals it uses, with the
    dictionary of the module that holds them (JITFunction.used_global_vals), and a kernel object holds
    its module's __globals__. The device error word is allocated in drills.device_errors' globals by a
    first GPU call: reached through record_error, it read as a tensor the reference kept, and every
    guarded lesson failed its first check on a GPU. Another module's globals are that module's state;
    the file's own container still counts."""
    import types

    import torch

    from drills.grading.learner.run_call import _held_tensors

    other = types.ModuleType("drills_other_module_for_the_walk")
    mine = types.ModuleType("drills_learner_module_for_the_walk")
    sys.modules[other.__name__], sys.modules[mine.__name__] = other, mine
    try:
        other.WORDS = {}
        holder = type("Kernel", (), {"__module__": mine.__name__})()  # an object of the file's, walked
        holder.used, holder.globals = [("WORDS", (0, vars(other)))], vars(mine)
        mine.helper = holder
        mine.memo = {}
        before = _held_tensors(mine)
        other.WORDS["cuda"] = torch.zeros(4)  # allocated by a first call, in the other module
        assert _held_tensors(mine) == before, "another module's globals read as the file's state"
        mine.memo["k"] = torch.zeros(4)
        assert [where for _, where in _held_tensors(mine).values()] == ["memo"], "the file's own memo"
    finally:
        del sys.modules[other.__name__], sys.modules[mine.__name__]


def test_a_tensor_kept_behind_a_bound_method_or_an_iterator_is_found():
    """An answer kept where the walk of the file's names did not look: in the object of a bound method
    (`_keep = _Memo().keep`, the method's __self__), or in what an itertools object holds
    (`itertools.repeat(holder)`). Both last between calls as a dict of the module's does."""
    import itertools
    import types

    import torch

    from drills.grading.learner.run_call import _held_tensors

    mine = types.ModuleType("drills_learner_module_for_the_bound_walk")
    sys.modules[mine.__name__] = mine
    try:
        memo = type("Memo", (), {"__module__": mine.__name__, "keep": lambda self, x: x})()
        memo.seen = {}
        mine.keep = memo.keep  # only the bound method is a name of the module
        other = type("Box", (), {"__module__": mine.__name__})()
        other.items = []
        mine.again = itertools.repeat(other)
        assert _held_tensors(mine) == {}
        memo.seen["k"] = torch.zeros(4)
        other.items.append(torch.ones(2))
        assert sorted(where for _, where in _held_tensors(mine).values()) == ["again", "keep"]
    finally:
        del sys.modules[mine.__name__]


# --- The diagnosis engine ------------------------------------------------------------------------


def test_mistake_naming_one_parametrized_case_matches_it():
    cases = [
        Case("test_last_block_is_masked[n1]", "test_last_block_is_masked", "failed", "canary overwritten"),
        Case("test_last_block_is_masked[n2]", "test_last_block_is_masked", "passed"),
    ]
    found = diagnose.diagnose(
        cases,
        [
            diagnose.Mistake(
                1, fails=("test_last_block_is_masked[n1]",), passes=("test_last_block_is_masked[n2]",)
            )
        ],
    )
    assert found and found[0].pitfall == 1 and found[0].consistent, found


def test_a_valid_case_refused_by_the_learners_own_check_is_named_so():
    """The learner's check raising on a case the grader means as valid (an empty suffix refused with >=
    where > belongs), where no pitfall fits, is named as that rather than "your code raised"; the same
    raise in a check that passes bad input on purpose (the wrong error type) is not, and a pitfall that
    fits comes first (the learner's check may be catching the learner's own planner)."""
    raised = (
        "your code raised ValueError at drills/mine/x.py:97 (`raise ValueError(`): prefix_lens[0] = 16 is "
        "longer than context_lens[1] = 16"
    )
    cases = [
        Case(
            "test_every_suffix_split_count_matches", "test_every_suffix_split_count_matches", "failed", raised
        ),
        Case("test_worked_example", "test_worked_example", "passed"),
    ]
    nan_only = diagnose.Mistake(10, fails=("test_every_suffix_split_count_matches",), messages=("NaN",))
    found = diagnose.diagnose(cases, [nan_only])
    assert len(found) == 1 and found[0].kind == "refused_valid" and found[0].consistent, found
    planner = diagnose.Mistake(4, fails=("test_every_suffix_split_count_matches",))
    assert diagnose.diagnose(cases, [planner])[0].pitfall == 4
    wrong_type = [
        Case("test_launcher_rejects_bad_input[x]", "test_launcher_rejects_bad_input", "failed", raised)
    ]
    assert all(f.kind != "refused_valid" for f in diagnose.diagnose(wrong_type, []))


# --- What a pass must not depend on: forged reports, strays, where the file runs -----------------

DETACHED = """

import ctypes as _ctypes
import os as _os
import time as _time

_libc = _ctypes.CDLL(None)
if _libc.fork() == 0:  # libc's fork: no audit event, so the audit hook cannot refuse it
    _libc.setsid()
    if _libc.fork() == 0:  # detached: its parent ends, and it would be init's child without a subreaper
        with open({pid_file!r}, "w") as _f:
            _f.write(str(_os.getpid()))
        _time.sleep(60)
    _libc._exit(0)
"""


def test_a_detached_process_of_the_learners_file_is_ended_before_the_report_is_read(tmp_path):
    """A process the file starts and detaches (a double fork, setsid) could rewrite the report or the
    terminal after the real screen: it is adopted by the grader (a subreaper) and ended first."""
    import tempfile

    pid_file = Path(tempfile.mkdtemp(prefix="drills-stray-")) / "stray.pid"  # a path naming no test tool
    # Made here: the learner's process may write a file that exists outside its folder, never create one.
    pid_file.write_text("")
    result = grade_t1(
        tmp_path, t1_source(extra=DETACHED.format(pid_file=str(pid_file))), "test_by_hand_lane_11_is_masked"
    )
    assert result.state == "passing", one_screen(result)
    assert pid_file.read_text(), "the detached process never ran: this test no longer tests anything"
    pid = int(pid_file.read_text())
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    assert state in ("gone", "Z"), f"process {pid} that the learner's file detached outlived the grading"


def test_the_report_travels_over_a_pipe_and_junk_in_it_is_a_grader_error():
    """The report is never a file another process could rewrite: it comes back over a pipe, and a pipe
    that holds anything but one whole report gives "grader error", never a pass."""
    from drills.grading.grader import report, report_channel

    pipe = report_channel.ResultPipe()
    os.write(pipe.fd, b'{"forged": true}\n')
    pipe.started()
    text = pipe.text()
    assert text == '{"forged": true}\n'
    with pytest.raises((KeyError, ValueError, TypeError)):
        report.parse_report(text)
    args = pytest_run.pytest_args([T1.tests], "mine")
    assert not any("report.json" in a for a in args), "make test must not name a report file"


@pytest.mark.skipif(
    __import__("drills.grading.learner.sandbox", fromlist=["x"]).landlock_abi() < 1,
    reason="this kernel has no Landlock: only the audit hook guards the references here (make doctor says so)",
)
def test_the_reference_cannot_be_opened_by_any_call(tmp_path):
    """libc's open through ctypes and os.open with a dir_fd pass no audit hook: Landlock refuses them."""
    folder = os.path.join(ROOT, "drills")
    sneaks = [
        f"import ctypes\nfd = ctypes.CDLL(None).open({SOLUTION.encode()!r}, 0)\n"
        "assert fd < 0, 'opened the reference through libc'\nraise RuntimeError('libc open refused')\n",
        f"import os\nd = os.open({folder!r}, os.O_RDONLY)\nos.open('solutions/t1_vector_add.py', os.O_RDONLY, dir_fd=d)\n",
        f"import os\nos.listdir({os.path.join(folder, 'solutions')!r})\n",
        f"import os\nos.open({os.path.join(ROOT, '.git', 'HEAD')!r}, os.O_RDONLY)\n",
    ]
    for sneak in sneaks:
        result = grade_t1(tmp_path, t1_source(extra="\n" + sneak), "test_by_hand_lane_11_is_masked")
        screen = one_screen(result)
        assert result.state == "does not import", screen
        assert any(w in result.message for w in ("refused", "Permission denied", "may not")), screen


WHERE_IT_RUNS = {
    "the_environment": "\nimport os\n_GRADED = os.environ.get('TRITON_INTERPRET') == '1'\n",
    "the_runtime": "\nimport drills.runtime\n_GRADED = drills.runtime.current().interpreter\n",
    "the_graders_modules": "\nimport sys\n_GRADED = any('drills.grading' in m for m in sys.modules)\n",
    "the_call_stack": "\nimport sys\n\ndef _graded():\n    return sys._getframe(3).f_globals.get('__name__')\n",
    "a_name_built_at_run_time": "\n_GRADED = __import__('o' + 's').getenv('PYTEST_CURRENT_TEST')\n",
}


@pytest.mark.parametrize("how", list(WHERE_IT_RUNS))
def test_a_file_that_asks_where_it_runs_is_refused_before_grading(tmp_path, how):
    result = grade_t1(
        tmp_path, t1_source(extra=WHERE_IT_RUNS[how]), "test_by_hand_lane_11_is_masked", checked=True
    )
    screen = one_screen(result)
    assert result.state == "does not import" and "refused before grading" in result.message, screen
    assert "line " in result.message, screen


def test_given_code_that_picks_tiles_by_runtime_is_not_refused():
    """T3's and T5's given block pickers branch on the runtime; kept as the reference has them, they pass."""
    from drills.grading.grader.source_check import check_file

    for lesson in (find("t3"), find("t5"), find("l4")):
        assert check_file(lesson.stub, lesson.solution) == [], lesson.id


def test_no_stub_reference_or_mutant_is_refused():
    """The static check refuses only what asks where it runs or computes out of sight: every lesson's
    stub, its reference and every mutant (an honest mistake) must be graded, not refused."""
    from drills.grading.grader.source_check import refusals
    from drills.lessons import LESSONS
    from drills.mutants import mutate

    for lesson in LESSONS:
        reference = lesson.solution.read_text()
        assert refusals(lesson.stub.read_text(), reference) == [], f"{lesson.id}'s stub"
        assert refusals(reference, reference) == [], f"{lesson.id}'s reference"
        for mutant, mutated, problem in mutate(lesson):
            if problem is None:
                assert refusals(mutated, reference) == [], f"{lesson.id} mutant {mutant.name}"


def test_provenance_is_decided_in_the_graders_process(remote):
    """torch's answer beside a decoy kernel, and the provenance code of the learner's own process patched
    to approve anything: the verdict is the grader's, from the evidence, so it still fails."""
    from drills.grading.shared.errors import NotFromKernel

    forge = """

import drills.grading.grader.provenance as _provenance

_provenance.judge = lambda *args, **kwargs: None


@triton.jit
def _decoy_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.load(x_ptr + offs, mask=offs < n)


def vector_add(x, y, out=None):
    _decoy_kernel[(1,)](x, x.numel(), BLOCK=16)
    return torch.add(x, y, out=out)
"""
    impl, _ = remote(T1, forge)
    x = torch.arange(8, dtype=torch.float32, device=RUNTIME.device)  # [8]
    with (
        impl._drills_calling(provenance=True),
        pytest.raises(NotFromKernel, match="did not come from your kernel"),
    ):
        impl.vector_add(x, x)


@interpreter_only
def test_bf16_dot_and_arithmetic_are_exact_in_the_learners_process():
    """Triton's interpreter computes bf16 on the uint16 bits; the learner's process computes it as a GPU does."""
    import subprocess as sp

    code = """
import torch, triton, triton.language as tl
from triton.runtime import interpreter
from drills.grading.learner.bf16 import exact_bf16_dot
exact_bf16_dot(interpreter)

@triton.jit
def k(a, b, c, s, N: tl.constexpr):
    r = tl.arange(0, N)
    x = tl.load(a + r[:, None] * N + r[None, :])
    y = tl.load(b + r[:, None] * N + r[None, :])
    tl.store(c + r[:, None] * N + r[None, :], tl.dot(x, y))
    tl.store(s + r, tl.sum(x + y, 1))

g = torch.Generator().manual_seed(0)
a, b = (torch.randn(16, 16, generator=g).bfloat16() for _ in range(2))
c, s = torch.empty(16, 16), torch.empty(16, dtype=torch.bfloat16)
k[(1,)](a, b, c, s, 16)
print((c.double() - a.double() @ b.double()).abs().max().item(), (s.float() - (a + b).float().sum(1)).abs().max().item())
"""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    out = sp.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    dot_error, sum_error = map(float, out.stdout.split())
    # bf16 products are exact in fp32; only the fp32 sum of 16 of them rounds, in whatever order the
    # machine adds (torch's own fp32 matmul differs from it by an ulp under some thread counts). The
    # interpreter's own bf16 dot, on the uint16 bits, is off by about 1e10.
    assert dot_error < 1e-4, f"bf16 tl.dot off by {dot_error}"
    assert sum_error < 0.1, f"bf16 x + y summed off by {sum_error}"


@interpreter_only
def test_a_dot_too_shallow_for_a_gpu_is_refused_in_the_learners_process():
    """NVIDIA's compiler refuses a tl.dot with K below 16, which the interpreter computes: the learner's
    process takes the compiler's rule, so such a kernel fails on the CPU as it would on a GPU."""
    import subprocess as sp

    code = """
import torch, triton, triton.language as tl
from triton.runtime import interpreter
from drills.grading.learner.instrument import _dot_sizes_as_a_gpu_compiles
_dot_sizes_as_a_gpu_compiles(interpreter)

@triton.jit
def k(a, c, K: tl.constexpr):
    r, j = tl.arange(0, 16), tl.arange(0, K)
    x = tl.load(a + r[:, None] * K + j[None, :])  # [16, K]
    y = tl.load(a + j[:, None] * 16 + r[None, :])  # [K, 16]
    tl.store(c + r[:, None] * 16 + r[None, :], tl.dot(x, y))

a, c = torch.randn(256), torch.empty(256)
k[(1,)](a, c, 16)
try:
    k[(1,)](a, c, 8)
    print("K = 8 ran")
except Exception as e:
    print("refused", e)
"""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    out = sp.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("refused") and "K >= 16" in out.stdout, out.stdout


def test_failures_only_in_bf16_cases_are_named_a_hard_coded_dtype():
    """A cast written as tl.float16 fails every bf16 case and no other: whatever each failure says (a
    compile error, a mismatch), the diagnosis names the dtype, not "your code raised an exception"."""
    cases = [
        Case("test_dtypes[fp16-causal]", "test_dtypes", "passed"),
        Case(
            "test_dtypes[bf16-causal]",
            "test_dtypes",
            "failed",
            "your code raised InterpreterError: operands fp16 and bf16",
        ),
        Case("test_dtypes[bf16-noncausal]", "test_dtypes", "failed", "largest error 0.3 at [0, 1]"),
        Case("test_scale_is_applied", "test_scale_is_applied", "passed"),
    ]
    findings = diagnose.diagnose(cases, [])
    assert findings and findings[0].kind == "dtype", findings
    # A kernel wrong for every dtype is not this mistake.
    cases[0] = Case("test_dtypes[fp16-causal]", "test_dtypes", "failed", "largest error 0.3")
    assert all(f.kind != "dtype" for f in diagnose.diagnose(cases, []))


def test_torch_answer_copied_into_out_by_a_kernel_did_not_come_from_your_kernel(tmp_path):
    """torch computes x + y, and a real kernel copies it into out: every byte of out is a launch's store,
    and with launches off out changes, yet the answer is torch's. The float ops torch ran outside any
    launch give it away."""
    copy = """

@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    answer = x + y
    _copy_kernel[(triton.cdiv(x.numel(), 1024),)](answer, out, x.numel(), BLOCK=1024)
    return out
"""
    result = grade_t1(tmp_path, t1_source(extra=copy), "test_runs_a_triton_kernel")
    screen = one_screen(result)
    assert "torch computed floats" in failures(result)["test_runs_a_triton_kernel"], screen
    assert result.findings[0]["kind"] == "not_from_kernel", screen


def test_an_answer_made_out_of_torchs_sight_and_copied_in_reads_no_input(tmp_path):
    """x + y computed in plain Python from the inputs' values (no torch float op, so the recorder sees
    nothing), then a real kernel copies it into out: every byte of out is a launch's store and turning
    launches off changes it, yet no kernel loaded x or y. The loads the interpreter watched give it
    away, whatever computed the numbers (numpy, Python, torch with its dispatch hidden)."""
    copy = """

@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    values = [a + b for a, b in zip(x.tolist(), y.tolist())]
    answer = torch.tensor(values, dtype=x.dtype, device=x.device)
    _copy_kernel[(triton.cdiv(x.numel(), 1024),)](answer, out, x.numel(), BLOCK=1024)
    return out
"""
    result = grade_t1(tmp_path, t1_source(extra=copy), "test_runs_a_triton_kernel")
    screen = one_screen(result)
    message = failures(result).get("test_runs_a_triton_kernel", "")
    # Reading the floats to Python (tolist) is refused as it happens; the unread inputs are the backstop.
    assert "no kernel of yours read `x`, `y`" in message or "floats read to the host" in message, screen
    assert result.findings[0]["kind"] == "not_from_kernel", screen


def test_an_answer_built_where_a_freed_copy_of_the_input_lay_still_reads_no_input(tmp_path):
    """A copy of x is made and freed, and the answer, built from plain Python numbers, lands at the
    freed copy's address (as on a GPU, where x.tolist() copies x to the host first): the record of
    which storage was copied from which must not let the answer pass for a copy of x."""
    copy = """

@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    xs, ys = x.clone(), y.clone()
    values = [a + b for a, b in zip(xs.tolist(), ys.tolist())]
    del xs, ys
    answer = torch.tensor(values, dtype=x.dtype, device=x.device)
    _copy_kernel[(triton.cdiv(x.numel(), 1024),)](answer, out, x.numel(), BLOCK=1024)
    return out
"""
    result = grade_t1(tmp_path, t1_source(extra=copy), "test_runs_a_triton_kernel")
    screen = one_screen(result)
    message = failures(result).get("test_runs_a_triton_kernel", "")
    assert "no kernel of yours read" in message or "floats read to the host" in message, screen


ANSWERS_OUT_OF_TORCHS_OPS = {
    # The values read to Python and added there: no torch op computes, yet floats left the tensors.
    "python_arithmetic_on_tolist": (
        "    values = [a + b for a, b in zip(x.tolist(), y.tolist())]\n"
        "    out.copy_(torch.tensor(values, dtype=x.dtype))\n",
        "floats read to the host",
    ),
    "python_arithmetic_on_item": (
        "    values = [x[i].item() + y[i].item() for i in range(x.numel())]\n"
        "    out.copy_(torch.tensor(values, dtype=x.dtype))\n",
        "read to the host",
    ),
    # torch computing in complex numbers, which are not floating point to torch
    "torch_in_complex64": (
        "    out.copy_((x.to(torch.complex64) + y.to(torch.complex64)).real)\n",
        "torch's add",
    ),
}


@pytest.mark.parametrize("how", list(ANSWERS_OUT_OF_TORCHS_OPS))
def test_an_answer_made_without_a_float_op_of_torch_is_refused(tmp_path, how):
    """The kernel still runs (loads x and y, stores out), then the launcher overwrites out with an
    answer made where the op recorder would not see a float op: each way is refused by name."""
    body, says = ANSWERS_OUT_OF_TORCHS_OPS[how]
    cheat = "\n\n_kernel_launch = _launch\n\n\ndef _launch(x, y, out, BLOCK=2048, num_warps=4):\n"
    cheat += "    _kernel_launch(x, y, out, BLOCK, num_warps)\n" + body + "    return out\n"
    result = grade_t1(tmp_path, t1_source(extra=cheat), "test_each_program_adds_its_own_block")
    screen = one_screen(result)
    failed = failures(result)
    assert failed and all(says in m for m in failed.values()), screen


def test_torch_answering_the_cases_the_provenance_check_does_not_make_is_refused(tmp_path):
    """The kernel for small vectors, torch for the rest: the one call that asks for provenance is small,
    so only watching every call for torch's float ops catches the others."""
    fallback = """

_kernel_launch = _launch


def _launch(x, y, out, BLOCK=2048, num_warps=4):
    if x.numel() > 3000:
        out.copy_(x + y)
        return out
    return _kernel_launch(x, y, out, BLOCK, num_warps)
"""
    result = grade_t1(tmp_path, t1_source(extra=fallback), "test_each_program_adds_its_own_block")
    screen = one_screen(result)
    failed = failures(result)
    assert failed and all("torch computed floats" in m for m in failed.values()), screen


def test_a_launcher_that_copies_its_inputs_still_runs_its_kernel(tmp_path):
    """An honest launcher may hand the kernel copies of its inputs (a clone, a contiguous copy of a view):
    a kernel that reads the copy reads the input, so no 'did not come from your kernel' for it."""
    copies = """

def _launch(x, y, out, BLOCK=2048, num_warps=4, _original=_launch):
    return _original(x.clone(), y.clone().contiguous(), out, BLOCK, num_warps)
"""
    result = grade_t1(tmp_path, t1_source(extra=copies), "test_runs_a_triton_kernel")
    assert result.state == "passing", one_screen(result)


OUT_OF_SIGHT = {
    "numpy_imported": ("\nimport numpy as np\n", "imports numpy"),
    "dispatch_modes_off": (
        "\nfrom torch.utils._python_dispatch import _disable_current_modes\n",
        "imports torch.utils._python_dispatch",
    ),
    "a_tensor_as_numpy": ("\ndef _host(x):\n    return x.numpy()\n", "computes on the host with numpy"),
}


@pytest.mark.parametrize("how", list(OUT_OF_SIGHT))
def test_a_file_that_computes_out_of_the_graders_sight_is_refused_before_grading(tmp_path, how):
    """numpy on the tensors' memory, or torch with the grader's op recorder switched off: refused by the
    static check with the line and the reason."""
    extra, why = OUT_OF_SIGHT[how]
    result = grade_t1(tmp_path, t1_source(extra=extra), "test_by_hand_lane_11_is_masked", checked=True)
    screen = one_screen(result)
    assert result.state == "does not import" and "refused before grading" in result.message, screen
    assert why in result.message, screen


def test_a_kernel_that_is_not_a_triton_kernel_is_refused(tmp_path):
    """An object that answers kernel[grid](...) by adding with torch, under the kernel's name: the checks
    that launch the kernel by hand would never reach a launch, so the file is refused."""
    fake = """

class _FakeKernel:
    def __getitem__(self, grid):
        def launch(x, y, out, n, BLOCK=None, num_warps=None):
            out[:n] = x[:n] + y[:n]

        return launch


vector_add_kernel = _FakeKernel()
"""
    result = grade_t1(tmp_path, t1_source(extra=fake), "test_by_hand_lane_11_is_masked")
    screen = one_screen(result)
    assert result.state == "does not import" and "must be a @triton.jit kernel" in result.message, screen


@pytest.mark.parametrize(
    "evasion",
    [
        "import drills\n_G = hasattr(drills, 'grading')\n",
        "_G = hasattr(torch.empty, '__wrapped__')\n",
        "import os\n_G = getattr(os, 'environ')\n",
        "import sys\n_G = vars(sys)['modules']\n",
        "import builtins\n_G = getattr(builtins, '__imp' + 'ort__')\n",
        "_G = triton.runtime.jit.JITFunction.run.__closure__\n",
        "_G = open('/proc/self/stat').read()\n",
        # The names under other names, or built from pieces at run time
        "from sys import modules as _M\n_G = 'drills.' + 'grad' + 'ing' in _M\n",
        "from os import environ as _E\n_G = ''.join(['PYTE', 'ST_VERSION']) in _E\n",
        # Work out of the op recorder's sight: another thread, another process
        "import threading\n",
        "from concurrent.futures import ThreadPoolExecutor\n",
        "_G = torch.jit.fork(torch.zeros, 1)\n",
        # Probing the sandbox (can the references be opened?) or the poisoned fresh memory
        "_G = (__file__, 'solutions')\n",
        "from pathlib import Path\n",
        "_G = torch.empty(16).isnan().all()\n",
        # The clock or the process's set-up (the interpreter is slow; make check runs one thread)
        "import time\n",
        "_G = torch.get_num_threads()\n",
        # Kernels or arrays out of the check's and the recorder's reach
        "_G = torch.compile(torch.add)\n",
        "import scipy\n",
    ],
)
def test_indirect_ways_of_asking_where_it_runs_are_refused(evasion):
    from drills.grading.grader.source_check import refusals

    assert refusals(t1_source(extra="\n" + evasion), T1.solution.read_text()), evasion


def test_fast_launch_path_sees_a_wrapper_that_copies_tritons_names():
    """drills.launch calls the compiled binary directly unless JITFunction.run is wrapped (the grader wraps
    it to count launches and to turn them into no-ops). The grader's wrapper copies Triton's names, so
    that a learner's file cannot tell it from Triton's; drills.launch must judge by the code object, or
    on a GPU every launch bypasses the counter and even the reference fails test_runs_a_triton_kernel."""
    from triton.runtime.jit import JITFunction

    from drills import launch

    class Plain:
        run = JITFunction.run

    def wrapper(self, *args, **kwargs):
        return JITFunction.run(self, *args, **kwargs)

    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(wrapper, name, getattr(JITFunction.run, name))

    class Watched:
        run = wrapper

    assert not launch._observed(Plain()), "Triton's own run taken for a wrapper: the fast path is never used"
    assert launch._observed(Watched()), "a wrapper with Triton's names taken for Triton's run"


# --- Launch grids are checked against CUDA's limits on every machine ------------------------------

AXIS_1_LAUNCHES = """

def rows_on_axis_1(x, y, out):  # one program per element, on grid axis 1
    vector_add_kernel[(1, x.numel())](x, y, out, x.numel(), BLOCK=1)


def rows_on_axis_1_by_meta(x, y, out):  # the same grid as an autotuner gives it: a function of META
    vector_add_kernel[lambda META: (1, META["n"])](x, y, out, x.numel(), BLOCK=1)


def rows_on_axis_0(x, y, out):
    vector_add_kernel[(x.numel(),)](x, y, out, x.numel(), BLOCK=1)
"""


def test_a_grid_past_cudas_limits_is_refused_before_it_runs(remote):
    """Triton's interpreter runs a grid of (1, 65536), which a GPU refuses (axis 1 stops at 65535): the
    learner's process refuses it before any program runs, naming the axis, its size, the limit and the
    learner's line, for a tuple grid and for a callable one. A dry run (launches recorded, none run)
    is checked the same way, and 65536 programs on axis 0 pass."""
    from drills.grading.shared.errors import GridTooLarge
    from drills.grading.shared.launches import assert_grids_fit

    impl, path = remote(T1, AXIS_1_LAUNCHES)
    n = 65536
    x = torch.ones(n, device=RUNTIME.device)  # [n]
    out = torch.full((n,), CANARY, device=RUNTIME.device)  # [n]
    for launcher in ("rows_on_axis_1", "rows_on_axis_1_by_meta"):
        with pytest.raises(GridTooLarge) as info:
            getattr(impl, launcher)(x, x, out)
        message = str(info.value)
        assert "grid axis 1: 65536 programs" in message and "at most 65535" in message, message
        assert "axis 0" in message, f"the message must say where the large dimension goes: {message}"
        if launcher == "rows_on_axis_1":
            assert f"{path}:" in message and "vector_add_kernel[(1, x.numel())]" in message, message
        assert (out == CANARY).all(), f"{launcher}: a program ran before the grid was refused"
    with pytest.raises(GridTooLarge, match="grid axis 1: 65536 programs"):
        assert_grids_fit(impl, lambda: impl.rows_on_axis_1(x, x, out), "rows_on_axis_1")
    launches = assert_grids_fit(impl, lambda: impl.rows_on_axis_0(x, x, out), "rows_on_axis_0")
    assert [c.grid for c in launches.calls] == [(n, 1, 1)]
    assert (out == CANARY).all(), "a dry run ran a program"
    failed = Case("test_grid_fits", "test_grid_fits", "failed", f"GridTooLarge: {message}")
    finding = diagnose.diagnose([failed], [])[0]  # named as what it is where no pitfall of a lesson fits
    assert finding.kind == "grid_too_large", finding


def test_a_grid_past_cudas_limits_is_named_before_more_specific_mistakes():
    """Code that puts rows on grid axis 1 may fail other checks too (a kernel still reading axis 0):
    the grid verdict is certain, so the lesson's mistake that names it comes first, ahead of a more
    specific one that the other failures also fit."""
    message = (
        "GridTooLarge: launch grid (1, 70000, 1) of k is past CUDA's limit on grid axis 1: 70000 programs"
    )
    cases = [
        Case("test_grid_fits", "test_grid_fits", "failed", message),
        Case("test_values", "test_values", "failed", "expected 1, got 0"),
        Case("test_empty", "test_empty", "passed"),
    ]
    wide = diagnose.Mistake(3, fails=("test_values", "test_grid_fits"), passes=("test_empty",))
    grid = diagnose.Mistake(8, fails=("test_grid_fits",), messages=(r"past CUDA's limit on grid axis",))
    assert [f.pitfall for f in diagnose.diagnose(cases, [wide, grid])] == [8, 3]
