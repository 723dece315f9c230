"""What a grading left in the learner's folder, taken out after it: the grader's side of the sandbox.

The learner's process may create files only in the graded file's own folder (learner/sandbox.py). The
grader snapshots that folder before the learner's process starts (`folder_files`) and, once the process
has stopped, moves out whatever is new (`remove_new_files`), so a file one grading writes (a planted .pyc,
a generated module) never reaches the next. A folder other programs share is never swept (`sweepable`).
"""

from __future__ import annotations

import os


def folder_files(folder: str) -> set[str]:
    """Every file and folder under `folder` now (the grader's snapshot of the learner's folder)."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(folder):
        found.update(os.path.join(dirpath, n) for n in dirnames + filenames)
    return found


def sweepable(folder: str) -> bool:
    """Whether a grading may move what it left in `folder`: a learner's own folder, never one that other
    programs share. A file graded straight from /tmp would otherwise have the sweep move every file that
    any process made in /tmp while the grading ran (another grading's pool output, an editor's swap)."""
    import tempfile

    from drills.lessons import ROOT

    real = os.path.realpath(folder)
    shared = {
        "/",
        "/tmp",
        "/var/tmp",
        tempfile.gettempdir(),
        os.path.expanduser("~"),
        str(ROOT),
        str(ROOT / "drills"),
    }
    return real not in {os.path.realpath(f) for f in shared}


def remove_new_files(folder: str, before: set[str]) -> list[str]:
    """Take out of `folder` what a grading left there that `before` (a folder_files snapshot) did not
    hold: a file one lesson's grading writes (a planted .pyc, a generated module) must not reach
    another's. Never touches anything that was there before. A file is moved, not deleted, to
    .drills/left-by-grading/<time>/ (a file the learner's editor saved while the grading ran is kept
    there, never lost). Returns the paths taken out."""
    import shutil
    import time

    from drills.lessons import ROOT

    removed = []
    keep = ROOT / ".drills" / "left-by-grading" / time.strftime("%Y%m%d-%H%M%S")
    for path in sorted(folder_files(folder) - before, key=len, reverse=True):  # files before their folders
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)  # only an empty folder: what was made in it is gone already
            else:
                target = keep / os.path.relpath(path, folder)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(path, target)
            removed.append(path)
        except OSError:
            pass
    return removed
