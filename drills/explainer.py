"""Reading a lesson's explainer (drills/content/<stem>.md): its numbered sections, the pitfalls of its
"Pitfalls and self-test" section, and which section teaches the mistake a given check catches. The
one parser of that format: the learner tools, the grading summary and the mutants' coverage check
all read through it.

The format the tools parse (everything else in the file is free prose):

- Sections: headings `## N. Title`, subsections `### N.M Title` (and `#### N.M.K`); the dot after
  the number is optional, `# Title` (the file's title) is not a section, and headings inside ```
  fences are ignored. A section's body is its text up to the next heading of any level. A grader's
  `Mistake(section="3.4")` names one (drills/grading/grader/diagnose.py): `make hint` quotes the first 14
  non-blank lines of its body as the third hint, so each worked example should open its section.
- Pitfalls: the first section whose title contains "pitfall" (`## 5. Pitfalls and self-test`). Each
  item starts at column 0 as `K. **Title.** text`; its continuation lines are indented (lines at
  column 0 that are not an item are skipped), so the self-test question (`*Self-test: ...*`) sits
  indented inside its item. The list ends at the first line starting with "Answers" (the self-test's
  answers, one paragraph); nothing after it is read as a pitfall. An item without a bold title
  (F1's "L2's pitfalls carry over") is a pointer, not a pitfall: it needs no mutant.
- "Caught by `test_name`": each pitfall names the checks that catch it. When a check fails, the
  summary sends the learner to the pitfalls whose text names the check as a whole word and the
  sections whose body does (two places at most, where_taught), else to the pitfalls section as a whole.
- Mutants: every titled pitfall K needs a mutant in drills/mutants/<stem>.py whose `pitfall` starts
  "K. ", and every mutant names one (or another lesson's, "L2 pitfall 5: ..."); `make mutants`
  checks both (drills.mutants.pitfall_mismatches). The grader's MISTAKES refer to pitfall K by
  number, `Mistake(pitfall=K)`.
- Bench markers: a line `<!-- bench:start -->` and a line `<!-- bench:end -->` (in the "Measured"
  section); `make bench L=<id>` replaces everything between them with the table, its notes and the
  plot (drills.bench.publish), and stops with an error when the markers are missing.
- Figure spans: a measured figure in a sentence is written `<!--fig:name-->0.91<!--/fig-->`, anywhere
  in the file; `make bench` refills the text between the two comments from the benchmark's FIGURES
  (drills.bench.render_figures), and tests/test_explainer_figures.py fails when it disagrees with the
  committed JSON or when a measured figure stands outside a span.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from drills.lessons import ROOT, Lesson

_HEADING = re.compile(r"^(#{2,4})\s+(\d+(?:\.\d+)*)\.?\s+(.*?)\s*$")
_ITEM = re.compile(r"^(\d+)\.\s+(.*)$")
_BOLD = re.compile(r"\*\*(.+?)\*\*")


@dataclass(frozen=True)
class Section:
    number: str  # "3.2"
    title: str  # "Packing the group"
    body: str  # its own text, up to the next heading of any level

    @property
    def name(self) -> str:
        return f'section {self.number} "{self.title}"'


@dataclass(frozen=True)
class Pitfall:
    number: int
    title: str  # the bold lead, without its full stop; "" when the item has none
    text: str  # the whole item, lines joined

    @property
    def name(self) -> str:
        return f'pitfall {self.number} "{self.title}"' if self.title else f"pitfall {self.number}"


def parse_sections(text: str) -> list[Section]:
    """The numbered headings (`## 3.` to `#### 3.2.1`) of an explainer's text, each with its own body;
    headings inside fenced code blocks are not headings."""
    found, current, lines, fenced = [], None, [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else _HEADING.match(line)
        if heading:
            if current:
                found.append(Section(*current, "\n".join(lines)))
            current, lines = (heading.group(2), heading.group(3)), []
        elif current:
            lines.append(line)
    if current:
        found.append(Section(*current, "\n".join(lines)))
    return found


def _pitfalls_section(found: list[Section]) -> Section | None:
    return next((s for s in found if "pitfall" in s.title.lower()), None)


def parse_pitfalls(text: str) -> list[Pitfall]:
    """The numbered items of an explainer's pitfalls section (the first section whose title says
    "pitfall"), up to the line starting "Answers". An item is `K. **Title.** text`; an item without a
    bold title (e.g. "L2's pitfalls carry over") has title "". The one parser of the pitfall list: the
    learner tools and the mutants' coverage check (drills/mutants) both read it through here."""
    section = _pitfalls_section(parse_sections(text))
    if section is None:
        return []
    items: list[list] = []
    for line in section.body.splitlines():
        if line.startswith("Answers"):
            break
        item = _ITEM.match(line)
        if item:
            items.append([int(item.group(1)), [item.group(2)]])
        elif items and (line.startswith(" ") or not line.strip()):
            items[-1][1].append(line.strip())
    result = []
    for number, lines in items:
        text = " ".join(part for part in lines if part).strip()
        bold = _BOLD.match(text)
        result.append(Pitfall(number, bold.group(1).rstrip(".") if bold else "", text))
    return result


def sections(lesson: Lesson) -> list[Section]:
    return parse_sections(lesson.explainer.read_text())


def pitfalls_section(lesson: Lesson) -> Section | None:
    return _pitfalls_section(sections(lesson))


def pitfalls(lesson: Lesson) -> list[Pitfall]:
    """The numbered items of the lesson's pitfalls section, up to its answers (see parse_pitfalls)."""
    return parse_pitfalls(lesson.explainer.read_text())


def _mentions(text: str, test_name: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(test_name)}(?!\w)", text) is not None


def where_taught(lesson: Lesson, test_name: str) -> str:
    """Where to reread for a failed check: the pitfall (else the section) whose text names the test,
    else the pitfalls section as a whole."""
    path = lesson.explainer.relative_to(ROOT).as_posix()
    places = []
    pitfall_section = pitfalls_section(lesson)
    for pitfall in pitfalls(lesson):
        if _mentions(pitfall.text, test_name):
            places.append(f"{pitfall_section.name}, {pitfall.name}")
    for section in sections(lesson):
        named_by_a_pitfall = places and section == pitfall_section
        if not named_by_a_pitfall and _mentions(section.body, test_name):
            places.append(section.name)
    if places:
        return f"{path}, " + "; also ".join(places[:2])
    if pitfall_section:
        return f"{path}, {pitfall_section.name} (each pitfall names the check that catches it)"
    return path


def where_pitfall(lesson: Lesson, number: int) -> str | None:
    """ "<explainer>, section N "Pitfalls ...", pitfall K "Title"" for pitfall K, or None if it is not listed."""
    path = lesson.explainer.relative_to(ROOT).as_posix()
    section = pitfalls_section(lesson)
    for pitfall in pitfalls(lesson):
        if pitfall.number == number:
            return f"{path}, {section.name}, {pitfall.name}"
    return None
