"""A measured figure has one home, its lesson's JSON (drills/content/<stem>.bench.json). The explainer
quotes it only through what `make bench` renders: the table between the bench markers, and in sentences
a span `<!--fig:name-->0.91<!--/fig-->` that publish refills from the benchmark module's FIGURES
(drills/bench.py's docstring). These checks run on the committed files, on a CPU: a table or a span
that disagrees with the committed JSON fails, and so does a measured figure written outside a span.
Worked numbers computed by hand are not measured figures: the graders pin them through the learner's
functions."""

from __future__ import annotations

import json
import re

import pytest

from drills import bench
from drills.lessons import LESSONS, find

WITH_BENCHMARK = [lesson for lesson in LESSONS if lesson.benchmark.exists()]


@pytest.mark.parametrize("lesson", WITH_BENCHMARK, ids=lambda lesson: lesson.id)
def test_bench_table_is_what_the_committed_json_renders(lesson):
    assert bench.stale_table(lesson) is None, f"{lesson.explainer.name}: {bench.stale_table(lesson)}"


@pytest.mark.parametrize("lesson", WITH_BENCHMARK, ids=lambda lesson: lesson.id)
def test_quoted_figures_are_what_the_committed_json_renders(lesson):
    stale = bench.stale_figures(lesson)
    assert not stale, f"{lesson.explainer.name} (make bench L={lesson.id} rewrites them):\n" + "\n".join(
        stale
    )


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda lesson: lesson.id)
def test_no_measured_figure_outside_a_span(lesson):
    loose = bench.unquoted_figures(lesson.explainer.read_text())
    assert not loose, (
        f"{lesson.explainer.name}: measured figures outside a <!--fig:name--> span; quote them from the JSON "
        "through the benchmark's FIGURES, or drop them:\n" + "\n".join(loose)
    )


def test_a_stale_figure_is_caught():
    """Planted on L4's real explainer and JSON: a retyped span, a span naming no figure, a figure typed
    outside a span and an edited table cell each fail; refilling restores the spans."""
    l4 = find("l4")
    text = l4.explainer.read_text()
    data = json.loads((l4.explainer.parent / f"{l4.stem}.bench.json").read_text())
    figures = bench.benchmark_module(l4).FIGURES
    assert bench.stale_figures_in(text, figures, data) == []
    fresh = "<!--fig:prefill_tflops-->" + figures["prefill_tflops"](data) + "<!--/fig-->"
    assert fresh in text
    stale = text.replace(fresh, "<!--fig:prefill_tflops-->358 to 449<!--/fig-->", 1)
    found = bench.stale_figures_in(stale, figures, data)
    assert len(found) == 1 and "prefill_tflops" in found[0] and "358 to 449" in found[0]
    assert bench.render_figures(stale, figures, data) == text
    unknown = text.replace("<!--fig:prefill_tflops-->", "<!--fig:prefill_tflop-->", 1)
    assert "prefill_tflop: quoted" in bench.stale_figures_in(unknown, figures, data)[0]
    with pytest.raises(SystemExit):
        bench.render_figures(unknown, figures, data)
    loose = text + "\nOn the four prefill rows this kernel reaches 342 to 449 TFLOP/s, 0.91 × fa3.\n"
    assert len(bench.unquoted_figures(loose)) == 2
    worked = "Measured on an RTX 5090, it takes 176 µs. The target: at least 0.95 × fa3. Section 5 times L2."
    assert bench.unquoted_figures(worked) == []
    columns = bench.benchmark_module(l4).COLUMNS
    assert bench.stale_table_in(text, l4, columns, data) is None
    # A cell of the rendered table, whatever this run measured: its value retyped one higher.
    block = text.split("<!-- bench:start -->", 1)[1].split("<!-- bench:end -->", 1)[0]
    cell = re.search(r"\| (\d{3,}) \|", block).group(1)
    retyped = str(int(cell) + 1)
    edited = text.replace(f"| {cell} |", f"| {retyped} |", 1)
    assert edited != text and retyped in bench.stale_table_in(edited, l4, columns, data)


def test_readme_times_are_the_measured_ones():
    """README's table of make test times is what drills/content/make_test_times.json renders: a time
    typed by hand, or a JSON measured again without `make times WRITE=1`, fails here."""
    from drills import grading_times

    data = grading_times.load()
    assert data is not None, "drills/content/make_test_times.json is missing: make times WRITE=1"
    assert {row["id"] for row in data["lessons"]} == {lesson.id for lesson in LESSONS}
    block = grading_times.readme_block(grading_times.README.read_text())
    assert block == grading_times.render(data), (
        "README's make test times differ from the JSON: make times WRITE=1"
    )
