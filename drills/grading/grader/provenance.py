"""Comparing states of tensors, and the provenance decisions, made in the grader's process.

Under the interpreter the learner's process runs each call that launches a kernel again with its
programs in reverse order and compares the two states itself (`compare_states`; a write race is the
learner's own bug, nothing to gain by hiding it). Whether the result came from the learner's kernel is
decided here, in the grader's process, from the evidence the learner's process sends with the result
(run_call.run_call): patching the functions of the learner's process cannot change the verdict.

  written   per returned tensor, what the last launch that was given its storage left there (None:
            no launch was given it); the tensor returned must equal it
  torch     the torch ops that computed floats from floats during the call, outside any launch (an add,
            a matmul): a launcher allocates, views, copies and converts; it never computes the answer
  unread    the floating-point inputs (arguments the call left unchanged) that no load of any launch
            read from under the interpreter, or that no launch was given in compiled Triton (which hides
            its loads): an answer made elsewhere and copied in reads none of them
  disabled  the call once more with every launch a no-op: the returned tensors and the arguments'
            states; if they equal those of the real call, the result was computed some other way; and
            every argument must come out of it byte for byte as it was before the call (a row copied
            into a cache by torch is computing outside the kernel, however it is written)
  finite    the call once more with fresh memory (and a masked-off lane of a load without other=)
            holding a finite pattern instead of NaN: its results
            must agree with the real call's wherever those are not NaN (a file that tells a grading by
            its memory takes another path there)
"""

from __future__ import annotations

from drills.grading.shared.errors import NotFromKernel
from drills.grading.shared.tensor_states import compare_states, differs


def poison_disagrees(before: list, after: list, names: list, results_a: list, results_b: list) -> str | None:
    """Where the run on finite fresh memory (after, results_b) differs from the run on NaN (before,
    results_a), ignoring elements the NaN run left NaN (output never written shows as NaN there, and is
    the value checks' to report). None: they agree."""
    import torch

    def where(a, b) -> int:
        if a.shape != b.shape or a.dtype != b.dtype:
            return max(1, a.numel())
        if not a.is_floating_point():
            return int((a != b).sum())
        a, b = a.float(), b.float()
        close = torch.isclose(a, b, rtol=1e-3, atol=1e-3, equal_nan=True)
        return int((~close & ~torch.isnan(a)).sum())

    for name, x, y in zip(names, before, after):
        n = where(x, y)
        if n:
            return f"argument `{name}`: {n} elements differ"
    if len(results_a) != len(results_b):
        return f"the call returned {len(results_b)} tensors instead of {len(results_a)}"
    for i, (x, y) in enumerate(zip(results_a, results_b)):
        n = where(x, y)
        if n:
            return f"the returned tensor #{i}: {n} elements differ"
    return None


def changed_without_launches(before: list, after: list, names: list) -> str | None:
    """The first argument whose bytes the launch-disabled run changed (before: the arguments' states
    before the call; after: after that run), as "`name` (N bytes)"; None when each is byte-identical."""
    import torch

    for name, x, y in zip(names, before, after):
        a, b = x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)
        if a.shape != b.shape:
            return f"`{name}` (its size)"
        n = int((a != b).sum())
        if n:
            return f"`{name}` ({n} bytes)"
    return None


def judge(result_tensors: list, evidence: dict | None) -> None:
    """Raise NotFromKernel unless the evidence shows the result came from a launch of the learner's
    kernel. result_tensors: the tensors of the call's result as the grader received them."""
    if not evidence:
        return
    computed = evidence.get("torch") or []
    if evidence.get("light") and not computed:
        return  # a call that did not ask for provenance: only torch's float ops beside the kernels count
    if not evidence.get("launched") and not evidence.get("light"):
        return  # no launch: the lesson's own checks (assert_runs_a_triton_kernel) say so
    if computed:
        raise NotFromKernel(
            "the output did not come from your kernel: torch computed floats during the call ("
            + ", ".join(f"torch's {name}" for name in computed[:4])
            + "); the launcher may allocate, view, copy and convert tensors, and the kernel computes"
        )
    unread = evidence.get("unread") or []
    if unread:
        raise NotFromKernel(
            "the output did not come from your kernel: no kernel of yours read "
            + ", ".join(f"`{name}`" for name in unread)
            + " (an answer computed elsewhere and copied in?); the kernel must load its inputs and compute"
        )
    written = evidence.get("written")
    if written is not None:
        if len(written) != len(result_tensors):
            raise NotFromKernel(
                "the output did not come from your kernel: the call's result changed on its way"
            )
        for tensor, stored in zip(result_tensors, written):
            if stored is None or differs(stored, tensor):
                how = (
                    "no kernel of yours was given it"
                    if stored is None
                    else "it changed after your last kernel wrote it"
                )
                raise NotFromKernel(
                    f"the output did not come from your kernel: a tensor the call returned ({tuple(tensor.shape)}, "
                    f"{tensor.dtype}) does not hold what a launch stored ({how}); compute the result in your "
                    "@triton.jit kernel and return the tensor it stores into"
                )
    disabled = evidence.get("disabled")
    finite = evidence.get("finite")
    if finite is not None and disabled is not None:
        where = poison_disagrees(
            disabled["after"], finite["states"], disabled["names"], disabled["results"], finite["got"]
        )
        if where is None and finite.get("raised"):
            where = "the call raised with the finite pattern"
        if where is not None:
            raise NotFromKernel(
                "the output depends on what fresh memory holds: the call gave other results with "
                "torch.empty's memory and the masked-off lanes of loads without other= filled with a finite "
                f"pattern than with NaN ({where}), where the NaN run wrote numbers; read only what your "
                "kernel wrote, and compute the same way every run"
            )
    if disabled is not None and disabled.get("before") is not None:
        where = changed_without_launches(disabled["before"], disabled["states"], disabled["names"])
        if where is not None:
            raise NotFromKernel(
                "the output did not come from your kernel: with every Triton launch turned into a no-op the "
                f"call still wrote into argument {where}, so torch wrote it (a copy_, an index_put_, an "
                "assignment); every value the call leaves in its arguments must be stored by your kernel"
            )
    if disabled is not None:
        same = compare_states(
            disabled["after"], disabled["states"], disabled["names"], disabled["results"], disabled["got"]
        )
        if same is None and not disabled.get("raised"):
            raise NotFromKernel(
                "the output did not come from your kernel: with every Triton launch turned into a no-op the "
                "call returned the same result, so it was computed some other way (torch, or a copy), or your "
                "kernel writes nothing (no tl.store into the output?)"
            )
