"""How long `make test` takes per lesson on a CPU, measured and kept as data (`make times`).

`measure()` grades every reference as a learner's `make test L=<id> IMPL=solutions` does (its own
processes, the interpreter), a few times each, and keeps the fastest wall time and the CPU time of that
run, with the machine, its load and the versions, in drills/content/make_test_times.json. `render()`
turns that JSON into the README's table, between `<!-- make-test-times:start -->` and
`<!-- make-test-times:end -->`; tests/test_explainer_figures.py holds the README to the JSON, so the
prose never types a time by hand.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from drills.lessons import LESSONS, ROOT

DATA = ROOT / "drills" / "content" / "make_test_times.json"
README = ROOT / "README.md"
START, END = "<!-- make-test-times:start -->", "<!-- make-test-times:end -->"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_one(lesson_id: str, python: str = sys.executable) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds of every process it started, exit status) of one reference grading."""
    cpu, began = _children_cpu(), time.monotonic()
    proc = subprocess.run(
        [python, "-m", "drills", "test", lesson_id, "--impl", "solutions"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.monotonic() - began, _children_cpu() - cpu, proc.returncode


def measure(repeats: int = 2) -> dict:
    import torch
    import triton

    rows = []
    load_before = os.getloadavg()[0]
    for lesson in LESSONS:
        runs = [time_one(lesson.id) for _ in range(repeats)]
        wall, cpu, status = min(runs)
        rows.append(
            {"id": lesson.id, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "passed": status == 0}
        )
        print(
            f"{lesson.id:4} {wall:6.1f} s wall, {cpu:6.1f} s CPU{'' if status == 0 else ' (FAILED)'}",
            flush=True,
        )
    return {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, {platform.processor() or 'cpu'}",
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": triton.__version__,
        },
        "repeats": repeats,
        "lessons": rows,
    }


def render(data: dict) -> str:
    """The README's table of make test times, from the JSON."""
    lines = [
        f"Measured {data['date']} on {data['machine']} (load {data['load_before']} before, "
        f"{data['load_after']} after; Python {data['versions']['python']}, torch {data['versions']['torch']}, "
        f"Triton {data['versions']['triton']}), "
        + ("one run" if data["repeats"] == 1 else f"the fastest of {data['repeats']} runs")
        + " of `make test L=<id> IMPL=solutions` each:",
        "",
        "| lesson | wall (s) | CPU (s, every process) |",
        "| --- | --- | --- |",
    ]
    for row in data["lessons"]:
        lines.append(f"| {row['id']} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} |")
    return "\n".join(lines)


def readme_block(text: str) -> str | None:
    if START not in text or END not in text:
        return None
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def write_readme(data: dict) -> None:
    text = README.read_text()
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    README.write_text(f"{head}{START}\n{render(data)}\n{END}{tail}")


def main(write: bool) -> int:
    """Measure, save the JSON, and (with write) refill the README's table from it."""
    data = measure()
    DATA.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {DATA.relative_to(ROOT)}")
    if write:
        write_readme(data)
        print(f"rewrote the table in {README.relative_to(ROOT)}")
    return 0 if all(row["passed"] for row in data["lessons"]) else 1


def load() -> dict | None:
    try:
        return json.loads(Path(DATA).read_text())
    except (OSError, ValueError):
        return None
