"""From the set of failing and passing checks to the most likely mistake.

Each lesson's grader (drills/tests/test_<stem>.py) declares `MISTAKES`, a list of `Mistake`: the
explainer pitfall it stands for, and the pattern of results it leaves. A pattern has three kinds of
condition, all optional:

  fails     case patterns that must have a failing case: "test_scale_is_applied" (any of its cases),
            "test_kv_head_grouping_is_contiguous[group2]", or fnmatch wildcards ("test_*[bf16]")
  passes    case patterns whose every case that ran must pass: the look-alikes this mistake is not
  messages  regular expressions, each matching the message of some failing case ("NaN", "canary",
            "out of bounds store .*out")

A mistake whose every condition holds is consistent with the results; the most specific consistent
one (most conditions) is named first, and a second consistent one is named too. When none is fully
consistent, the one with the largest share of conditions holding is named as "most likely".

Rules that hold whatever the lesson, before the patterns are read:
  - NaN or inf in a result is the mark of a masked load without `other=` (the harness makes its
    masked-off lanes read NaN), of an exponential without its max shift, or of output never stored
    (NAN_TITLE). A mistake whose symptom is NaN says so in `messages` (r"NaN|nan"); one that does not,
    and none of whose look-alikes (`passes`) ran, is named after that reading when every failure it
    explains shows NaN or inf.
  - A case failing with the stub's NotImplementedError says which function is missing, not which
    pitfall: it is set aside, and when nothing else failed the finding is "stage N not written yet:
    function X" (N from the grader's STAGES).
  - A check that passes bad input on purpose (its name says reject, raise, catch or bad) and met the
    harness's not-from-kernel verdict failed because the learner's code let that input through and torch
    ran on it: a missing argument check. "Did not come from your kernel" is said only when no such
    honest failure explains the results.
  - A return that is not the spec's (returned_problem's "f returned X where Y belongs": a tuple for a
    tensor, (lse, out) swapped, None for lse, out in another dtype) is named as such, before any pitfall
    whose messages do not name it: it fails nearly every check whatever the kernel computed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from drills.grading.grader.report import case_matches, stage_of


@dataclass(frozen=True)
class Mistake:
    pitfall: int  # the number of the explainer's pitfall this mistake is (its "## N. Pitfalls" item)
    fails: tuple[str, ...] = ()
    passes: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()
    question: str = ""  # the first hint: a question that points at the mistake without giving the fix
    section: str = ""  # the explainer section of the worked example to quote in the third hint ("2", "3.4")

    def __post_init__(self):
        for name in ("fails", "passes", "messages"):
            value = getattr(self, name)
            if isinstance(value, str):  # a lone string is one pattern, not a tuple of characters
                object.__setattr__(self, name, (value,))


# --- Results as the engine sees them -------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One diagnosis: a pitfall of the lesson's explainer (pitfall > 0), or a failure of another kind
    that no lesson pitfall explains (pitfall == 0; `title` says what)."""

    pitfall: int
    title: str
    evidence: tuple[str, ...]  # one or two lines: which check, and how far off (or where it crashed)
    consistent: bool  # every condition of the mistake holds (else: the most likely one)
    mistake: Mistake | None = None
    kind: str = ""  # for pitfall == 0: "crash", "timeout", "out_of_bounds", "exception", ...


@dataclass
class _Score:
    mistake: Mistake
    held: int = 0
    total: int = 0
    witnesses: list = field(default_factory=list)  # failing cases this mistake explains


def score(mistake: Mistake, cases) -> _Score:
    """How many of the mistake's conditions the results meet. cases: report.Case-like objects."""
    s = _Score(mistake)
    failing = [c for c in cases if c.outcome == "failed"]
    for pattern in mistake.fails:
        s.total += 1
        hits = [c for c in failing if case_matches(c.id, pattern)]
        if hits:
            s.held += 1
            s.witnesses += [c for c in hits if c not in s.witnesses]
    for pattern in mistake.passes:
        ran = [c for c in cases if c.outcome in ("passed", "failed") and case_matches(c.id, pattern)]
        if not ran:
            continue  # skipped on this machine: says nothing either way
        s.total += 1
        if all(c.outcome == "passed" for c in ran):
            s.held += 1
    for regex in mistake.messages:
        s.total += 1
        hits = [c for c in failing if re.search(regex, c.message or "")]
        if hits:
            s.held += 1
            s.witnesses += [c for c in hits if c not in s.witnesses]
    return s


# A launch grid past CUDA's limits (launches.grid_problem's words).
GRID_PAST_LIMITS = r"past CUDA's limit on grid axis"

# The learner's code stopping a check instead of returning or raising an Exception (serve_calls.py's words).
STOPPED = r"your code called sys\.exit\(|which is not an Exception \(it stops whatever runs it"
STOPPED_TITLE = (
    "your code stopped the check (sys.exit, or a BaseException that is not an Exception): a launcher "
    "returns, or raises ValueError or TypeError naming the argument"
)

# A check the learner's code never came back from: the harness stopped it after its time limit, the
# process ended under it, or Python's recursion limit ended it (learner_client.py's and serve_calls.py's
# words).
# Python refusing the grader's call to a function of the learner's file, by the function's own
# parameters: the message is the TypeError itself, with no line of the learner's before it.
SIGNATURE = (
    r"^TypeError: [\w.]+\(\) (got an unexpected keyword argument|missing \d+ required|takes \d+ positional"
    r"|takes from \d+ to \d+ positional|got multiple values for argument)"
)
SIGNATURE_TITLE = (
    "a function of your file does not take the arguments its spec gives it (its signature changed)"
)
RECURSION = r"your code raised RecursionError"
RECURSION_TITLE = "your code calls itself without end (Python stopped it at its recursion limit)"
HALTED = r"did not return within|ended the process that runs it|" + RECURSION

# Failures that say what happened whatever the lesson: the harness's own messages (learner_client.py).
GENERIC = (
    ("crash", r"ended the process that runs it", "your code crashed the process that runs it"),
    ("timeout", r"did not return within", "your code did not finish (a loop that never ends?)"),
    (
        "not_from_kernel",
        r"did not come from your kernel|without launching a Triton kernel of your file",
        "the output did not come from your kernel",
    ),
    ("out_of_bounds", r"out of bounds (load|store|atomic)", "a load or store outside the tensors"),
    ("write_race", r"write race", "programs overwrite each other's output (a write race)"),
    (
        "grid_too_large",
        GRID_PAST_LIMITS,
        "a launch grid past CUDA's limits (a GPU refuses it at the largest sizes)",
    ),
    ("exception", r"your code raised|raised in your code|^\w*Error: ", "your code raised an exception"),
)


# The learner's own argument check raising on a case the grader passes as valid: the traceback's line
# is a `raise ValueError(` or `raise TypeError(` of the learner's file. Checks that pass bad input on
# purpose (their names say reject, raise, catch or bad) fail that way when the wrong error is raised.
OWN_RAISE = r"your code raised (ValueError|TypeError) at [^\n]*\(`raise (ValueError|TypeError)\b"
BAD_INPUT_CHECK = r"reject|raise|catch|bad_"
REFUSED_TITLE = "your own argument check refused input the spec admits"


def refused_valid(cases):
    """The first failing case whose failure is the learner's own ValueError/TypeError raised on input the
    grader meant as valid, or None."""
    for c in cases:
        if c.outcome != "failed" or re.search(BAD_INPUT_CHECK, c.id.split("[", 1)[0]):
            continue
        if re.search(OWN_RAISE, c.message or ""):
            return c
    return None


# NaN or inf in a result: compare.mismatch's words, and the graders' own "NaN in l at ..." lines.
NAN = r"NaN/inf values|\bNaN\b|\bnan\b"
NAN_TITLE = (
    "NaN or inf in the output: a masked tl.load without other= (its masked-off lanes read NaN here), an "
    "exponential without its max shift (exp overflows to inf), or output never stored (new tensors hold NaN here)"
)


def nan_cases(cases) -> list:
    return [c for c in cases if c.outcome == "failed" and re.search(NAN, c.message or "")]


def claims_nan(mistake: Mistake, cases) -> bool:
    """The mistake names NaN as its own symptom: one of its message patterns matches a NaN failure."""
    return any(re.search(rx, c.message or "") for rx in mistake.messages for c in nan_cases(cases))


# The stub's not-started raise, left in a function the learner has not written yet (drills/contract.py).
# A check that expects some exception sees the raise's own words only ("f2 is not started: fill in ...").
NOT_WRITTEN = r"\bNotImplementedError\b|\b[a-z]\d+ is not started: "
_RAISED_AT = re.compile(r"raised NotImplementedError at (?P<path>[^\s:()`]+\.py):(?P<line>\d+)")


# Where the harness quotes the line that raised: "raised NotImplementedError at path:line (`code`)".
_RAISED_CODE = re.compile(r"raised NotImplementedError at [^\s:()`]+\.py:\d+ \(`(?P<code>[^`]*)`\)")


def not_written(case) -> bool:
    message = case.message or ""
    if case.outcome != "failed" or re.search(NOT_WRITTEN, message) is None:
        return False
    # A NotImplementedError raised by torch inside a call of the learner's (a meta tensor's "Cannot copy
    # out of meta tensor", an op with no kernel for a dtype) is not the stub's raise: the quoted line
    # that raised is then a call, not a raise statement.
    quoted = _RAISED_CODE.search(message)
    return quoted is None or quoted["code"].lstrip().startswith("raise")


def unwritten_function(message: str) -> str | None:
    """The name of the function holding the raise the message points at ("plan"), or None."""
    import ast
    from pathlib import Path

    from drills.lessons import ROOT

    found = _RAISED_AT.search(message or "")
    if found is None:
        return None
    path, line = Path(found["path"]), int(found["line"])
    try:
        tree = ast.parse((path if path.is_absolute() else ROOT / path).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    best = None
    for node in ast.walk(tree):
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.lineno <= line <= node.end_lineno
        ):
            if best is None or node.lineno > best.lineno:  # the innermost
                best = node
    return best.name if best is not None else None


def _unwritten_finding(cases, stages) -> Finding:
    """ "stage N not written yet: function X" for the earliest stage whose cases hit a not-started raise."""
    hits = [c for c in cases if not_written(c)]
    if stages:
        first = min(hits, key=lambda c: stage_of(c.id, list(stages)))
        stage = f"stage {stage_of(first.id, list(stages)) + 1} not written yet"
    else:
        first, stage = hits[0], "not written yet"
    # The function is named by a case whose message says where it raised (one that expected an
    # exception quotes the raise's words only).
    same_stage = [
        c for c in hits if not stages or stage_of(c.id, list(stages)) == stage_of(first.id, list(stages))
    ]
    located = [c for c in same_stage if _RAISED_AT.search(c.message or "")] or [
        c for c in hits if _RAISED_AT.search(c.message or "")
    ]
    first = located[0] if located else first
    name = unwritten_function(first.message)
    what = f"function {name}" if name else "a function still raises the stub's NotImplementedError"
    evidence = (f"{first.id} failed", *_evidence(first)[1:])
    return Finding(0, f"{stage}: {what}", evidence, True, None, "not_written")


NOT_REFUSED_TITLE = "your code accepted input it must refuse, and went on to compute with it"
UNNAMED_REFUSAL_TITLE = "your code refused bad input, but its message does not name what is wrong"

# A file that tells a grading from a plain run by what fresh memory or a masked-off lane holds (NaN only
# while graded): its result changes with that memory (provenance.poison_disagrees). When that is every
# failure, the file passes the value checks one way and is used another: that is the finding.
FRESH_MEMORY = r"depends on what fresh memory holds"
FRESH_TITLE = (
    "your code takes another path while graded than in a plain run: its result changes with what fresh "
    "memory and the masked-off lanes of loads without other= hold"
)


# What a function returned, against what its spec says it returns (returned_problem's words): a tuple
# where one tensor belongs, (lse, out) for (out, lse), None for lse, out in fp32 where q's dtype belongs.
RETURNED = r"returned .+ where .+ belongs"
RETURNED_TITLE = (
    "your function returned something other than what its spec says (another type, order, shape or "
    "dtype): the kernel may be right, the return statement or out's allocation is not"
)


def _described(value) -> str:
    if value is None:
        return "None"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def returned_problem(fn: str, returned, expected) -> str | None:
    """None when `returned` is what `fn`'s spec returns, else one line naming the difference.

    expected: ((name, shape, dtype), ...): one entry for a lone tensor, several for a tuple in that order;
    shape or dtype None when any is right. The line says "fn returned X where Y belongs" (RETURNED), which
    the diagnosis reads as certain: a wrong return hides whatever the kernel computed."""
    names = [name for name, _, _ in expected]

    def fits(value, shape, dtype):
        return (
            hasattr(value, "shape")
            and hasattr(value, "dtype")
            and (shape is None or tuple(value.shape) == tuple(shape))
            and (dtype is None or value.dtype == dtype)
        )

    if len(expected) == 1:
        if isinstance(returned, (tuple, list)):
            inner = ", ".join(_described(v) for v in returned)
            return (
                f"{fn} returned a {type(returned).__name__} ({inner}) where one tensor, {names[0]}, belongs"
            )
        parts = [returned]
    else:
        want = "(" + ", ".join(names) + ")"
        if not isinstance(returned, (tuple, list)) or len(returned) != len(expected):
            return f"{fn} returned {_described(returned)} where the tuple {want} belongs"
        parts = list(returned)
        swapped = [
            names[j]
            for i, value in enumerate(parts)
            for j, (_, shape, dtype) in enumerate(expected)
            if j != i and fits(value, shape, dtype) and not fits(value, *expected[i][1:])
        ]
        if len(swapped) == len(parts):
            return f"{fn} returned ({', '.join(swapped)}) where {want} belongs: the order is {want}"
    for value, (name, shape, dtype) in zip(parts, expected):
        if not (hasattr(value, "shape") and hasattr(value, "dtype")):
            return f"{fn} returned {_described(value)} as {name} where a tensor belongs"
        if shape is not None and tuple(value.shape) != tuple(shape):
            return f"{fn} returned {name} of shape {tuple(value.shape)} where shape {tuple(shape)} belongs"
        if dtype is not None and value.dtype != dtype:
            got, want_dtype = (str(d).replace("torch.", "") for d in (value.dtype, dtype))
            why = " (out has its inputs' dtype)" if name == "out" else ""
            return f"{fn} returned {name} as {got} where {want_dtype} belongs{why}"
    return None


def _address(t) -> tuple:
    """Where t's elements start. An empty tensor's data_ptr is 0 whatever memory it views (so a new empty
    tensor would pass for the given one): its storage's address and its offset there say it instead."""
    return (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() == 0 else (t.data_ptr(),)


def returned_out_problem(fn: str, returned, out) -> str | None:
    """None when `returned` is the very `out` tensor fn was given, else one line in RETURNED's words: a
    launcher that returns None, a new tensor or a copy leaves out as the grader filled it, whatever its
    kernel computed."""
    tensor = hasattr(returned, "data_ptr") and hasattr(returned, "shape")
    if tensor and _address(returned) == _address(out) and tuple(returned.shape) == tuple(out.shape):
        return None
    what = _described(returned) + (" at other memory than out's" if tensor else "")
    return (
        f"{fn} returned {what} where the `out` it was given belongs, so the output did not come from your "
        "kernel's store into out: write into out and return it"
    )


def _bad_input_check(case) -> bool:
    """The case is one of a grader's bad-input checks (by its check's name)."""
    return re.search(BAD_INPUT_CHECK, case.id.split("[", 1)[0]) is not None


def _not_refused(case) -> bool:
    """A bad-input check met the not-from-kernel verdict: torch computed on the bad input the learner's
    launcher let through (a float context_lens summed, maxed...), where a ValueError/TypeError belonged."""
    return _bad_input_check(case) and (generic_kind(case.message) or ("",))[0] == "not_from_kernel"


DTYPE_TITLE = (
    "a dtype written into the code: only some dtypes' cases fail (tl.float16 where the tensors' own dtype "
    "belongs?)"
)


DTYPES = ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32")


def _dtype_of(case_id: str) -> str | None:
    """The dtype a parametrized case names in its brackets ("test_dtypes[bf16-causal]" -> "bf16")."""
    if "[" not in case_id:
        return None
    params = re.split(r"[-_,\]]", case_id.split("[", 1)[1])
    return next((p for p in params if p in DTYPES), None)


def only_one_dtype_fails(cases) -> bool:
    """Every failing case names a dtype, and a case of a dtype none of them names passed: the kernel is
    right for one dtype (fp16, or fp16 and fp32) and wrong for the others, the mark of a cast written as
    tl.float16 (or torch.float16) instead of the tensor's own dtype (v.dtype, out_ptr.dtype.element_ty)."""
    failing = [c for c in cases if c.outcome == "failed"]
    failed_dtypes = {_dtype_of(c.id) for c in failing}
    if not failing or None in failed_dtypes:
        return False
    return any(c.outcome == "passed" and _dtype_of(c.id) not in (None, *failed_dtypes) for c in cases)


def generic_kind(message: str) -> tuple[str, str] | None:
    for kind, regex, title in GENERIC:
        if re.search(regex, message or "", re.M):
            return kind, title
    return None


def diagnose(
    cases, mistakes, titles: dict[int, str] | None = None, limit: int = 2, stages=()
) -> list[Finding]:
    """The most likely mistakes, best first (at most `limit`); [] when nothing failed.

    titles: pitfall number -> its title in the explainer (for the Finding's title); stages: the grader's
    STAGES (drills/grading/grader/report.py), to say which stage a function not written yet belongs to."""
    titles = titles or {}
    failing = [c for c in cases if c.outcome == "failed"]
    if not failing:
        return []
    if any(not_written(c) for c in failing):
        # A stub's raise says which function is missing, not which pitfall: those cases are set aside
        # (as if skipped here) and the rest are diagnosed; when nothing else failed, that is the finding.
        from dataclasses import replace

        written = [replace(c, outcome="skipped") if not_written(c) else c for c in cases]
        if not any(c.outcome == "failed" for c in written):
            return [_unwritten_finding(cases, stages)]
        return diagnose(written, mistakes, titles, limit, stages) or [_unwritten_finding(cases, stages)]
    scored = [score(m, cases) for m in mistakes]
    scored = [s for s in scored if s.total > 0]
    consistent = [s for s in scored if s.held == s.total]
    # The most specific consistent mistake first; ties go to the one explaining more failures, then
    # to the order of the lesson's list.
    consistent.sort(key=lambda s: (-s.total, -len(s.witnesses), mistakes.index(s.mistake)))
    # The learner's code stopped a check (sys.exit, a BaseException that is not an Exception): certain,
    # and no pitfall's, whichever checks it stopped.
    stopped = [c for c in failing if re.search(STOPPED, c.message or "")]
    if stopped:
        return [Finding(0, STOPPED_TITLE, _evidence(stopped[0]), True, None, "stopped")]
    # The learner's code never came back in most failing checks (an endless loop, a recursion without
    # end, the process crashed): no result was compared, so which checks fail says nothing about a
    # pitfall, unless the pitfall's own messages name that stop. An endless loop in the launcher fails
    # the by-hand grid check too, which is not the grid's mistake.
    # The grader's call did not fit the function's parameters (a parameter of the spec renamed or
    # dropped): Python refused the call before any line of the learner's ran, in most failing checks.
    unfit = [c for c in failing if re.search(SIGNATURE, c.message or "", re.M)]
    if 2 * len(unfit) >= len(failing) and not any(
        re.search(rx, c.message or "") for s in consistent for rx in s.mistake.messages for c in unfit
    ):
        return [Finding(0, SIGNATURE_TITLE, _evidence(unfit[0]), True, None, "signature")]
    halted = [c for c in failing if re.search(HALTED, c.message or "")]
    if 2 * len(halted) >= len(failing) and not any(
        re.search(rx, c.message or "") for s in consistent for rx in s.mistake.messages for c in halted
    ):
        if re.search(RECURSION, halted[0].message or ""):
            kind, title = "recursion", RECURSION_TITLE
        else:
            kind, title = generic_kind(halted[0].message)
        return [Finding(0, title, _evidence(halted[0]), True, None, kind)]
    # Only the fresh-memory verdict failed: the file told the grading apart (FRESH_MEMORY).
    if all(re.search(FRESH_MEMORY, c.message or "") for c in failing):
        return [Finding(0, FRESH_TITLE, _evidence(failing[0]), True, None, "nan")]
    # A launch grid past CUDA's limits is certain (the harness checks every grid before its launch): the
    # mistake whose messages name it comes first, however many other checks the same code fails.
    grid = [c for c in failing if re.search(GRID_PAST_LIMITS, c.message or "")]
    if grid:
        consistent.sort(
            key=lambda s: not any(re.search(rx, c.message) for rx in s.mistake.messages for c in grid)
        )
    # A return that is not the spec's (a tuple where one tensor belongs, (lse, out) swapped, None for lse,
    # out in fp32) fails nearly every check whatever the kernel computed: that is the finding, unless a
    # consistent pitfall names it in its messages.
    returned = [c for c in failing if re.search(RETURNED, c.message or "")]
    if returned and not any(
        any(re.search(rx, returned[0].message or "") for rx in s.mistake.messages) for s in consistent
    ):
        return [Finding(0, RETURNED_TITLE, _evidence(returned[0]), True, None, "returned")]
    # A pitfall that leaves finite values does not explain NaN or inf: when every failure the best
    # consistent one explains shows NaN or inf, it does not claim them, and no look-alike of it passed
    # (its `passes`: a NaN they do not show is the pitfall's own), the NaN's reading comes first.
    nan = nan_cases(cases)
    if nan and not only_one_dtype_fails(cases) and not any(claims_nan(s.mistake, cases) for s in consistent):
        best = consistent[0] if consistent else None
        top = (
            [best]
            if best is not None
            and all(c in nan for c in best.witnesses)
            and best.total == len(best.mistake.fails) + len(best.mistake.messages)  # no look-alike ran
            else []
        )
        # With no pitfall consistent, a failure the harness names (out of bounds, a crash, a timeout)
        # that comes first is more certain than the NaN it may leave behind: it is reported below.
        if top or (not consistent and generic_kind(failing[0].message) is None):
            found = [Finding(0, NAN_TITLE, _evidence(nan[0]), True, None, "nan")]
            rest = top or [s for s in scored if s.held > 0 and s.witnesses]
            rest.sort(key=lambda s: (-s.held / s.total, -s.held, mistakes.index(s.mistake)))
            found += [_finding(s, s.held == s.total, titles) for s in rest[:1]]
            return found[:limit]
    # torch (or Python, on values read to the host, or a Python function handed to a kernel) computing
    # beside the kernel: never a kernel's bug, unless the grader itself passed that input as bad and the
    # learner's code let it through.
    refused = [
        c
        for c in failing
        if re.search(
            # (an answer kept from one call to the next, run_call._refuse_kept_tensors: as certain)
            r"torch computed floats|runs as Python inside the launch|kernel was given no tensor|"
            r"lasts from one call to the next",
            c.message or "",
        )
        and not _not_refused(c)
    ]
    if refused and not any(
        any(re.search(rx, refused[0].message or "") for rx in s.mistake.messages) for s in consistent
    ):
        # The grader saw floats computed outside the kernel: that verdict is certain, and the checks that
        # fail with it say nothing about which pitfall the kernel has (it may have none).
        _, title = generic_kind(refused[0].message)
        return [Finding(0, title, _evidence(refused[0]), True, None, "not_from_kernel")]
    findings, named = [], set()
    for s in consistent:
        if s.mistake.pitfall in named:
            continue
        named.add(s.mistake.pitfall)
        findings.append(_finding(s, True, titles))
    if findings:
        return findings[:limit]
    if only_one_dtype_fails(cases):  # whatever each failure says, the dtype is what they share
        return [Finding(0, DTYPE_TITLE, _evidence(failing[0]), True, None, "dtype")]
    # Nothing fully consistent. A failure the harness names (crash, timeout, out of bounds...) is
    # reported as what it is; otherwise the mistake with the largest share of its conditions holding.
    own = refused_valid(cases)
    if own is not None:
        # No pitfall fits, and the learner's own check raised on a case the grader means as valid: that
        # is the finding, not "your code raised an exception" (a pitfall that fits is named first above:
        # a check of the learner's that catches its own planner's mistake raises too).
        return [Finding(0, REFUSED_TITLE, _evidence(own), True, None, "refused_valid")]
    first = failing[0]
    generic = generic_kind(first.message)
    unrefused = [c for c in failing if _not_refused(c)]
    if not unrefused and all(_bad_input_check(c) for c in failing):
        # Only bad-input checks fail, and none because torch computed: the launcher ran on input it must
        # refuse (nothing raised, a kernel launched), or refused it without naming the argument. Its
        # own mistake whatever the check's code came from (a stub's given check the learner edited, too).
        unrefused = failing
    honest = [
        c
        for c in failing
        if (generic_kind(c.message) or ("",))[0] == "not_from_kernel" and c not in unrefused
    ]
    if unrefused and not honest:
        # The only not-from-kernel verdicts are on bad input the learner's code let through.
        head, *why = _evidence(unrefused[0])
        why = [
            re.sub(r"^the output did not come from your kernel: ", "instead of refusing it, ", w) for w in why
        ]
        unnamed = re.search(r"Regex pattern did not match", unrefused[0].message or "") is not None
        title = UNNAMED_REFUSAL_TITLE if unnamed else NOT_REFUSED_TITLE
        findings.append(Finding(0, title, (head, *why), True, None, "not_refused"))
        if first in unrefused:
            generic = None
    partial = [s for s in scored if s.held > 0 and s.witnesses]
    partial.sort(key=lambda s: (-s.held / s.total, -s.held, mistakes.index(s.mistake)))
    if generic is not None and generic[0] == "write_race":
        # A write race is what the harness saw, not the mistake: a pitfall whose own messages name the
        # race (an lse stored over out when no one asked for it, rows stored past a group) comes first,
        # with the race's message as its evidence; the race itself stays on the screen after it.
        racing = [
            s
            for s in partial
            if any(re.search(rx, first.message or "") for rx in s.mistake.messages)
            and s.mistake.pitfall not in named
        ]
        if racing:
            best = racing[0]
            named.add(best.mistake.pitfall)
            findings.append(_finding(best, False, titles))
    if generic is not None:
        kind, title = generic
        findings.append(Finding(0, title, _evidence(first), False, None, kind))
        stopped = sum(1 for c in failing if (generic_kind(c.message) or ("",))[0] == kind)
        if kind in ("timeout", "crash", "exception") and 2 * stopped >= len(failing):
            # Most checks stopped the same way before any result could be compared: which of them
            # fail says nothing about a pitfall, and a guess would send the learner to the wrong section.
            return findings[:limit]
    for s in partial:
        if s.mistake.pitfall not in named:
            named.add(s.mistake.pitfall)
            findings.append(_finding(s, False, titles))
    if not findings:
        findings.append(Finding(0, "", _evidence(first), False, None, "unexplained"))
    return findings[:limit]


def _finding(s: _Score, consistent: bool, titles: dict[int, str]) -> Finding:
    witness = s.witnesses[0] if s.witnesses else None
    evidence = _evidence(witness) if witness is not None else ()
    return Finding(s.mistake.pitfall, titles.get(s.mistake.pitfall, ""), evidence, consistent, s.mistake)


def _evidence(case) -> tuple[str, ...]:
    lines = [line.strip() for line in (case.message or "").splitlines() if line.strip()]
    head = f"{case.id} failed"
    return (head,) + tuple(lines[:2])
