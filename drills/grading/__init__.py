"""Grading a learner's file: run its checks out of the learner code's reach (run.py, worker.py,
remote.py), decide from the whole pattern of results which mistake is most likely (diagnose.py), and
print one screen (report.py).

Data flows one way: the CLI and the learner tools -> run (pytest in this process, the learner's code
in a child process) -> the report file -> diagnose -> report -> one screen.
"""

# The report's names, where the rest of the course has always found them (drills.grading.Case, ...).
from drills.grading.report import (  # noqa: E402,F401
    CASES,
    FINDINGS,
    IMPORT_ERROR,
    NOT_STARTED,
    REPORT_EXIT,
    REPORT_LESSONS,
    REPORT_SHIFT,
    Case,
    Summary,
    check_lines,
    check_name,
    clip,
    failure_lines,
    failure_message,
    finding_dict,
    finding_lines,
    random_cases_line,
    read_report,
    relative,
    render,
    skip_reason,
    summarize,
    write_report,
)
