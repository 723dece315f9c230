"""Grader plumbing: `--impl=mine|solutions` picks the module under test, the banner says which runtime
runs it, and a lesson whose stub is untouched is reported as "not started" in one line."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import drills.runtime
from drills import contract
from drills.lessons import by_stem


def pytest_addoption(parser):
    parser.addoption("--impl", choices=("mine", "solutions"), default="mine",
                     help="grade the learner's drills/mine (default) or the reference drills/solutions")
    parser.addoption("--impl-file", default=None,
                     help="grade this file instead (how `make mutants` grades a mutated copy of a solution)")


LOADED = pytest.StashKey[dict]()


def _load(config, stem: str):
    path = config.getoption("--impl-file")
    if not path:
        return importlib.import_module(by_stem(stem).module(config.getoption("--impl")))
    loaded = config.stash.setdefault(LOADED, {})  # load a file once per run, not once per test module
    if stem not in loaded:
        loaded[stem] = contract.load_from_file(Path(path), f"drills._graded_{stem}")
    return loaded[stem]


def pytest_report_header(config):
    return [drills.runtime.current().banner, f"grading: drills/{config.getoption('--impl')}"]


def _stem(path) -> str:
    return Path(str(path)).stem.removeprefix("test_")


def pytest_collection_modifyitems(session, config, items):
    """Stop before running anything when a lesson's stub has not been started: one line, not a wall of
    NotImplementedError tracebacks."""
    lines = []
    for stem in sorted({_stem(item.path) for item in items}):
        module = _load(config, stem)
        message = contract.not_started_message(module)
        if message is not None:
            lines.append(message)
    if lines:
        config.stash[NOT_STARTED] = lines
        items.clear()


NOT_STARTED = pytest.StashKey[list]()


def pytest_sessionfinish(session, exitstatus):
    if session.config.stash.get(NOT_STARTED, None):
        session.exitstatus = 10  # non-zero, and unlike pytest's own codes: an untouched lesson does not pass


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in config.stash.get(NOT_STARTED, []):
        terminalreporter.write_line(line, yellow=True, bold=True)


@pytest.fixture(scope="module")
def impl(request):
    """The lesson module under test (drills.mine.<stem> or drills.solutions.<stem>)."""
    return _load(request.config, _stem(request.path))


@pytest.fixture(scope="session")
def runtime():
    return drills.runtime.current()
