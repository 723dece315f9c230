"""Command line behind the Makefile: python -m drills {list,test,check,lint,contract,notebooks,mutants,
bench}, the learner's tools {progress,hint,reset,diff,watch} (drills/learner.py), doctor
(drills/doctor.py), chat (drills/engine/chat.py) and new, a new lesson's files (drills/scaffold.py).
The learner's tools are plain functions of their arguments; this module only parses the command line."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path

from drills import contract, doctor, learner, pitfall_numbering, scaffold, stubs
from drills.engine import chat
from drills.grading.grader import pytest_run
from drills.lessons import LESSONS, ROOT, find


def cmd_list(args) -> int:
    for lesson in LESSONS:
        print(f"{lesson.id:4} {lesson.track}  {lesson.stem:28} {lesson.title}")
    return 0


def cmd_test(args) -> int:
    """One lesson: one screen (its checks, the likely mistake, what to reread); VERBOSE=1 (V=1) gives
    pytest's own output as well. Without a lesson, every lesson's grader on one line each."""
    import drills.runtime

    verbose = args.verbose or pytest_run.verbose_requested()
    lessons = [find(args.lesson)] if args.lesson else LESSONS
    if verbose or len(lessons) > 1 or args.pytest_args:
        return pytest_run.run_pytest_here(
            [str(lesson.tests) for lesson in lessons], args.impl, verbose=verbose, extra=args.pytest_args
        )
    lesson = lessons[0]
    print(drills.runtime.current().banner, flush=True)
    result = pytest_run.grade(lesson, impl=args.impl)
    if args.impl == "mine":
        learner.remember(result)  # make hint reads it when the file has not changed since
    if result.state == "not started":
        print(result.message)  # one line, as the stub words it
        return pytest_run.NOT_STARTED_EXIT
    print("\n".join(result.screen()))
    return 0 if result.passed else 1


def cmd_contract(args) -> int:
    failed = 0
    for lesson in [find(args.lesson)] if getattr(args, "lesson", None) else LESSONS:
        # The numbering first: the contract's last line, when it fails, says which stub it read.
        problems = pitfall_numbering.numbering_problems(lesson) + contract.check(lesson)
        print(f"stub contract {lesson.id}: {'ok' if not problems else 'FAILED'}")
        for p in problems:
            print(f"  - {p}")
        failed += bool(problems)
    return 1 if failed else 0


def cmd_notebooks(args) -> int:
    """Execute every notebook (or the lessons named) top to bottom, from the repository root. Without
    --write each runs in a copy held in memory, so the files are unchanged (make check). With --write
    the outputs are written back into the files, in the form that is committed: the default SEED's
    random cases, a fixed PYTHONHASHSEED, no timing and no kernel metadata, so running it again on the
    same machine changes nothing."""
    if importlib.util.find_spec("nbclient") is None or importlib.util.find_spec("ipykernel") is None:
        print("notebooks: skipped, Jupyter (nbclient, ipykernel) is not installed in this Python")
        return 0
    import os
    import time

    import nbformat
    from nbclient import NotebookClient

    write = getattr(args, "write", False)
    lessons = [find(name) for name in args.lesson] if getattr(args, "lesson", None) else LESSONS
    saved = dict(os.environ)
    if write:  # the kernel inherits this environment
        os.environ["PYTHONHASHSEED"] = "0"
        for name in ("SEED", "MPLBACKEND"):  # the committed cases; matplotlib's inline backend
            os.environ.pop(name, None)
    failed = 0
    try:
        for lesson in lessons:
            mine = learner.mine_file(lesson)
            if write and mine.exists() and mine.read_text() != stubs.pristine_stub_source(lesson):
                print(
                    f"notebook {lesson.notebook.name}: {mine} differs from the committed stub: the notebook "
                    "grades it and runs it if it passes, so the outputs written may not be the reference's"
                )
            nb = nbformat.read(lesson.notebook, as_version=4)
            began = time.monotonic()
            try:
                NotebookClient(
                    nb,
                    timeout=600,
                    kernel_name="python3",
                    record_timing=False,
                    coalesce_streams=True,  # one stream output per cell, however the prints were flushed
                    resources={"metadata": {"path": str(ROOT)}},
                ).execute()
            except Exception as exc:  # nbclient raises CellExecutionError with the cell's traceback
                print(f"notebook {lesson.notebook.name}: FAILED\n{exc}")
                failed += 1
                continue
            took = time.monotonic() - began
            if write:
                # language_info names this machine's Python: left out, like the execution timestamps.
                nb.metadata = nbformat.from_dict({"kernelspec": nb.metadata["kernelspec"]})
                nbformat.write(nb, lesson.notebook)
            print(
                f"notebook {lesson.notebook.name}: ran top to bottom in {took:.0f} s"
                + (", outputs written" if write else ""),
                flush=True,
            )
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return 1 if failed else 0


def tool_tests() -> list[str]:
    """The tools' own tests (harness, learner tools, contract, engine, CUDA graphs): tests/ at the top."""
    return sorted(str(p) for p in (ROOT / "tests").glob("test_*.py"))


def check_groups(cores: int | None = None) -> list[list[str]]:
    """make check's tests in pytest processes run side by side, balanced by their estimated time
    (check_cost): two processes on two cores (CI), up to one per core on more (a GPU box), where a tool
    test file past SPLIT_BYTES is cut into parts by its test functions (node ids), since the harness's
    tests each grade a file of their own and one process for them all would be the long pole. Longest
    first into the least-loaded process."""
    cores = cores or os.cpu_count() or 2
    files = [str(lesson.tests) for lesson in LESSONS] + tool_tests()
    items = []
    for t in files:
        cost = check_cost(t)
        parts = -(-Path(t).stat().st_size // SPLIT_BYTES) if cores >= 4 else 1
        names = _test_functions(t) if parts > 1 and Path(t).parent == ROOT / "tests" else []
        if len(names) < 2:
            items.append((cost, [t]))
            continue
        for k in range(parts):
            chosen = names[k::parts]
            items.append((cost * len(chosen) / len(names), [f"{t}::{n}" for n in chosen]))
    items.sort(key=lambda item: -item[0])
    groups: list[list[str]] = [[] for _ in range(min(max(cores, 2), len(items)))]
    loads = [0.0] * len(groups)
    for cost, ids in items:
        i = loads.index(min(loads))
        groups[i] += ids
        loads[i] += cost
    return [g for g in groups if g]


SPLIT_BYTES = 50_000  # a tool test file weighing more runs in parts on a many-core machine
# A test file that grades files of its own (it starts `make test`'s processes for each) takes about four
# times a lesson grader's time per byte: the H200 took 414 s for the harness's 50 kB, 75 s for C1's 60 kB.
GRADES_FILES = ("pytest_run.grade(", "LearnerProcess(", '"-m", "drills"')
GRADES_FILES_FACTOR = 4


def check_cost(path: str) -> float:
    """A test file's estimated seconds in make check: a lesson grader's measured make test time
    (drills/content/make_test_times.json, `make times`), else its size at the graders' measured seconds
    per byte, times GRADES_FILES_FACTOR for a file that grades files of its own (GRADES_FILES)."""
    from drills import grading_times

    measured = {row["id"]: row["wall_s"] for row in (grading_times.load() or {}).get("lessons", [])}
    by_path = {str(lesson.tests): lesson.id for lesson in LESSONS}
    timed = [(measured[i], Path(t).stat().st_size) for t, i in by_path.items() if i in measured]
    per_byte = sum(s for s, _ in timed) / sum(b for _, b in timed) if timed else 1e-3
    if by_path.get(path) in measured:
        return measured[by_path[path]]
    text = Path(path).read_text()
    return (
        len(text.encode()) * per_byte * (GRADES_FILES_FACTOR if any(g in text for g in GRADES_FILES) else 1)
    )


def _test_functions(path: str) -> list[str]:
    """The names of a test file's top-level test functions, in file order (read, not imported)."""
    import ast

    tree = ast.parse(Path(path).read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


def cmd_lint(args) -> int:
    """The formatter and the linter, configured in pyproject.toml ([tool.ruff]); args.fix rewrites."""
    import shutil
    import subprocess

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        # As for Jupyter: a Python named with PYTHON= (a GPU box) may not have the dev tools; that is not
        # a formatting failure, and CI's venv always has ruff.
        print(
            f"lint: skipped, ruff is not installed in this Python; get it with {sys.executable} -m pip install "
            "ruff (or pip install -e '.[dev]'; make builds it into .venv)"
        )
        return 0
    fix = getattr(args, "fix", False)
    steps = [
        [ruff, "format", *([] if fix else ["--check", "--diff"]), "drills", "tests"],
        [ruff, "check", *(["--fix"] if fix else []), "drills", "tests"],
    ]
    return max(subprocess.run(step, cwd=ROOT).returncode for step in steps)


def cmd_check(args) -> int:
    """What CI runs: every lesson's tests on the solutions and the learner tools' tests, the stub
    contract, every notebook, and every mutant this machine can expose."""
    import drills.runtime

    args.lesson = None
    # On a GPU, check grades only the GPU-only mutants: each mutant recompiles its kernels, and the CPU
    # ones are graded by CI (make mutants on a GPU grades them all).
    args.gpu_only_mutants = not drills.runtime.current().interpreter
    phases = {
        "format and lint": lambda: cmd_lint(args),
        # --durations: each process prints its slowest 10 checks (the gradings that set the pace)
        "tests (solutions, tools)": lambda: pytest_run.run_pytest_side_by_side(
            check_groups(), "solutions", ["--tb=short", "-rfEs", "--durations=10", "--durations-min=1"]
        ),
        "stub contract": lambda: cmd_contract(args),
        "notebooks": lambda: cmd_notebooks(args),
        "mutants": lambda: cmd_mutants(args),
    }
    results, took = {}, {}
    for name, phase in phases.items():
        began = time.monotonic()
        results[name] = phase()
        took[name] = time.monotonic() - began
        print(f"make check: {name} took {took[name]:.0f} s", flush=True)
    print(
        "make check: "
        + ", ".join(f"{k} {'ok' if rc == 0 else 'FAILED'} ({took[k]:.0f} s)" for k, rc in results.items())
    )
    return 0 if all(rc == 0 for rc in results.values()) else 1


def cmd_times(args) -> int:
    """make test's time per lesson on this machine (drills/grading_times.py); --write refills the README."""
    from drills import grading_times

    return grading_times.main(write=args.write)


def cmd_mutants(args) -> int:
    """Grade every mutant (drills/mutants/grade.py): each must fail its grader and be named as its pitfall."""
    from drills.mutants.grade import grade_mutants

    return grade_mutants(
        args.lesson, gpu_only=getattr(args, "gpu_only_mutants", False), full=getattr(args, "full", False)
    )


def cmd_guards(args) -> int:
    """The references' device guards on a GPU: every bad device value under compute-sanitizer
    (drills/benchmarks/memcheck.py; the whole output, the sanitizer's summary included, goes to
    drills/content/device_guards.memcheck.log), then the guards' cost on each lesson's benchmark shapes
    (drills/benchmarks/guard_cost.py, into drills/content/device_guards.bench.json)."""
    import datetime
    import shutil
    import subprocess

    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        print("make guards: compute-sanitizer is not on PATH (it comes with the CUDA toolkit)")
        return 2
    log = ROOT / "drills" / "content" / "device_guards.memcheck.log"
    if shutil.which("nvidia-smi") is None:
        print("make guards needs a CUDA GPU (compute-sanitizer watches GPU memory)")
        return 2
    command = [sanitizer, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-m"]
    command.append("drills.benchmarks.memcheck")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = f"$ make guards: the memcheck ({stamp}; exit status {done.returncode})\n{done.stdout}{done.stderr}"
    log.write_text(text)
    print(text)
    if done.returncode != 0:
        return done.returncode
    from drills.benchmarks import guard_cost

    return guard_cost.main()


def cmd_bench(args) -> int:
    """Time each lesson's benchmark; a module with NEEDS_CUDA = False (pure-Python lessons) runs on a CPU."""
    import drills.runtime
    from drills import bench

    lessons = (
        [find(args.lesson)] if args.lesson else [lesson for lesson in LESSONS if lesson.benchmark.exists()]
    )
    print(drills.runtime.current().banner, flush=True)
    failed = 0
    for lesson in lessons:
        if not lesson.benchmark.exists():
            print(f"{lesson.id}: has no benchmark")
            continue
        module = bench.benchmark_module(lesson)
        reason = bench.require_cuda() if getattr(module, "NEEDS_CUDA", True) else None
        if reason:
            print(f"make bench L={lesson.id}: {reason}")
            failed += 1
            continue
        impl = (
            learner.load_mine(lesson)
            if args.impl == "mine"
            else importlib.import_module(lesson.module(args.impl))
        )
        message = stubs.not_started_message(impl)
        if message:
            print(message)
            failed += 1
            continue
        print(f"== {lesson.id}: {lesson.title} ({args.impl}) ==", flush=True)
        table, notes = module.run(impl)
        if args.impl == "solutions":  # only the reference's numbers go into the explainer
            bench.publish(lesson, table, notes, module.plot)
        else:
            bench.print_comparison(lesson, module, table)
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m drills")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the lessons in course order").set_defaults(fn=cmd_list)
    p = sub.add_parser("test", help="grade one lesson (or all)")
    p.add_argument("lesson", nargs="?")
    p.add_argument("--impl", choices=("mine", "solutions"), default="mine")
    p.add_argument("-v", "--verbose", action="store_true", help="pytest's full output too (or VERBOSE=1)")
    p.add_argument("pytest_args", nargs="*")
    p.set_defaults(fn=cmd_test)
    sub.add_parser("check", help="tests on the solutions, stub contract, notebooks").set_defaults(
        fn=cmd_check
    )
    p = sub.add_parser("lint", help="ruff: the formatter (check) and the linter; --fix rewrites")
    p.add_argument("--fix", action="store_true")
    p.set_defaults(fn=cmd_lint)
    p = sub.add_parser("contract", help="the stub contract only (one lesson or all)")
    p.add_argument("lesson", nargs="?")
    p.set_defaults(fn=cmd_contract)
    p = sub.add_parser(
        "notebooks", help="execute every notebook (or the lessons named); --write keeps the outputs"
    )
    p.add_argument("lesson", nargs="*")
    p.add_argument(
        "--write", action="store_true", help="write the outputs back into the files (to commit them)"
    )
    p.set_defaults(fn=cmd_notebooks)
    p = sub.add_parser("times", help="make test's time per lesson on this machine, kept as data")
    p.add_argument("--write", action="store_true", help="also refill the README's table from the data")
    p.set_defaults(fn=cmd_times)
    p = sub.add_parser("mutants", help="every lesson's mutants must fail its grader")
    p.add_argument("lesson", nargs="?")
    p.add_argument(
        "--full",
        action="store_true",
        help="grade every mutant in full too, and check that the selected checks gave the same verdict",
    )
    p.set_defaults(fn=cmd_mutants)
    sub.add_parser(
        "guards",
        help="the references' device guards: every bad value under compute-sanitizer, their cost (GPU)",
    ).set_defaults(fn=cmd_guards)
    p = sub.add_parser("bench", help="benchmarks (CUDA GPU only)")
    p.add_argument("lesson", nargs="?")
    p.add_argument("--impl", choices=("mine", "solutions"), default="solutions")
    p.set_defaults(fn=cmd_bench)
    sub.add_parser(
        "progress", help="every lesson's status for your files, and the next one to take"
    ).set_defaults(fn=lambda args: learner.progress())
    p = sub.add_parser("hint", help="one more hint for a lesson (its TODOs, then its pitfalls)")
    p.add_argument("lesson")
    p.add_argument("--restart", action="store_true", help="start again from the first hint")
    p.set_defaults(fn=lambda args: learner.hint(find(args.lesson), restart=args.restart))
    p = sub.add_parser("reset", help="back up your file under .drills/backups, then restore the stub")
    p.add_argument("lesson")
    p.set_defaults(fn=lambda args: learner.reset(find(args.lesson)))
    p = sub.add_parser("diff", help="once a lesson passes, your file beside the reference")
    p.add_argument("lesson")
    p.set_defaults(fn=lambda args: learner.diff(find(args.lesson)))
    p = sub.add_parser("watch", help="re-grade a lesson on every save of your file")
    p.add_argument("lesson")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between looks at the file")
    p.add_argument("--max-runs", type=int, default=None, help="stop after this many gradings")
    p.set_defaults(fn=lambda args: learner.watch(find(args.lesson), args.interval, args.max_runs))
    sub.add_parser("doctor", help="versions, GPU, runtime, and the known traps with what to do").set_defaults(
        fn=lambda args: doctor.main()
    )
    p = sub.add_parser("chat", help="chat with SmolLM2 served by the engine on your kernels (make chat)")
    chat.parser(p).set_defaults(fn=chat.main)  # the engine's extra is imported only when it runs
    p = sub.add_parser("new", help="a new lesson's files and entry, ready to fill in (drills/scaffold.py)")
    scaffold.parser(p).set_defaults(fn=scaffold.main)
    argv = sys.argv[1:] if argv is None else list(argv)
    extra = []
    if "--" in argv:  # pytest's own options: python -m drills test l4 --impl solutions -- --durations=10
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    if extra:
        if getattr(args, "pytest_args", None) is None:
            parser.error(f"only `test` passes what follows -- to pytest, not `{args.command}`")
        args.pytest_args = [*args.pytest_args, *extra]
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
