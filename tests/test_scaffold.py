"""Tests of `python -m drills new` (drills/scaffold.py) and of the contract's two jobs it leans on
(drills/contract.py): which stub it reads, and the pitfall numbering across a lesson's files
(drills/pitfall_numbering.py).

The scaffold runs in a copy of the repository in a temporary folder (the working tree's files, committed
there as the copy's own HEAD), through the copy's own `python -m drills`: the real drills/lessons.py and
lesson folders are never written, and the copy is deleted even when a test fails."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import drills.mutants
from drills import contract, pitfall_numbering, scaffold, stubs
from drills.grading.grader.pytest_run import NOT_STARTED_EXIT
from drills.lessons import ROOT, find

STEM = "x9_demo"
T1 = find("t1")


def _env(copy: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRILLS_")}
    env["PYTHONPATH"] = str(copy)  # the copy's drills, never the editable install's
    return env


def drills_in(copy: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "drills", *args],
        cwd=copy,
        env=_env(copy),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def git(copy: Path, *args: str) -> str:
    command = ["git", "-c", "user.name=scaffold test", "-c", "user.email=scaffold@test", *args]
    return subprocess.run(command, cwd=copy, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def copy():
    """A copy of the working tree with x9_demo scaffolded in it (git HEAD: the copy before the scaffold)."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, text=True
    )
    if listed.returncode != 0:
        pytest.skip(f"the scaffold is tested in a copy of a git checkout, and {ROOT} is not one")
    with tempfile.TemporaryDirectory(prefix="drills-scaffold-") as tmp:
        root = Path(tmp) / "course"
        for rel in filter(None, listed.stdout.split("\0")):
            if (ROOT / rel).is_file():  # a file deleted in the working tree is listed too
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, root / rel)
        git(root, "init", "-q")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "the course before the scaffold")
        where = drills_in(root, "--help")  # the package imported must be the copy's, or new writes here
        imported = subprocess.run(
            [sys.executable, "-c", "import drills.lessons as l; print(l.ROOT)"],
            cwd=root,
            env=_env(root),
            capture_output=True,
            text=True,
        ).stdout.strip()
        assert where.returncode == 0 and Path(imported) == root, f"the copy imports drills from {imported}"
        made = drills_in(root, "new", STEM)
        assert made.returncode == 0, made.stdout + made.stderr
        yield root


def test_new_writes_every_file_of_the_lesson(copy):
    for rel in scaffold.lesson_paths(STEM):
        assert (copy / rel).is_file(), f"{rel} was not written"
    status = git(copy, "status", "--porcelain")
    assert " M drills/lessons.py" in status and " M README.md" in status, status


def test_entry_goes_after_the_last_lesson_of_its_track_and_before_the_capstone(copy):
    order = [entry[0] for entry in scaffold.listed_lessons((copy / "drills/lessons.py").read_text())]
    listed = drills_in(copy, "list")
    assert order.index(STEM) == order.index("c1_engine") - 1, order
    assert any(line.split()[:3] == ["x9", "X", STEM] for line in listed.stdout.splitlines()), listed.stdout
    readme = (copy / "README.md").read_text()
    assert readme.index("| x9 | X | Demo |") < readme.index("| c1 | C |")


def test_new_lesson_keeps_the_contract(copy):
    checked = drills_in(copy, "contract", "x9")
    assert checked.returncode == 0 and "stub contract x9: ok" in checked.stdout, checked.stdout


def test_new_lesson_is_graded_as_not_started(copy):
    graded = drills_in(copy, "test", "x9")
    lines = graded.stdout.strip().splitlines()
    assert graded.returncode == NOT_STARTED_EXIT, graded.stdout + graded.stderr
    assert lines[-1].startswith("x9 is not started") and f"drills/mine/{STEM}.py" in lines[-1], lines


def test_new_lessons_reference_passes_its_grader(copy):
    graded = drills_in(copy, "test", "x9", "--impl", "solutions")
    assert graded.returncode == 0 and "x9: passing" in graded.stdout, graded.stdout + graded.stderr


def test_new_lessons_python_is_formatted_and_linted(copy):
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed in this Python (the dev extra): make lint cannot run either")
    files = [rel for rel in scaffold.lesson_paths(STEM) if rel.endswith(".py")] + ["drills/lessons.py"]
    for command in (["format", "--check"], ["check"]):
        proc = subprocess.run([ruff, *command, *files], cwd=copy, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_new_lessons_notebook_is_valid(copy):
    nbformat = pytest.importorskip("nbformat", reason="nbformat (the notebooks extra) is not installed")
    nbformat.validate(nbformat.read(copy / "notebooks" / f"{STEM}.ipynb", as_version=4))


@pytest.mark.parametrize(
    "stem, why",
    [
        (STEM, "exists"),
        ("t1_another_add", "exists: its id t1"),
        ("X9_demo", "malformed"),
        ("x9", "malformed"),
        ("demo_x9", "malformed"),
        ("x9_for", "malformed"),
        ("x9_demo/../y", "malformed"),
    ],
)
def test_malformed_or_taken_stem_is_refused_before_anything_is_written(copy, stem, why):
    before = git(copy, "status", "--porcelain")
    with pytest.raises(ValueError, match=r"^stem ") as refused:
        scaffold.create(stem, root=copy)
    assert why in str(refused.value) and "\n" not in str(refused.value)
    assert git(copy, "status", "--porcelain") == before


@pytest.mark.parametrize("title", ['Say "hi"', "a | b", "two\nlines"])
def test_malformed_title_is_refused_before_anything_is_written(copy, title):
    before = git(copy, "status", "--porcelain")
    with pytest.raises(ValueError, match=r"^title "):
        scaffold.create("x8_other", title=title, root=copy)
    assert git(copy, "status", "--porcelain") == before


def test_contract_reads_a_stub_being_edited_and_leaves_a_learners_file_alone(copy):
    """Committed, the new stub is edited: while it keeps its not-started raise the contract reads the
    working file (a launcher that drifted from the solution fails, naming the file read); once the raise
    is deleted the file is a learner's, and the contract reads the committed stub again."""
    stub = copy / "drills" / "mine" / f"{STEM}.py"
    git(copy, "add", "-A")
    git(copy, "commit", "-q", "-m", "the scaffolded lesson")
    committed = stub.read_text()
    try:
        stub.write_text(committed.replace("BLOCK=1024, num_warps=4", "BLOCK=512, num_warps=4"))
        edited = drills_in(copy, "contract", "x9")
        assert edited.returncode == 1 and "_launch" in edited.stdout, edited.stdout
        assert "as in the working tree" in edited.stdout, edited.stdout
        started = stub.read_text().split("    raise NotImplementedError(")
        stub.write_text(started[0] + started[1].split("    )\n", 1)[1])  # the learner deleted the raise
        learner = drills_in(copy, "contract", "x9")
        assert learner.returncode == 0, learner.stdout
        forced = subprocess.run(
            [sys.executable, "-m", "drills", "contract", "x9"],
            cwd=copy,
            env={**_env(copy), contract.STUB_ENV: "worktree"},
            capture_output=True,
            text=True,
        )
        assert forced.returncode == 1 and "does not raise NotImplementedError" in forced.stdout, forced.stdout
    finally:
        stub.write_text(committed)


# --- Numbering: explainer pitfalls, MISTAKES, mutants and the stub's TODO sections (real T1, edited) ------


def test_t1s_numbering_agrees():
    assert pitfall_numbering.numbering_problems(T1) == []


def test_a_pitfall_without_a_mistake_or_mutant_is_named():
    import re

    text = T1.explainer.read_text()
    n = 1 + max(int(k) for k in re.findall(r"^(\d+)\. \*\*", text, flags=re.M))  # one past the last
    text = text.replace(
        "\nAnswers:", f"{n}. **One more mistake.** Caught by `test_last_block_is_masked`.\n\nAnswers:", 1
    )
    problems = pitfall_numbering.numbering_problems(T1, explainer_text=text)
    assert any(f"pitfall {n}" in p and "MISTAKES" in p for p in problems), problems
    assert any(f"pitfall {n}" in p and "mutant" in p for p in problems), problems


def test_pitfalls_numbered_twice_are_named():
    text = T1.explainer.read_text().replace("\n5. **", "\n4. **", 1)
    assert any("numbered" in p for p in pitfall_numbering.numbering_problems(T1, explainer_text=text))


def test_a_mistake_or_mutant_naming_no_listed_pitfall_is_named(monkeypatch):
    from drills.grading.grader.diagnose import Mistake

    mistakes = pitfall_numbering.grader_mistakes(T1)
    monkeypatch.setattr(
        pitfall_numbering, "grader_mistakes", lambda lesson: mistakes + [Mistake(9, section="7.7")]
    )
    mutants = drills.mutants.load_mutants(T1.stem)
    extra = drills.mutants.Mutant("nine", "9. a mistake the explainer lacks", "x", "y")
    monkeypatch.setattr(drills.mutants, "load_mutants", lambda stem: mutants + [extra])
    problems = pitfall_numbering.numbering_problems(T1)
    assert any("names pitfall 9" in p for p in problems), problems
    assert any("'7.7' is not a section" in p for p in problems), problems
    assert any("mutant nine" in p for p in problems), problems


def test_a_todo_naming_a_missing_or_retitled_section_is_named():
    stub = stubs.pristine_stub_source(T1)
    retitled = stub.replace('TODO(section 3.2 "Offsets")', 'TODO(section 3.2 "Offsets and strides")')
    missing = stub.replace('TODO(section 3.2 "Offsets")', 'TODO(section 3.9 "Offsets")')
    bare = stub.replace('TODO(section 3.2 "Offsets")', "TODO")
    assert any("titles it 'Offsets'" in p for p in pitfall_numbering.numbering_problems(T1, retitled))
    assert any("section 3.9" in p for p in pitfall_numbering.numbering_problems(T1, missing))
    assert any("names no section" in p for p in pitfall_numbering.numbering_problems(T1, bare))


def test_todo_sections_reads_stages_and_two_sections():
    source = (
        '# TODO(stage 2, section 3.1 "The grid"): a\n# TODO(section 3.3 "exp2" and 3.4 "One key block"): b\n'
    )
    assert pitfall_numbering.todo_sections(source) == [
        (1, "3.1", "The grid"),
        (2, "3.3", "exp2"),
        (2, "3.4", "One key block"),
    ]


def test_undo_takes_back_only_what_new_wrote(tmp_path):
    """make new STEM=... UNDO=1: the new lesson's files and its two added lines go; the contributor's
    own work (a drills/mine file, an edit elsewhere in README.md) stays; a file edited since `new` is
    kept unless forced; a second undo finds nothing to take back."""
    root = tmp_path / "course"
    (root / "drills" / "mine").mkdir(parents=True)
    for rel in ("drills/lessons.py", "README.md", "pyproject.toml"):  # pyproject: ruff's settings
        shutil.copy2(ROOT / rel, root / rel)
    lessons_before, readme_before = (root / "drills/lessons.py").read_text(), (root / "README.md").read_text()
    own = root / "drills" / "mine" / "t1_vector_add.py"
    own.write_text("# the contributor's own work in progress\n")
    stem = "x8_undo_demo"
    scaffold.create(stem, root=root)
    (root / "README.md").write_text((root / "README.md").read_text() + "A line the contributor added.\n")
    removed, kept = scaffold.undo(stem, root)
    assert kept == [] and all(not (root / rel).exists() for rel in scaffold.lesson_paths(stem)), removed
    assert (root / "drills/lessons.py").read_text() == lessons_before
    assert (root / "README.md").read_text() == readme_before + "A line the contributor added.\n"
    assert own.read_text() == "# the contributor's own work in progress\n"
    with pytest.raises(ValueError, match="x8_undo_demo"):
        scaffold.undo(stem, root)

    scaffold.create(stem, root=root)
    edited = root / f"drills/content/{stem}.md"
    edited.write_text(edited.read_text() + "\nThe contributor's first paragraph.\n")
    removed, kept = scaffold.undo(stem, root)
    assert edited.exists() and len(kept) == 1 and kept[0].startswith(f"drills/content/{stem}.md")
    assert not (root / f"drills/solutions/{stem}.py").exists()
    removed, kept = scaffold.undo(stem, root, force=True)
    assert not edited.exists() and kept == [] and own.exists()
