"""Reading a lesson's explainer (drills/content/<stem>.md) for the learner tools: its numbered
sections, the pitfalls of its "Pitfalls and self-test" section, and which section teaches the mistake
a given check catches (the pitfalls say "Caught by `test_...`")."""
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


def sections(lesson: Lesson) -> list[Section]:
    found, current, lines, fenced = [], None, [], False
    for line in lesson.explainer.read_text().splitlines():
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


def pitfalls_section(lesson: Lesson) -> Section | None:
    return next((s for s in sections(lesson) if "pitfall" in s.title.lower()), None)


def pitfalls(lesson: Lesson) -> list[Pitfall]:
    """The numbered items of the pitfalls section, up to its answers."""
    section = pitfalls_section(lesson)
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
