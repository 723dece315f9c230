"""Grading a learner's file: run its checks out of the learner code's reach, decide from the whole
pattern of results which mistake is most likely, and print one screen. One job per module:

  run.py          host side: the pytest command, the result read back, what "missing" or "partial" means
  env.py          the learner process's environment and time limits (a leaf)
  process.py      sessions and subreapers: every descendant of the learner's file ended before the result
  channel.py      the report over a pipe the learner's process cannot rewrite
  wire.py         the messages between the grader and the learner's process
  remote.py       the grader's client of the learner's process; proxy.py the objects lent across
  errors.py       one table of failure kinds, used by both sides
  sandbox.py      what the learner's process may open (Landlock where the kernel has it, an audit hook)
  source_check.py code that asks where it runs, refused before grading
  server.py       the learner's process: its file imported, the grader's calls served
  instrument.py   Triton instrumented there (bounds, NaN reads, program order, launches)
  bf16.py         the exact bf16 dot, elementwise ops and reductions the interpreter lacks
  calls.py        one call run there, with the evidence provenance.py judges in the grader's process
  plugin.py       the pytest plugin: --impl, the report, the one-screen summary
  diagnose.py, report.py   the likely mistake, and the screen
  launches.py, bigmem.py, streams.py, warm.py   launch records, sparse big tensors, SEED numbering,
                  warm forked processes for make mutants

Data flows one way: the CLI and the learner tools -> run -> pytest with the plugin (the learner's code
in its own process) -> the report over the channel -> diagnose -> report -> one screen. This package
imports nothing from drills.tests; it only reads each lesson grader's MISTAKES and STAGES by name.
"""

# The report's names, where the rest of the course has always found them (drills.grading.Case, ...).
from drills.grading.report import (  # noqa: E402,F401
    CASES,
    FINDINGS,
    IMPORT_ERROR,
    NOT_STARTED,
    Case,
    check_name,
    clip,
    failure_message,
    finding_dict,
    random_cases_line,
    relative,
    render,
    skip_reason,
)
