"""The graders, one file per lesson (test_<stem>.py), and the helpers they share.

Every random case is drawn from its test's own fixed stream number passed through `seeded`, so a default
run always grades the same cases, and `SEED=7 make test L=l2` grades other ones (the summary prints SEED).
"""

from __future__ import annotations

import contextlib
import re

from drills.grading.shared.seed_streams import SEED_ENV, base_seed, seeded  # noqa: F401  (the graders' names)


def probe(impl, fn, *args, **kwargs):
    """fn(module, *args, **kwargs), run where the learner's code runs: in its process when the grader
    isolates it (drills/grading/grader/learner_client.py), else here. fn must be a module-level function of a
    drills.tests module returning plain data (lists, numbers, strings) that the test then judges.
    Use it for checks that make thousands of calls (random streams) or that need the learner's objects
    themselves (mutating a list a method returned)."""
    runner = getattr(impl, "_drills_probe", None)
    return runner(fn, *args, **kwargs) if runner is not None else fn(impl, *args, **kwargs)


@contextlib.contextmanager
def raises_naming(error, pattern):
    """pytest.raises(error, match=pattern), matched against the error's own message only (str(error)):
    pytest's `match` also searches an exception's notes, and the words of a learner's line of code must
    never be what satisfies a check that the message names the argument."""
    import pytest

    with pytest.raises(error) as info:
        yield info
    message = str(info.value)
    assert re.search(pattern, message), (
        f"{error.__name__} raised, but its message {message!r} does not say {pattern!r}"
    )


def sizes(runtime, cpu, gpu):
    """cpu under the Triton interpreter (kernels run as Python there: small shapes), gpu on a GPU.
    The one size picker of the graders: `n = sizes(runtime, 70, 32768)`."""
    return cpu if runtime.interpreter else gpu


def bf16_everywhere():
    """torch.bfloat16 as one value of a dtype parametrization, run on every machine: under Triton's
    interpreter the learner's process computes a bf16 tl.dot exactly (drills/grading/learner/instrument.py,
    exact_bf16_dot), as a GPU's tensor cores do. `@pytest.mark.parametrize("dtype", [torch.float16,
    bf16_everywhere()], ids=["fp16", "bf16"])`."""
    import pytest
    import torch

    return pytest.param(torch.bfloat16)


def _past_fp16_scale(dtype) -> float:
    """m for the two helpers below: 2^16 for bf16 (values past fp16's largest, 65504), 2^13 for fp16 (the
    same values inside its range)."""
    import torch

    return 2.0**16 if dtype == torch.bfloat16 else 2.0**13


def fill_past_fp16_range(v) -> None:
    """Every element of v becomes m x (1 + |v|), in place (NaN stays NaN), so every attention output over
    it lies there too. m = 2^16 for bf16: outputs past fp16's largest 65504, which a store or a P V cast
    to tl.float16 turns into inf (T5, L4, F1's dtype pitfalls); m = 2^13 for fp16: the same values
    inside fp16's range, which such a cast keeps."""
    m = _past_fp16_scale(v.dtype)
    v.copy_(((v.float().abs() + 1) * m).to(v.dtype))


def keys_past_fp16_range(k, q) -> None:
    """In place: every K element becomes m x (1 + |k|) with its sign, and q shrinks by 1 / m (m as
    fill_past_fp16_range; NaN stays NaN), so the scores stay of order 1 while bf16 keys lie past fp16's
    largest value: a score dot whose operands are cast to tl.float16 turns them into inf (T5, F1 and F2's
    dtype pitfalls). The fp16 case is the same check inside fp16's range."""
    import torch

    m = _past_fp16_scale(k.dtype)
    kf = k.float()
    k.copy_((torch.sign(kf) * (kf.abs() + 1) * m).to(k.dtype))
    q.copy_((q.float() / m).to(q.dtype))


def empty_at_an_address(shape, dtype, device):
    """An empty tensor of `shape` viewing a small allocated buffer. An empty tensor's data_ptr is 0
    whatever it views, so returned_out_problem tells an empty `out` from a new empty tensor by its
    storage's address, which is 0 for torch.empty(shape) too: give empty `out`s from here, so that a
    launcher returning a new empty tensor where the given `out` belongs is told apart."""
    import torch

    buffer = torch.zeros(16, dtype=dtype, device=device)  # 16 spare elements, never read or written
    return buffer[8:8].view(shape)  # no elements, its storage 8 elements into the buffer
