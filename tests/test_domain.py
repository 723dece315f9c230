"""drills/tests/domain.py: the pairwise draw covers every admissible pair, keeps the rules, and is
deterministic for a stream and SEED (other cases under another SEED)."""

from __future__ import annotations

import itertools

import pytest

from drills.tests.domain import Domain, Rule, rule


def brute_force_pairs(domain: Domain) -> set:
    """Every pair some rule-keeping case holds, found by walking the whole product."""
    names = list(domain.axes)
    pairs = set()
    for values in itertools.product(*(domain.axes[n] for n in names)):
        case = dict(zip(names, values))
        if domain.admits(case):
            pairs |= domain.pairs_of(case)
    return pairs


@rule("Hq", "Hkv", why="Hq a multiple of Hkv")
def _grouped(Hq, Hkv):
    return Hq % Hkv == 0


@rule("PAGE", "pages", "context", why="the context fits its pages")
def _fits(PAGE, pages, context):
    return context <= PAGE * pages


PAGED = Domain(
    axes=dict(
        Hq=(1, 4, 9, 32),
        Hkv=(1, 2, 3),
        PAGE=(1, 16, 128),
        pages=(1, 3),
        context=(0, 17, 300),
        D=(16, 256),
        v=("like_k", "unlike_k"),
    ),
    rules=(_grouped, _fits),
    limits=dict(min_page=1),
)
FREE = Domain(axes=dict(a=(0, 1, 2), b=("x", "y"), c=(True, False), d=(1, 2, 3, 4)))


@pytest.mark.parametrize("domain", [PAGED, FREE], ids=["with_rules", "no_rules"])
@pytest.mark.parametrize("stream", [0, 7, 123])
def test_every_admissible_pair_is_covered(domain, stream):
    cases = domain.cases(stream)
    covered = set().union(*(domain.pairs_of(c) for c in cases))
    assert brute_force_pairs(domain) <= covered


@pytest.mark.parametrize("stream", [0, 7, 123])
def test_every_case_keeps_the_rules(stream):
    for case in PAGED.cases(stream):
        assert PAGED.admits(case), case
        assert case["Hq"] % case["Hkv"] == 0 and case["context"] <= case["PAGE"] * case["pages"]


def test_inadmissible_pairs_are_left_out():
    # Hq = 9 with Hkv = 2 is held by no case: the draw neither loops on it nor breaks the rule for it.
    cases = PAGED.cases(0)
    assert not any(c["Hq"] == 9 and c["Hkv"] == 2 for c in cases)
    assert any(c["Hq"] == 9 and c["Hkv"] == 3 for c in cases)


def test_far_fewer_cases_than_the_product():
    product = 1
    for values in PAGED.axes.values():
        product *= len(values)
    n = len(PAGED.cases(0))
    assert n <= 40 < product, (n, product)


def test_deterministic_for_a_stream_and_seed(monkeypatch):
    monkeypatch.delenv("SEED", raising=False)
    first, again = PAGED.cases(5), PAGED.cases(5)
    assert first == again
    monkeypatch.setenv("SEED", "1")
    shifted = PAGED.cases(5)
    assert shifted == PAGED.cases(5)
    assert shifted != first, "SEED=1 must draw other cases"


def test_seed_shifts_the_stream(monkeypatch):
    monkeypatch.setenv("SEED", "1")
    shifted = PAGED.cases(5)
    monkeypatch.setenv("SEED", "0")
    assert shifted == PAGED.cases(6)


def test_limits_and_axes_read_by_name():
    assert PAGED["D"] == (16, 256)
    assert PAGED["min_page"] == 1
    with pytest.raises(KeyError):
        PAGED["nothing"]


def test_a_rule_naming_an_unknown_axis_is_refused():
    with pytest.raises(ValueError, match="lacks"):
        Domain(axes=dict(a=(1,)), rules=(Rule(("a", "b"), lambda a, b: True, "b?"),))


def test_without_drops_values():
    fewer = PAGED.without(D=(256,))
    assert fewer["D"] == (16,)
    assert all(c["D"] == 16 for c in fewer.cases(0))


def test_a_failure_names_the_case():
    cases = FREE.cases(0)
    bad = cases[len(cases) // 2]

    def check(case):
        assert case != bad, "output off by 3"

    with pytest.raises(AssertionError) as info:
        FREE.check_each(cases, check)
    message = str(info.value)
    assert FREE.describe(bad) in message and "output off by 3" in message
    assert f"of {len(cases)}" in message


def test_another_error_keeps_its_type_and_gets_the_case_as_a_note():
    cases = FREE.cases(0)

    def check(case):
        raise IndexError("out of bounds load of q_ptr")

    with pytest.raises(IndexError) as info:
        FREE.check_each(cases, check)
    assert FREE.describe(cases[0]) in info.value.__notes__[0]


def test_contract_names_a_kernel_grader_without_a_domain_or_pairwise_check():
    from types import SimpleNamespace

    from drills.contract import PAIRWISE_TEST, domain_problems
    from drills.lessons import LESSONS

    l2 = next(lesson for lesson in LESSONS if lesson.id == "l2")
    bare = SimpleNamespace(DOMAIN=dict(head_dims=(16, 256)))
    problems = domain_problems(l2, grader=bare)
    assert any("DOMAIN = Domain" in p for p in problems) and any(PAIRWISE_TEST in p for p in problems)
    whole = SimpleNamespace(DOMAIN=FREE, **{PAIRWISE_TEST: lambda impl, runtime: None})
    assert domain_problems(l2, grader=whole) == []
