"""The sparse files' folders (drills/grading/shared/bigmem.py) do not pile up in the temporary folder:
a process that ends without running atexit (os._exit in a forked grading, a kill at a timeout) leaves
its folder, and the next process to make one removes it."""

import os
import subprocess
import sys
import tempfile

from drills.grading.shared import bigmem


def _folders() -> set[str]:
    tmp = tempfile.gettempdir()
    return {n for n in os.listdir(tmp) if n.startswith("drills-sparse-")}


def test_a_folder_left_by_a_process_that_skipped_atexit_is_removed_by_the_next():
    code = (
        "import os, torch\n"
        "from drills.grading.shared import bigmem\n"
        "t = bigmem.sparse_empty((1024,), torch.float32)\n"
        "print(bigmem.sparse_folder(), flush=True)\n"
        "os._exit(0)\n"
    )
    left = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert os.path.isdir(left), "the process's folder should still be there: it skipped atexit"
    assert os.path.basename(left).startswith(f"drills-sparse-{_pid_of(left)}-")
    # Another process making its folder removes the dead one's.
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert not os.path.exists(left), f"{left} was left by a process that ended and was not removed"


def test_a_live_process_folder_is_kept():
    mine = bigmem.sparse_folder()
    code = "from drills.grading.shared import bigmem\nbigmem._DIR = None\nbigmem._reap_orphans()\n"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert os.path.isdir(mine), "the folder of a process that still runs was removed"
    assert os.path.basename(mine) in _folders()


def _pid_of(path: str) -> str:
    return os.path.basename(path)[len("drills-sparse-") :].split("-", 1)[0]
