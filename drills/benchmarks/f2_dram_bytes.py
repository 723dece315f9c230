"""F2, section 1.1: the bytes F1 and F2 ask for (logical) beside the bytes that reach DRAM.

Two steps, on a CUDA GPU with Nsight Compute:

1. `launch`, run under ncu, launches F1 and F2 (the cascade forced) once each on two rows of F2's
   benchmark: C1's traffic on Llama's attention shape, (B = 256, 304 shared + 128 own), whose shared
   pages fit in L2 many times over, and (32, 32768 + 1024), whose 134 MB of shared K and V do not.
   Compilation and a first call happen before ncu starts profiling (cudaProfilerStart), and a one-program
   marker kernel goes before each measured call, so that the CSV's kernels can be told apart.

       ncu --clock-control none --profile-from-start off --print-units base --csv \\
           --metrics dram__bytes_read.sum --log-file /tmp/f2_dram.csv \\
           python3 -m drills.benchmarks.f2_dram_bytes launch

2. `parse` reads that CSV, sums dram__bytes_read.sum over each call's kernels, and writes
   drills/content/f2_cascade_decode.dram.json, which the explainer's section 1.1 renders through
   f2_cascade_decode.FIGURES:

       python3 -m drills.benchmarks.f2_dram_bytes parse /tmp/f2_dram.csv

ncu flushes the caches before each kernel it profiles (its default --cache-control all): each stage
starts from a cold L2, as it does in a real step, where the layers between two attention calls evict it.
Logical bytes count the K and V the kernels load (the formula of section 1), not the partials or q.
Nothing runs on import; `parse` and the figure functions need no GPU.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

import triton
import triton.language as tl

JSON_PATH = Path(__file__).parents[1] / "content" / "f2_cascade_decode.dram.json"
ROWS = [(256, 304, 128, 1), (32, 32768, 1024, 1)]  # (B, shared prefix, own suffix, groups), F2's SHAPES
KERNELS = ["F1", "F2"]
MARKER = "_dram_bytes_marker"  # the kernel that separates two measured calls in ncu's CSV
UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12}


@triton.jit
def _dram_bytes_marker(x_ptr):
    """One program storing one int: a landmark between two measured calls in ncu's list of kernels."""
    tl.store(x_ptr, 1)


def labels() -> list[tuple[tuple[int, int, int, int], str]]:
    """The measured calls in launch order: (row, kernel), F1 then F2 on each row."""
    return [(row, kernel) for row in ROWS for kernel in KERNELS]


def logical_bytes(row, kernel: str) -> int:
    """K and V bytes the call loads: F1 reads every request's whole context; F2 (cascade forced) reads
    each group's prefix once per tile of rows and each request's own tokens once (section 1)."""
    from drills.benchmarks import f2_cascade_decode as f2b
    from drills.solutions import f2_cascade_decode as f2

    B, prefix, suffix, groups = row
    per_token = 2 * f2b.HKV * f2b.D * 2  # K and V, fp16
    if kernel == "F1":
        return B * (prefix + suffix) * per_token
    members_per_tile = max(1, f2.MAX_ROWS // (f2b.HQ // f2b.HKV))
    tiles = groups * math.ceil((B // groups) / members_per_tile)
    return (tiles * prefix + B * suffix) * per_token


def launch() -> None:
    """Under ncu: F1 and F2 once each on every row, each call after a marker kernel, inside
    cudaProfilerStart/Stop; every kernel compiled and run once before profiling starts."""
    import torch

    from drills.benchmarks import f2_cascade_decode as f2b
    from drills.solutions import f1_split_kv_decode as f1
    from drills.solutions import f2_cascade_decode as f2

    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    scale = 1.0 / math.sqrt(f2b.D)
    calls = []
    for row in ROWS:
        B, prefix, suffix, groups = row
        args, prefix_group, prefix_lens = f2b.make_inputs(B, prefix, suffix, groups)
        q, _, _, _, context_lens = args
        out = torch.empty_like(q)
        f1_plan = f1.plan(context_lens, f2b.HKV, f2b.PAGE)
        f2_plan = f2.plan(context_lens, prefix_group, prefix_lens, f2b.HQ, f2b.HKV, f2b.PAGE, cascade=True)
        calls.append(lambda a=args, p=f1_plan, o=out: f1._launch(*a, scale, p, o, None))
        calls.append(
            lambda a=args, g=prefix_group, n=prefix_lens, p=f2_plan, o=out: f2._launch(
                *a, g, n, scale, p, o, None
            )
        )
    _dram_bytes_marker[(1,)](flag)
    for call in calls:  # compile and warm outside the profiled range
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        _dram_bytes_marker[(1,)](flag)
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"launched {len(calls)} calls: " + ", ".join(f"{r} {k}" for r, k in labels()), flush=True)


def parse_ncu_csv(text: str) -> list[tuple[str, float]]:
    """(kernel name, DRAM bytes read) per profiled kernel, in launch order, from ncu's --csv output (the
    default details page: one line per kernel and metric). Lines before the header (ncu's ==PROF== lines,
    the program's own prints) are skipped; values may carry thousands separators and a unit."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise ValueError('no ncu CSV header (a line starting with "ID") in the file')
    kernels: dict[int, tuple[str, float]] = {}
    for rec in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if rec.get("Metric Name") != "dram__bytes_read.sum":
            continue
        unit = rec.get("Metric Unit", "byte") or "byte"
        if unit not in UNITS:
            raise ValueError(
                f"unknown unit {unit!r} for dram__bytes_read.sum (run ncu with --print-units base)"
            )
        value = float(rec["Metric Value"].replace(",", "")) * UNITS[unit]
        kernels[int(rec["ID"])] = (rec["Kernel Name"], value)
    return [kernels[i] for i in sorted(kernels)]


def per_call(kernels: list[tuple[str, float]]) -> list[tuple[float, int]]:
    """(DRAM bytes, kernels) of each measured call: the kernels between one marker and the next."""
    calls: list[list[float]] = []
    for name, nbytes in kernels:
        if name.startswith(MARKER):
            calls.append([])
        elif calls:
            calls[-1].append(nbytes)
    if len(calls) != len(labels()):
        raise ValueError(f"the CSV holds {len(calls)} marked calls, launch() makes {len(labels())}")
    return [(sum(c), len(c)) for c in calls]


def parse(path: str) -> None:
    """Write JSON_PATH from ncu's CSV at path."""
    from drills import bench

    measured = per_call(parse_ncu_csv(Path(path).read_text()))
    rows = []
    for ((B, prefix, suffix, groups), kernel), (dram, n) in zip(labels(), measured):
        logical = logical_bytes((B, prefix, suffix, groups), kernel)
        rows.append(
            dict(
                B=B,
                prefix=prefix,
                suffix=suffix,
                groups=groups,
                kernel=kernel,
                kernels=n,
                logical_mb=logical / 1e6,
                dram_mb=dram / 1e6,
                dram_vs_logical=dram / logical,
            )
        )
        print(f"{B}, {prefix} + {suffix}, {kernel}: {logical / 1e6:.0f} MB logical, {dram / 1e6:.0f} MB DRAM")
    meta = bench.stamp()
    meta["tool"] = "ncu --clock-control none --metrics dram__bytes_read.sum (default cache control: flushed)"
    JSON_PATH.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    print(f"wrote {JSON_PATH}")


# --- What section 1.1 of the explainer renders (through f2_cascade_decode.FIGURES)


def _record() -> dict | None:
    return json.loads(JSON_PATH.read_text()) if JSON_PATH.exists() else None


def table(_data=None) -> str:
    """The markdown table of section 1.1: n/a in every measured cell until the JSON exists."""
    record = _record()
    lines = [
        "| row | kernel | logical MB | DRAM MB read | DRAM / logical |",
        "| --- | --- | --- | --- | --- |",
    ]
    for (B, prefix, suffix, _), kernel in labels():
        r = None
        if record:
            r = next(
                (
                    x
                    for x in record["rows"]
                    if (x["B"], x["prefix"], x["suffix"], x["kernel"]) == (B, prefix, suffix, kernel)
                ),
                None,
            )
        cells = (
            [bench_num(r["logical_mb"], 0), bench_num(r["dram_mb"], 0), bench_num(r["dram_vs_logical"], 2)]
            if r
            else ["n/a"] * 3
        )
        lines.append(f"| ({B}, {prefix} + {suffix}) | {kernel} | " + " | ".join(cells) + " |")
    return "\n" + "\n".join(lines) + "\n"  # the span's markers on lines of their own, as L4's steps table


def note(_data=None) -> str:
    record = _record()
    if record is None:
        return "Not measured yet: the table fills when drills/benchmarks/f2_dram_bytes.py runs under ncu on a GPU."
    meta = record["meta"]
    return (
        f"Measured on {meta['gpu']}, {meta['date']}, with {meta['tool']}; F2 with the cascade forced, each "
        "call's kernels summed (F2: prefix stage, suffix stage, merge)."
    )


def bench_num(value: float, digits: int) -> str:
    from drills import bench

    return bench.num(value, digits)


if __name__ == "__main__":
    if sys.argv[1:2] == ["launch"]:
        launch()
    elif sys.argv[1:2] == ["parse"] and len(sys.argv) == 3:
        parse(sys.argv[2])
    else:
        raise SystemExit("usage: python3 -m drills.benchmarks.f2_dram_bytes launch | parse <ncu.csv>")
