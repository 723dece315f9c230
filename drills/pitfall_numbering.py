"""The numbering that ties a lesson's four files together, checked by `make contract` without grading
anything: the explainer's pitfalls are numbered 1, 2, 3, ... once each; every `Mistake(pitfall=K)` of the
grader's MISTAKES and every mutant's `"K. ..."` names a titled pitfall K of the explainer (another
lesson's, `"L2 pitfall 5: ..."`, one of that lesson's), every titled pitfall has a Mistake and a mutant,
a Mistake's `section` is a section of the explainer, and every `# TODO(section 3.2 "Title")` of the stub
names a section that exists, with its title as the explainer spells it.

It reads the mutants (drills/mutants), so it sits above them; the stub contract (drills/contract.py)
does not import it, and `make contract` runs both.
"""

from __future__ import annotations

import importlib
import re
import tokenize
from io import StringIO

from drills import explainer
from drills.contract import contract_stub
from drills.lessons import ROOT, Lesson, find
from drills.mutants import load_mutants, pitfall_mismatches, titled_pitfalls

_TODO_SECTION = re.compile(r"TODO\((?:stage\s+\d+,\s*)?section\s+")
_SECTION_REF = re.compile(r'(\d+(?:\.\d+)*)(?:\s+"([^"\n]*)")?')
_NEXT_REF = re.compile(r"\s*(?:and|,)\s*(?:section\s+)?(?=\d)")
_OTHER_LESSON = re.compile(r"([A-Z]\d+) pitfall (\d+)")


def todo_sections(source: str) -> list[tuple[int, str, str | None]]:
    """(line, section number, title or None) for each section a `TODO(section 3.2 "Title")` of the source
    names; `TODO(stage 2, section 3.1 "The grid")` and `TODO(section 3.3 "exp2" and 3.4 "One key block")`
    too. Comments and strings alike: a stub's not-started raise may carry a TODO."""
    found = []
    for head in _TODO_SECTION.finditer(source):
        pos = head.end()
        while True:
            ref = _SECTION_REF.match(source, pos)
            if ref is None:
                break
            found.append((source.count("\n", 0, pos) + 1, ref.group(1), ref.group(2)))
            more = _NEXT_REF.match(source, ref.end())
            if more is None:
                break
            pos = more.end()
    return found


def _todo_without_section(source: str) -> list[int]:
    """Lines of the `# TODO` comments that name no section: every TODO points at the section teaching it."""
    lines = []
    for tok in tokenize.generate_tokens(StringIO(source).readline):
        text = tok.string.lstrip("# ")
        if tok.type == tokenize.COMMENT and re.match(r"TODO\b", text):
            if _TODO_SECTION.match(text) is None:
                lines.append(tok.start[0])
    return lines


def grader_mistakes(lesson: Lesson) -> list:
    """The grader's MISTAKES (drills/grading/grader/diagnose.py's Mistake list); [] when it declares none."""
    return list(getattr(importlib.import_module(f"drills.tests.{lesson.tests.stem}"), "MISTAKES", []))


def numbering_problems(
    lesson: Lesson, stub_source: str | None = None, explainer_text: str | None = None
) -> list[str]:
    """Where the explainer's pitfall and section numbers and the grader's MISTAKES, the mutants'
    `pitfall` prefixes and the stub's TODOs disagree; [] when they agree. stub_source: the stub to read
    (default: the one the contract checks, contract_stub); explainer_text: the explainer's (default:
    its file)."""
    problems = []
    where = lesson.explainer.relative_to(ROOT).as_posix()
    text = lesson.explainer.read_text() if explainer_text is None else explainer_text
    numbers = [p.number for p in explainer.parse_pitfalls(text)]
    if numbers != list(range(1, len(numbers) + 1)):
        problems.append(f"{where}: its pitfalls are numbered {numbers}, not 1 to {len(numbers)} once each")
    titled = titled_pitfalls(text)
    sections = {s.number: s.title for s in explainer.parse_sections(text)}

    try:
        mistakes = grader_mistakes(lesson)
    except Exception as exc:  # the grader is checked by make test; here only its table is read
        problems.append(f"{lesson.tests.name} does not import, so its MISTAKES cannot be read: {exc!r}")
        mistakes = []
    for m in mistakes:
        if m.pitfall not in titled:
            problems.append(
                f"MISTAKES of {lesson.tests.name} names pitfall {m.pitfall}, which {where} does not list "
                f"(its titled pitfalls: {titled or 'none'})"
            )
        if m.section and m.section not in sections:
            problems.append(
                f"MISTAKES of {lesson.tests.name}: pitfall {m.pitfall}'s section {m.section!r} is not a "
                f"section of {where}"
            )
    named = {m.pitfall for m in mistakes}
    problems += [
        f"pitfall {n} of {where} has no Mistake in {lesson.tests.name}'s MISTAKES, so no grading can name it"
        for n in titled
        if n not in named
    ]

    try:
        mutants = load_mutants(lesson.stem)
    except Exception as exc:
        problems.append(f"drills/mutants/{lesson.stem}.py does not import: {exc!r}")
        mutants = []
    if mutants:
        problems += [f"drills/mutants/{lesson.stem}.py: {p}" for p in pitfall_mismatches(lesson.stem, text)]
    else:
        problems += [
            f"pitfall {n} of {where} has no mutant in drills/mutants/{lesson.stem}.py" for n in titled
        ]
    for m in mutants:
        other = _OTHER_LESSON.match(m.pitfall)
        if other is None:
            continue
        try:
            theirs = find(other.group(1).lower())
        except SystemExit:
            problems.append(
                f"mutant {m.name} names pitfall {other.group(2)} of {other.group(1)}, no lesson's id"
            )
            continue
        if int(other.group(2)) not in titled_pitfalls(theirs.explainer.read_text()):
            problems.append(
                f"mutant {m.name} names {other.group(1)} pitfall {other.group(2)}, which "
                f"{theirs.explainer.relative_to(ROOT).as_posix()} does not list"
            )

    stub = contract_stub(lesson)[0] if stub_source is None else stub_source
    rel = lesson.stub.relative_to(ROOT).as_posix()
    for line, number, title in todo_sections(stub):
        if number not in sections:
            problems.append(
                f"{rel} line {line}: its TODO names section {number}, which {where} does not have"
            )
        elif title is not None and title != sections[number]:
            problems.append(
                f"{rel} line {line}: its TODO names section {number} {title!r}, but {where} titles it "
                f"{sections[number]!r}"
            )
    try:
        problems += [f"{rel} line {n}: a TODO that names no section" for n in _todo_without_section(stub)]
    except (tokenize.TokenError, SyntaxError):
        pass  # a stub that does not tokenize fails the contract's import already
    return problems
