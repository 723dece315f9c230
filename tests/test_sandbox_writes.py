"""The learner's process cannot write into the repository, the Python installation or the home folder,
but for its own file's folder and the compilers' caches: a file that rewrote a grader, the harness or
the course's records, or left a .pth file in site-packages, would make every later grading pass. Landlock
refuses it whatever the call; the audit hook refuses Python's own calls where Landlock is missing."""

from __future__ import annotations

import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

import pytest

from drills.grading.grader import pytest_run
from drills.grading.learner.sandbox import landlock_abi
from drills.lessons import ROOT, find
from tests.test_grading_harness import one_screen, outcome, t1_source, write_learner_file

TARGET = os.path.join(ROOT, "drills", "tests", "_written_by_a_learner_file.py")  # must never appear
KEPT = os.path.join(ROOT, "drills", "grading", "_kept_while_graded.txt")  # must never go away

WRITES = {
    "open_for_writing": f"open({TARGET!r}, 'w').write('forged')\n",
    "os_open_creating": f"import os\nos.close(os.open({TARGET!r}, os.O_CREAT | os.O_WRONLY))\n",
    "appending_to_a_grader": (
        f"open({os.path.join(ROOT, 'drills', 'tests', 'test_t1_vector_add.py')!r}, 'a').write('')\n"
    ),
    "renaming_over_a_grader": (
        f"import os, tempfile\nfd, p = tempfile.mkstemp()\nos.close(fd)\nos.replace(p, {TARGET!r})\n"
    ),
    "removing_a_repository_file": f"import os\nos.remove({KEPT!r})\n",
}
if landlock_abi() >= 1:  # calls no audit hook sees: only Landlock refuses them
    WRITES["libc_open_creating"] = (
        f"import ctypes\nfd = ctypes.CDLL(None).open({TARGET.encode()!r}, 0o101, 0o644)\n"
        "assert fd < 0, 'created a file in the repository through libc'\nraise RuntimeError('libc open refused')\n"
    )


SITE_PTH = os.path.join(sysconfig.get_paths()["purelib"], "_written_by_a_learner_file.pth")  # never
HOME_FILE = os.path.join(os.path.expanduser("~"), "_written_by_a_learner_file")  # never either
WRITES["pth_file_into_site_packages"] = f"open({SITE_PTH!r}, 'w').write('import os')\n"
WRITES["file_into_the_home_folder"] = f"open({HOME_FILE!r}, 'w').write('forged')\n"


def grade_unchecked(folder, source: str, check: str) -> pytest_run.Grade:
    """T1's grading of `source` past the static check, which refuses open() and os before any sandbox
    is reached: these tests are about the sandbox behind it."""
    file = write_learner_file(folder, source)
    return pytest_run.grade(find("t1"), file=file, extra=["-k", check, "--drills-skip-source-check"])


@pytest.fixture
def kept_file():
    with open(KEPT, "w") as f:
        f.write("the learner's process may not remove this\n")
    yield KEPT
    for path in (KEPT, TARGET, SITE_PTH, HOME_FILE):
        if os.path.exists(path):
            os.remove(path)


@pytest.mark.parametrize("how", list(WRITES))
def test_a_file_cannot_write_into_the_repository(tmp_path, kept_file, how):
    grader = os.path.join(ROOT, "drills", "tests", "test_t1_vector_add.py")
    before = os.stat(grader).st_mtime_ns
    result = grade_unchecked(tmp_path, t1_source(extra="\n" + WRITES[how]), "test_by_hand_lane_11_is_masked")
    screen = one_screen(result)
    for path in (TARGET, SITE_PTH, HOME_FILE):
        assert not os.path.exists(path), f"the learner's process created {path}"
    assert os.path.exists(kept_file), f"the learner's process removed {kept_file}"
    assert os.stat(grader).st_mtime_ns == before, "the learner's process wrote into T1's grader"
    assert result.state == "does not import", screen
    assert any(w in result.message for w in ("refused", "Permission denied", "may not write")), screen


@pytest.mark.parametrize("how", ["open_for_writing", "triton_cache_manager", "renaming_over_it"])
def test_a_file_cannot_rewrite_the_files_already_in_its_folder(tmp_path, how):
    """The learner's folder is writable for new files only: another lesson's file there (or the graded
    file itself) rewritten during a grading, by open() or through a library that writes files by an
    absolute name (Triton's cache manager), would be graded, or lost, as the learner never wrote it."""
    other = tmp_path / "l4_paged_prefill.py"
    other.write_text("# the learner's own work\n")
    writes = {
        "open_for_writing": f"open({str(other)!r}, 'w').write('# planted')\n",
        "triton_cache_manager": (
            "_M = triton.runtime.cache.get_cache_manager('0' * 64)\n"
            f"_M.put('# planted', {str(other)!r}, binary=False)\n"
        ),
        "renaming_over_it": (
            f"import os\nopen({str(tmp_path / 'new.txt')!r}, 'w').write('# planted')\n"
            f"os.replace({str(tmp_path / 'new.txt')!r}, {str(other)!r})\n"
        ),
    }
    result = grade_unchecked(tmp_path, t1_source(extra="\n" + writes[how]), "test_by_hand_lane_11_is_masked")
    assert other.read_text() == "# the learner's own work\n", one_screen(result)
    assert result.state == "does not import", one_screen(result)


def test_a_file_may_write_in_its_own_folder():
    """A learner's notes or debug output beside the file, inside the repository, are still allowed: the
    write succeeds, and what the grading left is moved out of the folder afterwards (so one grading's
    files never reach the next), kept under .drills/left-by-grading/, not lost."""
    folder = tempfile.mkdtemp(prefix="own-folder-", dir=os.path.join(ROOT, "drills"))
    try:
        T1 = find("t1")
        path = os.path.join(folder, f"{T1.stem}.py")
        notes = os.path.join(folder, "notes.txt")
        with open(path, "w") as f:
            f.write(t1_source(extra=f"\nopen({notes!r}, 'w').write('debug output')\n"))
        result = pytest_run.grade(
            T1, file=path, extra=["-k", "test_by_hand_lane_11_is_masked", "--drills-skip-source-check"]
        )
        assert outcome(result, "test_by_hand_lane_11_is_masked") == {"passed"}, one_screen(result)
        assert not os.path.exists(notes), "a file the grading wrote stayed in the learner's folder"
        kept = list((Path(ROOT) / ".drills" / "left-by-grading").glob("*/notes.txt"))
        assert any(k.read_text() == "debug output" for k in kept), "the grading's file was lost, not moved"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_shared_folder_is_never_swept():
    """A file graded straight from /tmp (or the repository's root) must not have the grading move every
    file that other programs made there meanwhile: only a folder of the learner's own is swept."""
    from drills.grading.grader import left_files
    from drills.grading.grader.learner_client import LearnerProcess

    for shared in ("/tmp", tempfile.gettempdir(), str(ROOT), os.path.join(ROOT, "drills")):
        assert not left_files.sweepable(shared), shared
    assert left_files.sweepable(os.path.join(ROOT, "drills", "mine"))
    process = LearnerProcess(os.path.join(tempfile.gettempdir(), "t1_vector_add.py"), "drills._graded_t1")
    try:
        assert process.folder is None, "a grading from the shared temp folder would sweep it"
    finally:
        process.close()
