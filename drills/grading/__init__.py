"""Grading a learner's file: run its checks out of the learner code's reach, decide from the whole
pattern of results which mistake is most likely, and print one screen. The folders say which side of
the process boundary a module runs on; one job per module.

grader/   make test's own processes: the command that starts pytest, and pytest with the graders
  pytest_run.py      the pytest command, the result read back, what "missing" or "partial" means
  plugin.py          the pytest plugin: --impl, the report, the one-screen summary
  source_check.py    code that asks where it runs, refused before grading
  learner_client.py  starts the learner's process, calls into it, survives it
  remote_objects.py  the learner's objects as the graders hold them (a function, a kernel, an instance)
  provenance.py      whether a result came from the learner's kernel, judged from the evidence sent back
  left_files.py      what a grading left in the learner's folder, moved out after it
  process_tree.py    sessions and subreapers: every descendant of the learner's file ended before the result
  report_channel.py  the report over a pipe the learner's process cannot rewrite
  diagnose.py, report.py   the likely mistake, and the screen
  selection.py       which checks can see a mutant (make mutants' coverage)
  fork_server.py     make mutants on the CPU: one warm process forks each grading's two processes
learner/  the learner's process: its file imported, the grader's calls served, nothing of the grader's
  serve_calls.py     the process's main: the sandbox, the instrumentation, the file, the call loop
  run_call.py        one call run there, with the evidence provenance.py judges in the grader's process
  write_races.py     whether a launch's programs touched each other's memory (the reverse run's trigger)
  instrument.py      Triton instrumented there (bounds, NaN reads, program order, launches)
  bf16.py            the exact bf16 dot, elementwise ops and reductions the interpreter lacks
  sandbox.py         what the process may open (Landlock where the kernel has it, an audit hook)
shared/   imported on both sides
  wire.py            the messages between the two processes
  errors.py          one table of failure kinds, raised on one side and again on the other
  env.py             the learner process's environment and time limits (a leaf)
  tensor_states.py   one definition of "two states of a call's tensors differ"
  launches.py        launch records, and the graders' checks built on them
  bigmem.py          sparse big tensors for the int64 checks, lent across by their file
  seed_streams.py    the random cases' stream numbers and the SEED shift

Data flows one way: the CLI and the learner tools -> grader/pytest_run -> pytest with the plugin (the
learner's code in its own process, learner/) -> the report over the channel -> diagnose -> report -> one
screen. learner/ imports nothing from grader/, and shared/ neither. This package imports nothing from
drills.tests; it only reads each lesson grader's MISTAKES and STAGES by name. Nothing is imported
here: the learner's process imports learner/ and shared/ alone.
"""
