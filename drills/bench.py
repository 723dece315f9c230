"""The one benchmarking helper: timing, ceilings measured in the same run, the GPU's datasheet peak,
publishing (a table rewritten between markers in the lesson's explainer, a JSON of the raw numbers and
a PNG plot beside it under drills/content/), and the learner's numbers beside the reference's.

The benchmark module protocol. A lesson has a benchmark when drills/benchmarks/<stem>.py exists
(Lesson.benchmark). `make bench` (cmd_bench in drills/__main__.py), `make progress` and this module
read these names from it, and nothing else:

  COLUMNS       [(key, header)]: the table's columns, in order. Pass it to Table. `make bench IMPL=mine`
                (compare_rows) labels each row by its leading columns whose values are not floats (up to
                three) and compares the columns whose key starts with the lesson id ("l2_gbs"), or
                every float column when none does.
  run(impl)     -> (Table, notes): times impl, the module under test (drills.solutions.<stem>, or the
                learner's file with IMPL=mine), and its peers, one table row per shape. Check every
                implementation's output before timing it (a fast wrong answer must not enter the
                table); measure the ceiling each row is a fraction of in the same run. Rows are dicts;
                keys outside COLUMNS are kept in the JSON only. notes (list[str]) become bullets under
                the table: inputs, what GB/s counts, which peer version ran, why a column is n/a. The
                shape list must not depend on impl: yours and the reference's rows are matched by
                position.
  plot(rows, meta, path)
                writes a PNG at path (plot_bars does the usual grouped bars); meta is stamp()'s dict
                (gpu, cpu, versions, date). Called by publish, that is only for IMPL=solutions.
  headline(impl) -> (value, unit, label), optional: one representative shape, checked then timed,
                e.g. (gbs, "GB/s", "B = 64, ctx = 1024, fp16"). `make progress` shows it on a GPU
                for every passing lesson, the learner's beside the reference's. Its one parameter is
                named impl (test_learner_tools checks it).
  NEEDS_CUDA    optional, default True. False (a pure-Python lesson such as L3) lets `make bench` run
                on a CPU; publish then names the CPU instead of a GPU.
  FIGURES       optional {name: figure(data) -> str}: the measured figures the explainer's sentences
                quote, each computed from data, the lesson's JSON as publish writes it ({"meta",
                "notes", "rows"}). A sentence quotes one as `<!--fig:name-->0.91<!--/fig-->` (the
                comments do not render); publish rewrites the text between them from the fresh JSON,
                and tests/test_explainer_figures.py fails when a span's text is not what the committed
                JSON renders, names no figure, or a measured figure stands outside a span. Use the
                helpers below (num, span_of, joined) so that a figure is written as the table writes it.

`make bench L=<id>` (IMPL=solutions) calls run(reference) then publish(); `make bench L=<id> IMPL=mine`
calls run(learner's module) then print_comparison(), which takes the reference's rows from the
committed <stem>.bench.json when it was measured on this GPU, else runs the reference now.
"""

from __future__ import annotations

import datetime
import importlib
import json
import re
from pathlib import Path

import torch

from drills.grading.grader import report
from drills.lessons import Lesson

# Datasheet memory bandwidth in GB/s, matched against torch.cuda.get_device_name().
PEAK_GBS = {
    "H200": 4800,
    "H100 SXM": 3350,  # the SXM part; "H100 PCIe" reads 2000, "H100 NVL" 3900
    "H100 PCIe": 2000,
    "H100 NVL": 3900,
    "H100": 3350,
    "A100-SXM4-80GB": 2039,
    "A100-SXM4-40GB": 1555,
    "A100 80GB PCIe": 1935,
    "L40S": 864,
    "RTX 5090": 1792,
    "RTX 4090": 1008,
    "RTX 3090": 936,
}


# Datasheet dense fp16/bf16 tensor-core TFLOP/s (fp32 accumulate), matched the same way.
PEAK_TFLOPS_FP16 = {
    "H200": 989,
    "H100 SXM": 989,
    "H100 PCIe": 756,
    "H100 NVL": 835,
    "H100": 989,
    "A100": 312,
    "L40S": 362,
    "RTX 5090": 209,
    "RTX 4090": 165,
    "RTX 3090": 71,
}


def require_cuda() -> str | None:
    """None when a CUDA GPU is present, else the one-line reason a GPU benchmark cannot run."""
    if torch.cuda.is_available():
        return None
    return "needs a CUDA GPU (none found): benchmarks time compiled kernels, the interpreter only checks them"


def _lookup(table: dict) -> float | None:
    name = torch.cuda.get_device_name()
    for key, value in table.items():  # most specific keys first
        if key in name:
            return float(value)
    return None


def peak_gbs() -> float | None:
    """Datasheet memory bandwidth of this GPU, or None when the harness does not know it."""
    return _lookup(PEAK_GBS)


def peak_tflops_fp16() -> float | None:
    """Datasheet dense fp16 tensor-core rate of this GPU, or None when the harness does not know it."""
    return _lookup(PEAK_TFLOPS_FP16)


def stamp() -> dict:
    import platform

    import triton

    gpu = torch.cuda.is_available()
    return {
        "gpu": torch.cuda.get_device_name() if gpu else None,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.date.today().isoformat(),
        "datasheet_peak_gbs": peak_gbs() if gpu else None,
        "datasheet_peak_tflops_fp16": peak_tflops_fp16() if gpu else None,
    }


def time_us(fn, graph: bool = False) -> float:
    """Median time of one call in microseconds; do_bench flushes L2 between calls, so repeated calls
    over the same buffers do not measure the cache.

    graph=True captures fn once in a CUDA graph and times its replays: the GPU's time alone, without
    Python's launch overhead, which is how serving engines run decode steps (and a fair footing for
    peers whose launches are C++)."""
    import triton.testing

    if graph:
        fn()  # compile and allocate outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return 1000.0 * triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median")
    return 1000.0 * triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def guard_cost(launch) -> dict:
    """What the device guard (drills/device_errors.py) costs: launch(guard) runs the kernel with the guard
    on or off. Returns, for "eager" and "graph" (a CUDA-graph replay), the guarded and unguarded times
    in us and their ratio, each the median of 5 alternating measurements (a drift of the clock then
    hits both sides alike)."""
    cost = {}
    for mode in ("eager", "graph"):
        on, off = [], []
        for _ in range(5):
            on.append(time_us(lambda: launch(True), graph=mode == "graph"))
            off.append(time_us(lambda: launch(False), graph=mode == "graph"))
        ratios = sorted(a / b for a, b in zip(on, off))
        cost[mode] = dict(guarded_us=sorted(on)[2], unguarded_us=sorted(off)[2], ratio=ratios[2])
    return cost


GUARDS_JSON = "device_guards.bench.json"  # under drills/content, written by drills/benchmarks/guard_cost.py


def guard_cost_figure(stem: str) -> str:
    """The explainers' words on the guard's cost: the span of the ratios over the lesson's benchmark
    shapes, eager and graph-replayed, from the record drills/benchmarks/guard_cost.py writes."""
    data = json.loads((Path(__file__).parent / "content" / GUARDS_JSON).read_text())
    rows = [r for r in data["rows"] if r["lesson"] == stem]
    eager, graph = [r["eager_ratio"] for r in rows], [r["graph_ratio"] for r in rows]
    return (
        f"{span_of(eager, 3)} eager and {span_of(graph, 3)} graph-replayed over its {len(rows)} benchmark "
        f"shapes ({data['meta']['gpu']}, {data['meta']['date']})"
    )


def host_us(fn, calls: int = 100) -> float:
    """Median host time of one call in microseconds: what the calling Python thread pays per call
    (checks, allocations, launches), not the GPU. Calls are queued without waiting, and 100 of them stay
    far below the GPU's launch queue, so no call blocks on the GPU; the queue is drained between rounds."""
    import time

    fn()  # compile outside the timing
    rounds = []
    for _ in range(7):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls)
    torch.cuda.synchronize()
    return 1e6 * sorted(rounds)[len(rounds) // 2]


def read_ceiling_gbs(nbytes: int) -> float:
    """GB/s of a plain reduction over an fp16 buffer of nbytes: the most a kernel that reads those bytes
    once can hope for on this GPU today."""
    x = torch.ones(nbytes // 2, dtype=torch.float16, device="cuda")
    t = time_us(lambda: x.sum(), graph=True)
    del x
    return nbytes / t / 1e3


def copy_ceiling_gbs(nbytes: int) -> float:
    """GB/s (bytes read + bytes written) of a device-to-device copy that reads nbytes: the ceiling for
    elementwise kernels that read and write, measured in the same run."""
    src = torch.ones(nbytes // 2, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    t = time_us(lambda: dst.copy_(src), graph=True)
    del src, dst
    return 2 * nbytes / t / 1e3


def tflops(flops: float, us: float) -> float:
    return flops / us / 1e6


def gbs(nbytes: int, us: float) -> float:
    return nbytes / us / 1e3


class Table:
    """Rows printed as they are measured (benchmarks take minutes), rendered as markdown at the end."""

    def __init__(self, columns: list[tuple[str, str]]):
        self.columns = columns  # (key, header)
        self.rows: list[dict] = []
        print(" | ".join(h for _, h in columns), flush=True)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        print(" | ".join(_fmt(row.get(k)) for k, _ in self.columns), flush=True)


def markdown_table(columns: list[tuple[str, str]], rows: list[dict]) -> str:
    lines = [
        "| " + " | ".join(h for _, h in columns) + " |",
        "|" + "|".join(" --- " for _ in columns) + "|",
    ]
    lines += ["| " + " | ".join(_fmt(r.get(k)) for k, _ in columns) + " |" for r in rows]
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 10 else f"{v:.0f}"
    return str(v)


# --- Figures in sentences: one home, the JSON -------------------------------------------------------

FIGURE = re.compile(r"<!--fig:([\w.-]+)-->(.*?)<!--/fig-->", re.S)


def num(value: float, digits: int | None = None) -> str:
    """A measured value as a sentence quotes it: digits after the point, else as the table's cells
    (_fmt: 2 digits below 10, none above), with a thousands separator from 10,000 up."""
    if digits is None:
        digits = 2 if abs(value) < 10 else 0
    text = f"{value:,.{digits}f}"
    return text if abs(value) >= 10_000 else text.replace(",", "")


def span_of(values, digits: int | None = None, sep: str = " to ") -> str:
    """ "low to high" of the values, each as num writes it."""
    values = list(values)
    return f"{num(min(values), digits)}{sep}{num(max(values), digits)}"


def joined(values, digits: int | None = None, sep: str = " / ") -> str:
    """The values in order, as num writes them, joined by sep: "0.91 / 0.90 / 0.93"."""
    return sep.join(num(v, digits) for v in values)


def render_figures(text: str, figures: dict, data: dict) -> str:
    """text with every `<!--fig:name-->...<!--/fig-->` span refilled from data; a span naming no
    figure stops with an error (a typo must not leave a stale number standing)."""

    def fill(match):
        name = match.group(1)
        if name not in figures:
            raise SystemExit(f"the explainer quotes figure {name!r}, which FIGURES does not define")
        return f"<!--fig:{name}-->{figures[name](data)}<!--/fig-->"

    return FIGURE.sub(fill, text)


def refresh_figures(lesson: Lesson) -> None:
    """Refill the lesson explainer's figures from its committed JSON, for a record that the figures read
    beside it (make guards rewrites device_guards.bench.json, which four explainers quote)."""
    path = lesson.explainer.parent / f"{lesson.stem}.bench.json"
    figures = getattr(benchmark_module(lesson), "FIGURES", {})
    text = lesson.explainer.read_text()
    lesson.explainer.write_text(render_figures(text, figures, json.loads(path.read_text())))


def stale_figures_in(text: str, figures: dict, data: dict) -> list[str]:
    """The spans of text whose content is not what data renders, or that name no figure, one line each
    ("name: the text says X, the JSON gives Y"); empty when every figure is current."""
    found = []
    for name, said in FIGURE.findall(text):
        if name not in figures:
            found.append(f"{name}: quoted, but the benchmark's FIGURES has no such figure")
        elif said != (fresh := figures[name](data)):
            found.append(f"{name}: the text says {said!r}, the JSON gives {fresh!r}")
    return found


def stale_figures(lesson: Lesson) -> list[str]:
    """stale_figures_in for the lesson's explainer and its committed JSON."""
    text = lesson.explainer.read_text()
    path = lesson.explainer.parent / f"{lesson.stem}.bench.json"
    if not FIGURE.search(text):
        return []
    if not lesson.benchmark.exists() or not path.exists():
        return [f"{name}: quoted, but the lesson has no benchmark JSON" for name, _ in FIGURE.findall(text)]
    figures = getattr(benchmark_module(lesson), "FIGURES", {})
    return stale_figures_in(text, figures, json.loads(path.read_text()))


# A measured figure as prose states one: a number (or a range, "342 to 449", "1.00 / 0.95") and a unit
# of speed or time, or a ratio to a peer or a ceiling. What is exempt: spans, the bench block, code,
# tables, a clause that sets a target ("at least 0.95 x fa3"), a datasheet figure (the word next to it; TB/s, the unit of
# datasheet bandwidth, is not counted), a result of arithmetic ("≈ 335 µs"), and a sentence
# that names another GPU or a CPU (numbers measured elsewhere are quoted as theirs).
_NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:\s*(?:to|-|/|and)\s*\d[\d,]*(?:\.\d+)?)*"
MEASURED = re.compile(
    _NUMBER + r"\s*(?:TFLOP/s|GB/s|tok/s|tokens/s|requests/s|µs|us\b|ms\b|s to first token"
    r"|(?:×|x|times)\s+(?:fa2|fa3|FlashInfer|cuBLAS|SDPA|torch|transformers|T5|the|L2|F1)\b"
    r"|of\s+(?:the|its|T5|fa3|FlashInfer)\s+(?:\w+\s+)?(?:ceiling|best|fixed|read|copy|peak)\b)"
)
TARGET = re.compile(r"at least|≥|>=")  # a goal, not a measurement
ELSEWHERE = re.compile(r"RTX|A100|B200|L40S|MI\d{3}|another GPU|their GPU|a laptop|on a CPU")


def unquoted_figures(text: str) -> list[str]:
    """The measured figures of an explainer's prose that stand outside a figure span, one line each
    ("line N: ... 342 to 449 TFLOP/s ..."): each must come from the JSON through FIGURES, or go."""
    text = BENCH_BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    text = FIGURE.sub(lambda m: "FIG" + "\n" * m.group(0).count("\n"), text)
    found, fenced = [], False
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or line.lstrip().startswith(("|", "```", "    ")) or line.startswith("#"):
            continue
        for match in MEASURED.finditer(line):
            if line[: match.start()].rstrip().lower().endswith("section"):
                continue  # "section 5 times FlashInfer": a verb after a section number
            if re.search(r"[≈=≥]\s*\**$", line[: match.start()]):
                continue  # arithmetic by hand: "1.61 GB / 4.8 TB/s ≈ 335 µs"
            head, tail = _sentence(lines, n - 1, match.start())
            near = head[-40:] + tail[: len(match.group(0)) + 40]
            if re.search(r"datasheet|at peak", near):
                continue  # the GPU's datasheet figure, or a time at its peak
            if not ELSEWHERE.search(head + tail) and not TARGET.search(head + tail):
                found.append(f"line {n}: ...{line[max(0, match.start() - 30) : match.end() + 10]}...")
    return found


def _sentence(lines: list[str], i: int, col: int) -> tuple[str, str]:
    """The sentence around column col of lines[i], across the lines of its paragraph: (the part before
    col, the part from col on)."""
    start, end = i, i
    while start > 0 and lines[start - 1].strip() and not lines[start - 1].lstrip().startswith(("|", "#")):
        start -= 1
    while (
        end + 1 < len(lines) and lines[end + 1].strip() and not lines[end + 1].lstrip().startswith(("|", "#"))
    ):
        end += 1
    before = " ".join(lines[start:i] + [lines[i][:col]])
    after = " ".join([lines[i][col:]] + lines[i + 1 : end + 1])
    head = re.split(r"(?<=[.;])\s+", before)[-1]
    tail = re.split(r"(?<=[.;])\s+", after)[0]
    return head, tail


BENCH_BLOCK = re.compile(r"<!-- bench:start -->\n?(.*?)\n?<!-- bench:end -->", re.S)


def bench_block(lesson: Lesson, columns: list[tuple[str, str]], data: dict) -> str:
    """What publish writes between the bench markers for data (the lesson's JSON): the stamp, the
    table, the notes and the plot."""
    meta = data["meta"]
    where = meta["gpu"] or f"the CPU ({meta['cpu']}, no GPU involved)"
    header = (
        f"Measured on {where}, torch {meta['torch']} (CUDA {meta['cuda']}), Triton {meta['triton']}, "
        f"{meta['date']}, by `make bench L={lesson.id}`."
    )
    table = markdown_table(columns, data["rows"])
    notes = "\n".join(f"- {n}" for n in data["notes"])
    return "\n\n".join([header, table, notes, f"![benchmark plot]({lesson.stem}.bench.png)"])


def stale_table_in(text: str, lesson: Lesson, columns: list[tuple[str, str]], data: dict) -> str | None:
    """None when text's bench block is what data renders, else a one-line reason."""
    match = BENCH_BLOCK.search(text)
    if match is None:
        return "the explainer has no <!-- bench:start --> ... <!-- bench:end --> block"
    fresh = bench_block(lesson, columns, data)
    if match.group(1) == fresh:
        return None
    ours, theirs = match.group(1).splitlines(), fresh.splitlines()
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    said = ours[first] if first < len(ours) else "(nothing)"
    gives = theirs[first] if first < len(theirs) else "(nothing)"
    return f"line {first + 1} of the bench block says {said!r}, the JSON renders {gives!r}"


def stale_table(lesson: Lesson) -> str | None:
    """stale_table_in for the lesson's explainer and its committed JSON (None without a benchmark)."""
    path = lesson.explainer.parent / f"{lesson.stem}.bench.json"
    if not lesson.benchmark.exists() or not path.exists():
        return None
    columns = benchmark_module(lesson).COLUMNS
    return stale_table_in(lesson.explainer.read_text(), lesson, columns, json.loads(path.read_text()))


def publish(lesson: Lesson, table: Table, notes: list[str], plot) -> None:
    """Write <stem>.bench.json and <stem>.bench.png under drills/content/, rewrite the block between
    `<!-- bench:start -->` and `<!-- bench:end -->` in the explainer, and refill its figure spans from
    the new JSON (FIGURES)."""
    meta = stamp()
    content = lesson.explainer.parent
    json_path = content / f"{lesson.stem}.bench.json"
    png_path = content / f"{lesson.stem}.bench.png"
    data = {"meta": meta, "notes": notes, "rows": table.rows}
    json_path.write_text(json.dumps(data, indent=1) + "\n")
    plot(table.rows, meta, png_path)
    block = bench_block(lesson, table.columns, data)
    text = lesson.explainer.read_text()
    if not BENCH_BLOCK.search(text):
        raise SystemExit(f"{lesson.explainer} has no <!-- bench:start --> ... <!-- bench:end --> block")
    fresh = f"<!-- bench:start -->\n{block}\n<!-- bench:end -->"
    text = BENCH_BLOCK.sub(lambda m: fresh, text, count=1)
    text = render_figures(text, getattr(benchmark_module(lesson), "FIGURES", {}), data)
    lesson.explainer.write_text(text)
    print(
        f"wrote {json_path.name}, {png_path.name}, the table and the figures in {lesson.explainer.name}",
        flush=True,
    )


def gather_pages(cache: torch.Tensor, block_tables: torch.Tensor, ctx: int) -> torch.Tensor:
    """The first ctx tokens of every sequence of a paged cache [num_blocks, PAGE, Hkv, D], pages taken in
    block-table order: [B, Hkv, ctx, D], SDPA's layout (a strided view of a gathered copy). The KV a
    non-paged engine keeps, and what a peer without a paged kernel must build first."""
    B = block_tables.shape[0]
    return cache[block_tables.long()].reshape(B, -1, *cache.shape[2:])[:, :ctx].transpose(1, 2)


def plot_bars(
    rows: list[dict],
    series: list[tuple[str, str]],
    labels: list[str],
    title: str,
    path,
    ylabel: str = "fraction of the same-run ceiling",
    hline: tuple[float, str | None] | None = (1.0, None),
) -> None:
    """Grouped bars saved as a PNG at path: one group per row (labelled by labels), one bar per (key, name)
    in series (a missing value drawn as 0), and a dashed line at hline = (value, legend name or None)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(rows) + 2), 4))
    width = 0.8 / len(series)
    for i, (key, name) in enumerate(series):
        ax.bar(
            [x + i * width for x in range(len(rows))], [r.get(key) or 0.0 for r in rows], width, label=name
        )
    if hline is not None:
        ax.axhline(hline[0], color="gray", lw=0.8, ls="--", label=hline[1])
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(rows))], labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def sweep_gbs(nbytes: int, launches: dict, out: torch.Tensor, check) -> tuple[dict, str]:
    """Time each launch (name -> zero-argument callable that writes `out`) moving nbytes, after check(out)
    has accepted what it wrote into an out filled with NaN. Returns ({name: GB/s}, "best name: GB/s")."""
    result = {}
    for name, launch in launches.items():
        out.fill_(float("nan"))  # an element the launch does not write fails the check
        launch()
        check(out)
        result[name] = gbs(nbytes, time_us(launch))
    best = max(result, key=result.get)
    return result, f"{best}: {result[best]:.0f}"


# --- Yours beside the reference: make bench IMPL=mine, and make progress on a GPU -------------------


def benchmark_module(lesson: Lesson):
    """The lesson's drills/benchmarks/<stem>.py, imported (its protocol: this module's docstring)."""
    return importlib.import_module(f"drills.benchmarks.{lesson.stem}")


def headline(lesson: Lesson, impl) -> tuple[float, str, str] | None:
    """The benchmark's headline for impl (value, unit, label), or None when it declares none."""
    if not lesson.benchmark.exists():
        return None
    hook = getattr(benchmark_module(lesson), "headline", None)
    return hook(impl) if hook else None


def performance_line(lesson: Lesson, load_mine) -> str:
    """make progress on a GPU: one line with the headline of the learner's module (load_mine() imports
    it) beside the reference's, timed now; an error at benchmark size is reported on the line."""
    try:
        mine = headline(lesson, load_mine())
        if mine is None:
            return f"  {lesson.id:4} n/a (its benchmark has no headline)"
        reference = headline(lesson, importlib.import_module(lesson.module("solutions")))
    except Exception as exc:  # a passing kernel can still fail at benchmark sizes: say so, go on
        return report.clip(f"  {lesson.id:4} error at benchmark size: {type(exc).__name__}: {exc}")
    (value, unit, label), (ref, _, _) = mine, reference
    return (
        f"  {lesson.id:4} {value:8.1f} {unit:8} reference {ref:8.1f} {unit:8} ({value / ref:.2f}x)  {label}"
    )


def compare_rows(
    lesson: Lesson, columns: list[tuple[str, str]], mine: list[dict], reference: list[dict]
) -> list[str]:
    """One line per benchmark row: the lesson's own columns (keys starting with its id, else every
    number), yours and the reference's, matched by position (both ran the same shape list)."""
    headers = dict(columns)
    keys = [k for k, _ in columns if k.startswith(f"{lesson.id}_")]
    lines = []
    for mine_row, ref_row in zip(mine, reference):
        label_keys = []
        for key, _ in columns:
            if isinstance(mine_row.get(key), float):
                break
            label_keys.append(key)
        label = ", ".join(f"{headers[k]} {mine_row.get(k)}" for k in label_keys[:3])
        shown = keys or [k for k, _ in columns if isinstance(mine_row.get(k), float)]
        parts = []
        for key in shown:
            yours, ref = mine_row.get(key), ref_row.get(key)
            if isinstance(yours, (int, float)) and isinstance(ref, (int, float)):
                parts.append(f"{headers[key]} {_fmt(float(yours))} (reference {_fmt(float(ref))})")
        lines.append(f"  {label}: " + "; ".join(parts))
    return lines


def reference_rows(lesson: Lesson, module) -> tuple[list[dict], str]:
    """The reference's rows: the committed JSON when it was measured on this GPU, else timed now."""
    path = lesson.explainer.parent / f"{lesson.stem}.bench.json"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    if path.exists() and gpu is not None:  # a CPU-only lesson's JSON may come from another CPU: time it now
        data = json.loads(path.read_text())
        if data.get("meta", {}).get("gpu") == gpu:
            where = f"the committed {report.relative(path)} (measured {data['meta'].get('date')} on {gpu})"
            return data["rows"], where
    print(f"== {lesson.id}: the reference, timed in this run for comparison ==", flush=True)
    table, _ = module.run(importlib.import_module(lesson.module("solutions")))
    return table.rows, "the reference timed in this run"


def print_comparison(lesson: Lesson, module, table: Table) -> None:
    """make bench IMPL=mine: after the learner's own table, each row beside the reference's."""
    rows, source = reference_rows(lesson, module)
    print(
        f"== {lesson.id}: yours beside the reference ({source}); the ceiling columns above are this run's =="
    )
    print("\n".join(compare_rows(lesson, module.COLUMNS, table.rows, rows)))
