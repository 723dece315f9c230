"""`python -m drills new <stem>` (`make new STEM=<stem>`): a new lesson's files, each with the sections and
names the tools parse, its entry in drills/lessons.py and its row in the README's lesson table.

What it writes runs from the first minute: a placeholder kernel (out = 2 * x) in the reference, the stub
cut from it, a grader that the reference passes, an empty MISTAKES and MUTANTS, an explainer with every
section of LESSON.md and the bench markers, and a notebook. `make contract` accepts it and `make test`
calls the stub "not started"; the contributor then replaces each placeholder (CONTRIBUTING.md).

A stem is `<id>_<words>`: the id is letters then digits (`l5`), its letters upper-cased the track
(`L`), and the words a Python name (`paged_append`), which also names the placeholder's function and
kernel. The entry goes after the last lesson of its track in LESSONS (a new track goes before the
capstone), the README row after that lesson's row.

`python -m drills new <stem> --undo` (`make new STEM=<stem> UNDO=1`) takes back what `new` wrote and
nothing else: it reads the manifest `new` left in .drills/new/<stem>.json (each file it wrote with the
hash of what it wrote, and the one line it added to drills/lessons.py and to README.md), deletes each
new file that still holds what was written, and removes those two lines. A file edited since is kept
and named (--force deletes it too, still only the lesson's own files); any other change in the working
tree, a contributor's drills/mine work included, is never touched.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import keyword
import re
import shutil
import subprocess
import sys
from pathlib import Path

from drills.lessons import ROOT

STEM = re.compile(r"([a-z]+\d+)_([a-z][a-z0-9]*(?:_[a-z0-9]+)*)")
TRACK = re.compile(r"[A-Z]")
CAPSTONE = "C"  # the capstone's track stays last in course order


def lesson_paths(stem: str) -> list[str]:
    """The files of a lesson, relative to the repository (drills/lessons.py's Lesson properties)."""
    return [
        f"drills/content/{stem}.md",
        f"drills/solutions/{stem}.py",
        f"drills/mine/{stem}.py",
        f"drills/tests/test_{stem}.py",
        f"drills/mutants/{stem}.py",
        f"notebooks/{stem}.ipynb",
    ]


# --- The lesson list, read as code (the repository written to need not be the one imported) ---------


def listed_lessons(lessons_source: str) -> list[tuple[str, str, str, int, int]]:
    """(stem, title, track, first line, last line) of each `Lesson(stem, title, track)` in LESSONS, in order."""
    for node in ast.parse(lessons_source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "LESSONS" and isinstance(node.value, ast.Tuple):
            found = []
            for call in node.value.elts:
                values = [a.value for a in getattr(call, "args", []) if isinstance(a, ast.Constant)]
                if len(values) == 3:
                    found.append((*values, call.lineno, call.end_lineno))
            return found
    raise ValueError("drills/lessons.py has no LESSONS tuple of Lesson(stem, title, track) entries")


def _after(listed: list[tuple], track: str) -> int:
    """Index in listed after which a lesson of track goes: its track's last lesson, else before the
    capstone, else at the end."""
    same = [i for i, entry in enumerate(listed) if entry[2] == track]
    if same:
        return same[-1]
    capstone = [i for i, entry in enumerate(listed) if entry[2] == CAPSTONE]
    return (capstone[0] if capstone else len(listed)) - 1


def check_stem(stem: str, root: Path = ROOT, track: str | None = None) -> None:
    """Raise ValueError, in one line naming the argument, when the stem is malformed or taken."""
    found = STEM.fullmatch(stem or "")
    if found is None or keyword.iskeyword(found.group(2)):
        raise ValueError(
            f"stem {stem!r} is malformed: a stem is <id>_<words> in lower case, the id letters then digits "
            "and the words a Python name (e.g. l5_paged_append, id l5)"
        )
    if track is not None and TRACK.fullmatch(track) is None:
        raise ValueError(f"track {track!r} is malformed: one upper-case letter (T, L, F, C, ...)")
    listed = listed_lessons((root / "drills" / "lessons.py").read_text())
    for other, *_ in listed:
        if other == stem:
            raise ValueError(f"stem {stem!r} exists: drills/lessons.py lists it")
        if other.split("_", 1)[0] == found.group(1):
            raise ValueError(f"stem {stem!r} exists: its id {found.group(1)} is taken by {other}")
    for rel in lesson_paths(stem):
        if (root / rel).exists():
            raise ValueError(f"stem {stem!r} exists: {rel} is already there")


# --- The files --------------------------------------------------------------------------------------


def _q(text: str) -> str:
    """text as a double-quoted Python string literal (the quotes ruff format keeps)."""
    return json.dumps(text, ensure_ascii=False)


def _names(stem: str) -> dict[str, str]:
    lesson_id, words = STEM.fullmatch(stem).groups()
    return {"stem": stem, "id": lesson_id, "ID": lesson_id.upper(), "fn": words, "kernel": f"{words}_kernel"}


KERNEL_HEAD = """@triton.jit
def {kernel}(
    x_ptr,  # [n]
    out_ptr,  # [n]
    n,  # number of elements
    BLOCK: tl.constexpr,  # elements per program, a power of two (tl.arange needs one)
):
"""

LAUNCHER = '''

def _launch(x, out, BLOCK=1024, num_warps=4):
    """Launch without the input checks: a benchmark times this, {fn} adds the checks."""
    n = x.numel()
    grid = (triton.cdiv(n, BLOCK),)  # rounded up: the last block may be partly filled
    {kernel}[grid](x, out, n, BLOCK=BLOCK, num_warps=num_warps)
    return out


def {fn}(x):
    """out = 2 * x, elementwise (the scaffold's placeholder: say what the lesson computes, with shapes).

    x  [n], float16 or float32, contiguous, on the runtime's device

    Returns out [n], x's dtype.
    """
'''

CHECKS = """    validate.tensor("x", x, 1, DTYPES)
    validate.same_device(x=x)
    validate.contiguous(x=x)
    out = torch.empty_like(x)
    if x.numel() == 0:
        return out  # nothing to compute; a grid of zero programs is not launched
    return _launch(x, out)
"""

IMPORTS = """from __future__ import annotations

import torch
import triton
import triton.language as tl

from drills import validate

DTYPES = (torch.float16, torch.float32)


"""


def solution(n: dict[str, str], title: str) -> str:
    return (
        f'''"""{n["ID"]} reference: {title}.

What the kernel is for, and its bytes or FLOPs formula. The scaffold's placeholder doubles a vector, one
read and one write per element, so its time is bytes over bandwidth:

    bytes = 2 * n * element_size   # read x, write out

Read top to bottom: the kernel, then the launcher that validates, allocates and computes the grid.
Explainer: drills/content/{n["stem"]}.md.
"""

'''
        + IMPORTS
        + KERNEL_HEAD.format(**n)
        + """    # Section 3.1 "One program per block": this program owns elements [pid * BLOCK, (pid + 1) * BLOCK).
    pid = tl.program_id(0).to(tl.int64)  # int64: pid * BLOCK passes 2**31 on large inputs
    offs = pid * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    # Section 3.2 "The last block": BLOCK need not divide n, so the last program masks its tail.
    mask = offs < n  # [BLOCK]
    x = tl.load(x_ptr + offs, mask=mask)  # [BLOCK]
    tl.store(out_ptr + offs, 2 * x, mask=mask)
"""
        + LAUNCHER.format(**n)
        + CHECKS
    )


def stub(n: dict[str, str], title: str) -> str:
    message = (
        f"{n['id']} is not started: fill in {n['kernel']} in drills/mine/{n['stem']}.py, then delete this "
        f"line (read drills/content/{n['stem']}.md)"
    )
    return (
        f'''"""{n["ID"]}, your file: {title}.

Fill in `{n["kernel"]}` below; the launcher and the checks are complete. Read
drills/content/{n["stem"]}.md first: every TODO names the section that teaches it. Grade with
`make test L={n["id"]}`. Start by deleting the `raise NotImplementedError` line in {n["fn"]}.
"""

'''
        + IMPORTS
        + KERNEL_HEAD.format(**n)
        + """    # TODO(section 3.1 "One program per block"): the BLOCK element offsets this program owns, from its
    # program id widened to int64, [BLOCK].

    # TODO(section 3.2 "The last block"): a mask that is False past element n - 1; load x and store 2 * x,
    # both under the mask.
    pass
"""
        + LAUNCHER.format(**n)
        + f"    raise NotImplementedError(\n        {_q(message)}\n    )\n"
        + CHECKS
    )


def grader(n: dict[str, str], title: str) -> str:
    return f'''"""Grader for {n["ID"]}, {title}. Each test is named for the mistake it catches.

Run: make test L={n["id"]} (your drills/mine) or make test L={n["id"]} IMPL=solutions. The scaffold's checks
grade its placeholder (out = 2 * x): replace them with the lesson's (CONTRIBUTING.md, "The grader").
"""

from __future__ import annotations

import pytest
import torch

from drills.compare import assert_close
from drills.grading.grader.diagnose import Mistake
from drills.grading.shared.launches import assert_grids_fit, assert_runs_a_triton_kernel
from drills.tests import seeded, sizes
from drills.tests.domain import Domain

DIMS = ("i",)

# What the launcher admits, at its boundaries (the smallest and largest size, one past each tile, each
# dtype, each stride pattern): test_pairwise_domain_cases_match_the_oracle crosses every pair of them.
DOMAIN = Domain(axes=dict(n=(1, 1025), dtype=(torch.float16, torch.float32)))


def make_x(n, dtype, device, stream):
    gen = torch.Generator().manual_seed(seeded(stream))
    return torch.randn(n, generator=gen).to(dtype).to(device)  # [n]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_last_block_is_masked(impl, runtime, dtype):
    """n one past a multiple of the launcher's BLOCK = 1024: the last program's block holds one element,
    which must be written, and nothing past it."""
    n = sizes(runtime, 1025, (1 << 20) + 1)
    x = make_x(n, dtype, runtime.device, stream=1)
    assert_close(impl.{n["fn"]}(x), 2 * x.float(), DIMS)


def test_pairwise_domain_cases_match_the_oracle(impl, runtime):
    """Every pair of DOMAIN's boundary values in one generated case; a failure names the case's values."""

    def run(c):
        x = make_x(c["n"], c["dtype"], runtime.device, stream=3)
        assert_close(impl.{n["fn"]}(x), 2 * x.float(), DIMS)

    DOMAIN.check_each(DOMAIN.cases(stream=3), run)


def test_runs_a_triton_kernel(impl, runtime):
    """The right numbers are not enough: {n["fn"]} must compute them with your Triton kernel, not with torch."""
    x = make_x(100, torch.float32, runtime.device, stream=2)
    assert_runs_a_triton_kernel(impl, lambda: impl.{n["fn"]}(x), "{n["fn"]}")


def test_grid_fits_cuda_limits_at_largest_sizes(impl, runtime):
    """65537 blocks of 16: past the 65535 programs CUDA allows on grid axes 1 and 2. Run dry (every launch
    recorded and checked, none run): a grid only a real size would break fails on the CPU too."""
    x = torch.zeros(65536 * 16 + 1, dtype=torch.float16, device=runtime.device)  # [n]
    out = torch.empty_like(x)
    assert_grids_fit(impl, lambda: impl._launch(x, out, BLOCK=16), "_launch with 65537 blocks")


# --- Bounds: each constexpr of the reference's kernels and the tests that cross it (make contract) -----

BOUNDS = {{
    "BLOCK": ("test_last_block_is_masked",),
    "grid": ("test_grid_fits_cuda_limits_at_largest_sizes",),
}}


# --- Stages (optional): a steep lesson's checks in the order its stub's TODOs are filled in ----------
# A module-level STAGES, a list of drills.grading.grader.report.Stage (CONTRIBUTING.md, "Stages"); none yet.

# --- Diagnosis: which pitfall of drills/content/{n["stem"]}.md a pattern of results points to ---------
# One Mistake per way a pitfall shows (the rules: drills/grading/grader/diagnose.py's docstring); make contract
# checks that every titled pitfall has one and that each names a pitfall the explainer lists.

MISTAKES: list[Mistake] = []
'''


def mutants(n: dict[str, str], title: str) -> str:
    return f'''"""{n["ID"]} mutants: the classic mistakes of drills/content/{n["stem"]}.md's pitfalls, as edits of the
reference (the rules: drills/mutants/__init__.py). At least one per titled pitfall, its `pitfall`
starting with that pitfall's number, e.g.
Mutant("mask_dropped", "1. no mask on the last block", "mask = offs < n  # [BLOCK]", "mask = offs >= 0")."""

from drills.mutants import Mutant

MUTANTS: list[Mutant] = []
'''


def explainer(n: dict[str, str], title: str) -> str:
    return f"""# {n["ID"]} · {title}

Your file: `drills/mine/{n["stem"]}.py` · grade it: `make test L={n["id"]}` · reference:
`drills/solutions/{n["stem"]}.py` · notebook: `notebooks/{n["stem"]}.ipynb`

<!-- Written by `python -m drills new {n["stem"]}`: each section holds what it is for, in place of its text.
The format the tools parse is the module docstring of drills/explainer.py; CONTRIBUTING.md says the rest. -->

## 1. The picture

What the kernel is for in a real inference engine, and the one number that matters (bytes read, FLOPs,
memory saved), counted. The placeholder kernel, out = 2 × x, reads and writes each element once:
bytes = 2 × n × element size.

## 2. By hand: the worked example

A worked example with real numbers, small enough to check on paper, every intermediate value shown; the
grader checks the same numbers through the learner's code. The placeholder's: n = 6, BLOCK = 4,
x = [1, 2, 3, 4, 5, 6]. cdiv(6, 4) = 2 programs; program 1 owns offsets 4 to 7, of which 6 and 7 are
masked; out = [2, 4, 6, 8, 10, 12].

## 3. The kernel, piece by piece

The grid, what one program owns, the loop, the masks: one subsection each, and each TODO of the stub
names one of them.

### 3.1 One program per block

Program pid owns elements pid × BLOCK to (pid + 1) × BLOCK - 1; its program id is widened to int64
before the multiplication.

### 3.2 The last block

BLOCK need not divide n: the mask `offs < n` keeps the last program's tail from reading or writing.

## 4. Measured

The table `make bench L={n["id"]}` writes between the two markers (from drills/benchmarks/{n["stem"]}.py
once it exists), with the GPU, the versions and the date, the fraction of the same-run ceiling, and the
peers.

<!-- bench:start -->
<!-- bench:end -->

## 5. Pitfalls and self-test

Each pitfall has a test in `drills/tests/test_{n["stem"]}.py` that fails when you make it.

<!-- Each pitfall is an item at column 0 (this template is indented so that it is not read as one):

    1. **The mistake, in a few words.** What it does, and the symptom the learner sees. Caught by
       `test_last_block_is_masked`.
       *Self-test: a question the learner answers before reading on?*

and after the last item one paragraph starting "Answers" with the self-test's answers. Every titled
pitfall K needs a Mistake(pitfall=K) in the grader's MISTAKES and a mutant whose pitfall starts "K. "
in drills/mutants/{n["stem"]}.py: make contract checks the numbers, make mutants the diagnosis. -->

## 6. In real systems

Where production code does the same thing, by repository, file and function name, and what it does
differently.
"""


def _cell_id(stem: str, i: int) -> str:
    return hashlib.sha256(f"{stem}:{i}".encode()).hexdigest()[:8]


def notebook(n: dict[str, str], title: str) -> str:
    """A valid nbformat 4.5 notebook, not executed yet (make notebooks L=<id> WRITE=1 executes it)."""
    cells = [
        (
            "markdown",
            f"# {n['ID']} · {title}\n\nCompanion to `drills/content/{n['stem']}.md`. Runs top to bottom on a "
            f"CPU (Triton's interpreter) or a GPU. The kernel cells run your `drills/mine/{n['stem']}.py` once "
            f"it passes its grader (`make test L={n['id']}`), and the reference until then: the first cell "
            "prints which, and why.",
        ),
        (
            "code",
            "import drills  # chooses the runtime (GPU or interpreter) before any kernel module is imported\n"
            "import drills.runtime\nimport torch\n\nruntime = drills.runtime.current()\nprint(runtime.banner)\n\n"
            "from drills.notebook import implementation\n\n"
            f'{n["id"]}, note = implementation("{n["id"]}")  # your file once it passes its grader, '
            "else the reference\nprint(note)",
        ),
        (
            "markdown",
            "## 1. By hand: n = 6, BLOCK = 4\n\nThe explainer's worked example, through the kernel.",
        ),
        (
            "code",
            "x = torch.arange(1, 7, dtype=torch.float32, device=runtime.device)  # [6]\n"
            f"print({n['id']}.{n['fn']}(x).tolist())  # 2, 4, ..., 12",
        ),
    ]
    nb = {
        "cells": [
            {
                "cell_type": kind,
                "id": _cell_id(n["stem"], i),
                "metadata": {},
                "source": source.splitlines(keepends=True),
                **({"execution_count": None, "outputs": []} if kind == "code" else {}),
            }
            for i, (kind, source) in enumerate(cells)
        ],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


WRITERS = (explainer, solution, stub, grader, mutants, notebook)  # in lesson_paths' order


# --- Writing ----------------------------------------------------------------------------------------


def _with_entry(lessons_source: str, stem: str, title: str, track: str) -> tuple[str, str]:
    """(lessons.py with the new entry, the id of the lesson it follows)."""
    listed = listed_lessons(lessons_source)
    if not listed:
        raise ValueError("drills/lessons.py's LESSONS is empty: add the first entry by hand")
    i = _after(listed, track)
    lines = lessons_source.splitlines(keepends=True)
    at = listed[i][4] if i >= 0 else listed[0][3] - 1  # lines kept before the entry
    entry = f"    Lesson({_q(stem)}, {_q(title)}, {_q(track)}),\n"
    return "".join(lines[:at] + [entry] + lines[at:]), (listed[i][0].split("_", 1)[0] if i >= 0 else "")


_ROW = re.compile(r"^\| (\w+) \| [A-Z] \| ")


def _with_row(readme: str, n: dict[str, str], title: str, track: str, after_id: str) -> str | None:
    """The README with the lesson's row after after_id's row (before the first one when after_id is
    ""); None when the README has no lesson table."""
    lines = readme.splitlines(keepends=True)
    rows = [i for i, line in enumerate(lines) if _ROW.match(line)]
    if not rows:
        return None
    at = next((i + 1 for i in rows if _ROW.match(lines[i]).group(1) == after_id), None)
    at = rows[0] if not after_id else (rows[-1] + 1 if at is None else at)
    explainer_path = f"drills/content/{n['stem']}.md"
    row = f"| {n['id']} | {track} | {title} | [{explainer_path}]({explainer_path}) |\n"
    return "".join(lines[:at] + [row] + lines[at:])


def _formatted(paths: list[Path], root: Path) -> None:
    """ruff format the new Python files that make lint checks, when ruff is installed (a long stem
    or title can wrap a line differently from the templates)."""
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff:
        subprocess.run([ruff, "format", "--quiet", *map(str, paths)], cwd=root, check=False)


def create(stem: str, title: str | None = None, track: str | None = None, root: Path = ROOT) -> list[str]:
    """Write the lesson's files under root and its entry in drills/lessons.py (and README row); return
    what was written, relative to root. Raises ValueError before writing anything when the stem is
    malformed or taken (check_stem)."""
    check_stem(stem, root, track)
    n = _names(stem)
    track = track or re.match(r"[a-z]+", n["id"]).group(0)[0].upper()
    title = (title or n["fn"].replace("_", " ").capitalize()).strip().rstrip(".")
    if not title or any(ch in title for ch in '\n"\\|'):
        raise ValueError(
            f"title {title!r} is malformed: one line without double quotes, backslashes or '|' "
            "(it goes into docstrings and the README's table)"
        )
    lessons_file = root / "drills" / "lessons.py"
    lessons_source, after_id = _with_entry(lessons_file.read_text(), stem, title, track)
    added = {}  # file -> the text `new` added to it, which undo removes
    written = []
    for rel, write in zip(lesson_paths(stem), WRITERS):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(write(n, title))
        written.append(rel)
    lessons_file.write_text(lessons_source)
    written.append("drills/lessons.py")
    readme = root / "README.md"
    if readme.exists():
        updated = _with_row(readme.read_text(), n, title, track, after_id)
        if updated is not None:
            readme.write_text(updated)
            written.append("README.md")
            explainer_path = f"drills/content/{stem}.md"
            added["README.md"] = f"| {n['id']} | {track} | {title} | [{explainer_path}]({explainer_path}) |\n"
    _formatted(
        [root / rel for rel in written if rel.endswith(".py") and not rel.startswith("drills/mine/")], root
    )
    # The entry as it stands after formatting (a long title may have been wrapped over several lines).
    source = lessons_file.read_text()
    entry = next(e for e in listed_lessons(source) if e[0] == stem)
    added["drills/lessons.py"] = "".join(source.splitlines(keepends=True)[entry[3] - 1 : entry[4]])
    _write_manifest(root, stem, {rel: _sha(root / rel) for rel in lesson_paths(stem)}, added)
    return written


# --- Undo: only what `new` wrote ---------------------------------------------------------------


def manifest_path(root: Path, stem: str) -> Path:
    """Where `new` records what it wrote: under .drills/, which git ignores."""
    return root / ".drills" / "new" / f"{stem}.json"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write_manifest(root: Path, stem: str, files: dict[str, str], lines: dict[str, str]) -> None:
    path = manifest_path(root, stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stem": stem, "files": files, "lines": lines}, indent=1) + "\n")


def undo(stem: str, root: Path = ROOT, force: bool = False) -> tuple[list[str], list[str]]:
    """Take back what `create(stem)` wrote under root, from its manifest: (what was removed, what was
    kept because it changed since, each with the reason). Raises ValueError, naming the stem, when no
    manifest exists (nothing of it was written by `new`, or it was undone already)."""
    path = manifest_path(root, stem)
    if not path.exists():
        raise ValueError(
            f"stem {stem!r}: no record of `new` writing it ({path.relative_to(root)} is absent), so undo "
            "removes nothing; it takes back only what `make new` wrote, and only once"
        )
    record = json.loads(path.read_text())
    removed, kept, left = [], [], {}
    for rel, sha in record["files"].items():
        file = root / rel
        if not file.exists():
            continue
        if force or _sha(file) == sha:
            file.unlink()
            removed.append(rel)
        else:
            kept.append(f"{rel} (edited since `new` wrote it; --force deletes it)")
            left[rel] = sha
    for rel, line in record["lines"].items():
        file = root / rel
        text = file.read_text() if file.exists() else ""
        if text.count(line) == 1:
            file.write_text(text.replace(line, "", 1))
            removed.append(f"{rel}: {line.strip()}")
        elif line not in text:
            kept.append(f"{rel} (its line for {stem} is gone already)")
        else:
            kept.append(f"{rel} (its line for {stem} is there more than once; remove it by hand)")
    if left:  # what --force may still delete; the lines are dealt with
        _write_manifest(root, stem, left, {})
    else:
        path.unlink()  # done: a second undo finds no record
    return removed, kept


def parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("stem", help="<id>_<words>, e.g. l5_paged_append (id l5, track L)")
    p.add_argument("--title", default=None, help="the lesson's title in make list (default: from the stem)")
    p.add_argument("--track", default=None, help="one upper-case letter (default: the id's letter)")
    p.add_argument(
        "--undo", action="store_true", help="take back what `new` wrote for this stem, nothing else"
    )
    p.add_argument(
        "--force", action="store_true", help="with --undo: delete the lesson's new files even if edited"
    )
    return p


def main(args) -> int:
    if args.undo:
        try:
            removed, kept = undo(args.stem, force=args.force)
        except ValueError as exc:
            print(f"python -m drills new --undo: {exc}", file=sys.stderr)
            return 2
        print("undone: " + (", ".join(removed) if removed else "nothing left to remove"))
        for k in kept:
            print(f"kept: {k}")
        return 1 if kept else 0
    try:
        written = create(args.stem, args.title, args.track)
    except ValueError as exc:
        print(f"python -m drills new: {exc}", file=sys.stderr)
        return 2
    lesson_id = _names(args.stem)["id"]
    print(f"new lesson {lesson_id}: wrote " + ", ".join(written))
    print(
        f"next (CONTRIBUTING.md): replace each placeholder; make contract; make test L={lesson_id} "
        f"IMPL=solutions; the pitfalls with their Mistakes and mutants, make mutants L={lesson_id}; "
        f"make notebooks L={lesson_id} WRITE=1; commit the files together"
    )
    return 0
