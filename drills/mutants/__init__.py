"""Mutants: small source edits of a reference solution, each reproducing one classic mistake that the
lesson's explainer warns about. `drills/mutants/<stem>.py` declares `MUTANTS`, a list of Mutant; the
lesson's grader must fail every one. Adding a mutant is adding one entry.

The engine matches code, not text: `old` is found in the solution as a sequence of Python tokens, so
reformatting the solution (spacing, a line re-wrapped, a comment added, a trailing comma, the other
kind of quotes) keeps every mutant applying. The rules an author relies on:

- `old` must occur exactly once, as code; comments inside it are ignored.
- `old` that starts with indentation (`"        m = m_new\\n"`) matches only at the start of a
  statement, and `old` that ends with a newline only at the end of one; the whole lines are replaced.
- `new` is written for the solution as it was when the mutant was written; when the solution's
  indentation has moved since, every line of `new` after the first (and the first too when `old`
  starts with its indentation) moves by the same amount. The engine learns the old indentation from
  `old`: its leading whitespace, or the indentation of its later lines. When `old` spans several
  levels (the end of one function and the start of the next) and the solution moved them by different
  amounts, each line of `new` goes to where the solution has its level.
- A trailing comment of `old` that `new` repeats is kept from the solution; one `new` drops or
  changes replaces the solution's.

The lexer is a small regex one rather than the `tokenize` module: `old` is a fragment (unbalanced
brackets, a line cut in the middle), which tokenize rejects since Python 3.12.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from dataclasses import dataclass
from typing import NamedTuple

from drills import explainer
from drills.lessons import Lesson, find


class MutantError(ValueError):
    """A mutant that does not apply to the solution (its `old` matches no code, or more than one place)."""


@dataclass(frozen=True)
class Mutant:
    name: str  # short id, e.g. "interleaved_grouping"
    pitfall: str  # the explainer's pitfall it stands for, in words
    old: str  # code in drills/solutions/<stem>.py, matched as tokens (must occur exactly once)
    new: str  # what it becomes
    gpu_only: bool = False  # only a GPU run can expose it (e.g. int32 overflow on a > 4 GB cache)

    def apply(self, source: str) -> str:
        """source with `old` replaced by `new` (see the module docstring for the matching rules).
        Raises MutantError, naming the mutant, when `old` matches no code or more than one place."""
        return _apply(self, source)


class Mutated(NamedTuple):
    mutant: Mutant
    source: str | None  # the mutated solution; None when the mutant does not apply
    problem: str | None  # why it does not apply, or why the result does not parse; None when fine


def load_mutants(stem: str) -> list[Mutant]:
    """The lesson's declared mutants, or [] when drills/mutants/<stem>.py does not exist."""
    name = f"drills.mutants.{stem}"
    if importlib.util.find_spec(name) is None:
        return []
    return list(importlib.import_module(name).MUTANTS)


def mutate(lesson: Lesson | str, source: str | None = None) -> list[Mutated]:
    """Every declared mutant of the lesson (a Lesson, id or stem) applied to source (default: the
    lesson's solution file), in declaration order. A mutant that does not apply, or whose result does
    not parse, comes back with source None and the reason in problem; the others with problem None."""
    lesson = lesson if isinstance(lesson, Lesson) else find(lesson)
    if source is None:
        source = lesson.solution.read_text()
    results = []
    for mutant in load_mutants(lesson.stem):
        try:
            mutated = mutant.apply(source)
            compile(mutated, f"{lesson.stem}.py ({mutant.name})", "exec")
        except MutantError as exc:
            results.append(Mutated(mutant, None, str(exc)))
        except SyntaxError as exc:
            results.append(
                Mutated(mutant, None, f"mutant {mutant.name}: the mutated solution does not parse ({exc})")
            )
        else:
            results.append(Mutated(mutant, mutated, None))
    return results


def titled_pitfalls(explainer_text: str) -> list[int]:
    """Numbers of the pitfalls with a bold title (`N. **...**`), read by drills.explainer's parser. An
    item without a title (f1's "L2's pitfalls carry over") points at another lesson's pitfalls and
    needs no mutant of its own."""
    return [p.number for p in explainer.parse_pitfalls(explainer_text) if p.title]


def pitfall_mismatches(stem: str, explainer_text: str) -> list[str]:
    """Where the explainer's pitfall list and the lesson's mutants disagree: a pitfall with no mutant,
    or a mutant naming no listed pitfall (`N. ...`, or another lesson's `L2 pitfall N: ...`)."""
    listed = titled_pitfalls(explainer_text)
    mutants = load_mutants(stem)
    covered = set()
    problems = []
    for m in mutants:
        own = re.match(r"(\d+)\. ", m.pitfall)
        if own and int(own.group(1)) in listed:
            covered.add(int(own.group(1)))
        elif not re.match(r"[A-Z]\d+ pitfall \d+", m.pitfall):
            problems.append(f"mutant {m.name} names no pitfall of the explainer: {m.pitfall!r}")
    problems += [f"pitfall {n} of the explainer has no mutant" for n in listed if n not in covered]
    if mutants and not listed:
        problems.append("the explainer has no numbered pitfalls section")
    return problems


# --- The engine: tokens, matching, replacement ------------------------------------------------------

_LEXER = re.compile(
    r"""
    (?P<newline>\r?\n)
  | (?P<space>[ \t\f]+)
  | (?P<continuation>\\\r?\n)
  | (?P<comment>\#[^\r\n]*)
  | (?P<string>(?i:[rbuf]{0,2})(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"
                                  |'(?:\\.|[^\\'\r\n])*'|"(?:\\.|[^\\"\r\n])*"))
  | (?P<number>0[xXoObB][0-9a-fA-F_]+|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d[\d_]*)?[jJ]?)
  | (?P<name>[^\W\d]\w*)
  | (?P<op>\*\*=|//=|>>=|<<=|\.\.\.|->|:=|\*\*|//|<<|>>|[<>=!]=|[-+*/%@&|^]=|[-+*/%@&|^~<>()\[\]{},:;.=])
  | (?P<error>.)
""",
    re.X | re.S,
)

_CODE = ("string", "number", "name", "op", "error")
_OPENERS, _CLOSERS = "([{", ")]}"


@dataclass
class _Token:
    kind: str
    text: str
    start: int  # offsets into the text lexed
    end: int
    key: tuple = ()  # what matching compares
    optional: bool = False  # a comma right before a closing bracket: formatters add and remove them
    starts_statement: bool = False
    first_on_line: bool = False


def _key(kind: str, text: str) -> tuple:
    if kind == "string" and "f" not in text[:2].lower():
        try:  # 'x' and "x" are the same code
            value = ast.literal_eval(text)
            return ("string", type(value).__name__, value)
        except (ValueError, SyntaxError):
            pass
    return (kind, text)


def _code_tokens(text: str) -> list[_Token]:
    """The code tokens of text (comments, spaces, newlines and backslash continuations dropped), each
    marked with whether it starts a statement and whether it is the first code on its line."""
    tokens: list[_Token] = []
    depth, line_break, statement_break = 0, True, True
    for m in _LEXER.finditer(text):
        kind = m.lastgroup
        if kind == "newline":
            line_break = True
            statement_break = statement_break or depth == 0
            continue
        if kind not in _CODE:
            continue
        tok = _Token(
            kind,
            m.group(),
            m.start(),
            m.end(),
            _key(kind, m.group()),
            starts_statement=statement_break or bool(tokens and tokens[-1].text == ";"),
            first_on_line=line_break,
        )
        line_break = statement_break = False
        if kind == "op" and tok.text in _OPENERS:
            depth += 1
        elif kind == "op" and tok.text in _CLOSERS:
            depth = max(0, depth - 1)
            if tokens and tokens[-1].text == ",":
                tokens[-1].optional = True
        tokens.append(tok)
    return tokens


def _match(have: list[_Token], want: list[_Token], i: int) -> list[tuple[int, int]] | None:
    """Pairs (index in want, index in have) when want matches have from have[i], else None. Either side
    may have an optional comma (before a closing bracket) that the other lacks."""
    pairs, j, k = [], 0, i
    while j < len(want):
        if k < len(have) and have[k].key == want[j].key:
            pairs.append((j, k))
            j, k = j + 1, k + 1
        elif pairs and k < len(have) and have[k].optional:
            k += 1
        elif pairs and want[j].optional:
            j += 1
        else:
            return None
    return pairs


def _indentation(source: str, offset: int) -> tuple[int, int]:
    """(offset where the line holding offset starts, width of that line's indentation)."""
    line_start = source.rfind("\n", 0, offset) + 1
    line = source[line_start:]
    return line_start, len(line) - len(line.lstrip(" \t"))


def _column(text: str, offset: int) -> int:
    return offset - (text.rfind("\n", 0, offset) + 1)


def _shift(text: str, delta: int, first_line_too: bool) -> str:
    """text with every non-blank line after the first (and the first when asked) indented delta more."""
    if delta == 0:
        return text
    lines = text.split("\n")
    for n, line in enumerate(lines):
        if (n == 0 and not first_line_too) or not line.strip():
            continue
        if delta > 0:
            lines[n] = " " * delta + line
        else:
            lines[n] = line[min(-delta, len(line) - len(line.lstrip(" "))) :]
    return "\n".join(lines)


def _remap(text: str, levels: dict[int, int], delta: int, first_line_too: bool) -> str:
    """text with each non-blank line's indentation (after the first, and the first when asked) moved to
    where the solution has that level (levels: width in `old` -> width in the solution); a width `old`
    does not show moves with the nearest level below it (by delta when there is none)."""
    lines = text.split("\n")
    known = sorted(levels)
    for n, line in enumerate(lines):
        if (n == 0 and not first_line_too) or not line.strip():
            continue
        width = len(line) - len(line.lstrip(" "))
        below = [w for w in known if w <= width]
        moved = levels[below[-1]] + (width - below[-1]) if below else max(0, width + delta)
        lines[n] = " " * moved + line[width:]
    return "\n".join(lines)


def _trailing_comment(text: str) -> str | None:
    comments = [m.group() for m in _LEXER.finditer(text) if m.lastgroup == "comment"]
    return comments[-1].strip() if comments else None


def _apply(mutant: Mutant, source: str) -> str:
    want = _code_tokens(mutant.old)
    if not want:
        raise MutantError(f"mutant {mutant.name}: its old text holds no code")
    if any(t.kind == "error" for t in want):
        raise MutantError(
            f"mutant {mutant.name}: its old text is not whole Python tokens "
            f"(an unclosed string?): {mutant.old!r}"
        )
    old_head, old_tail = mutant.old[: want[0].start], mutant.old[want[-1].end :]
    anchored_start = old_head != "" and old_head.strip() == ""  # `old` starts with its indentation
    anchored_end = "\n" in old_tail  # `old` ends its line

    have = _code_tokens(source)
    matches = []
    for i in range(len(have)):
        if have[i].key != want[0].key or (anchored_start and not have[i].starts_statement):
            continue
        pairs = _match(have, want, i)
        if pairs is None:
            continue
        last = pairs[-1][1]
        if anchored_end and last + 1 < len(have) and not have[last + 1].starts_statement:
            continue
        matches.append(pairs)
    if len(matches) != 1:
        raise MutantError(
            f"mutant {mutant.name}: its old code occurs {len(matches)} times in the solution, "
            f"not once: {mutant.old!r}"
        )
    pairs = matches[0]
    first, last = have[pairs[0][1]], have[pairs[-1][1]]
    start, end = first.start, last.end
    new = mutant.new

    # The start: whole lines when `old` starts with its indentation, else where the first token starts.
    line_start, indent = _indentation(source, start)
    whole_lines = anchored_start and first.first_on_line
    if whole_lines:
        start = line_start
        delta = indent - len(old_head.rsplit("\n", 1)[-1].expandtabs())
    else:
        new = new.lstrip(" \t") if anchored_start else new
        delta = 0
        for j, k in pairs:  # the first later line of `old` that starts a line of the solution too
            if want[j].first_on_line and j > 0 and have[k].first_on_line:
                delta = _column(source, have[k].start) - _column(mutant.old, want[j].start)
                break
    # Every indentation level `old` spans, as it reads in `old` and in the solution: a mutant that
    # crosses levels (a function's end into the next def) follows a solution re-indented level by level.
    levels = {len(old_head.rsplit("\n", 1)[-1].expandtabs()): indent} if whole_lines else {}
    for j, k in pairs:
        if want[j].first_on_line and j > 0 and have[k].first_on_line:
            levels.setdefault(_column(mutant.old, want[j].start), _column(source, have[k].start))
    if all(width + delta == moved for width, moved in levels.items()):
        new = _shift(new, delta, first_line_too=whole_lines)
    else:
        new = _remap(new, levels, delta, first_line_too=whole_lines)

    # The end: through the newline when `old` ends its line; over the solution's trailing comment when
    # `old` has one that `new` does not repeat.
    eol = source.find("\n", end)
    eol = len(source) if eol < 0 else eol
    rest_is_comment = re.fullmatch(r"[ \t]*(#[^\n]*)?", source[end:eol]) is not None
    new_code = _code_tokens(new)
    new_tail_at = new_code[-1].end if new_code else 0
    old_comment = _trailing_comment(old_tail)
    if anchored_end:
        if rest_is_comment:
            end = min(eol + 1, len(source))
        else:
            new = new.rstrip()
    elif old_comment is not None:
        if _trailing_comment(new[new_tail_at:]) == old_comment:
            new = new[:new_tail_at]  # the solution's comment stays
        elif rest_is_comment:
            end = eol
    else:
        new = new[:new_tail_at] + new[new_tail_at:].rstrip(" \t")
    return source[:start] + new + source[end:]
