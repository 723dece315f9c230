"""T4 benchmark: softmax statistics and softmax of long fp16 rows, against torch.logsumexp and
torch.softmax, each as a fraction of a ceiling measured in the same run.

softmax_stats reads M * N * 2 bytes, so its GB/s is compared with a plain reduction over a buffer of
that size (bench.read_ceiling_gbs). online_softmax must read x and write p, 2 * M * N * 2 bytes at
the least, so its GB/s counts those and is compared with a device copy of x (bench.copy_ceiling_gbs);
it actually reads x twice (see the explainer, section 4). Each output is checked against torch's
before it is timed.
"""

from __future__ import annotations

import torch

from drills import bench
from drills.compare import assert_close

SHAPES = [(4096, 32768), (64, 1_048_576), (16384, 8192)]  # (M rows, N columns), fp16

COLUMNS = [
    ("M", "M"),
    ("N", "N"),
    ("mb", "x MB"),
    ("splits", "splits"),
    ("read_gbs", "read ceiling GB/s"),
    ("stats_gbs", "stats GB/s, 1 split"),
    ("stats_ceiling", "/ ceiling"),
    ("stats_split_gbs", "stats GB/s, split"),
    ("stats_split_ceiling", "/ ceiling"),
    ("lse_gbs", "torch.logsumexp GB/s"),
    ("lse_ceiling", "/ ceiling"),
    ("copy_gbs", "copy ceiling GB/s"),
    ("softmax_gbs", "online_softmax GB/s, 1 split"),
    ("softmax_ceiling", "/ ceiling"),
    ("softmax_split_gbs", "online_softmax GB/s, split"),
    ("softmax_split_ceiling", "/ ceiling"),
    ("torch_gbs", "torch.softmax GB/s"),
    ("torch_ceiling", "/ ceiling"),
    ("best_peak", "best T4 / datasheet"),
]


def auto_splits(M, N):
    """Enough programs to give every SM about four, never a split shorter than two 4096-column blocks."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = 1
    while M * splits < 4 * sms and N // (splits * 2) >= 2 * 4096:
        splits *= 2
    return splits


def run(impl) -> tuple[bench.Table, list[str]]:
    table = bench.Table(COLUMNS)
    peak = bench.peak_gbs()
    for M, N in SHAPES:
        x = torch.randn(M, N, device="cuda", dtype=torch.float16) * 4  # [M, N]
        out = torch.empty_like(x)
        nbytes = x.numel() * x.element_size()
        splits = auto_splits(M, N)

        def stats(s):
            return impl._merge_splits(*impl._launch_stats(x, None, s))

        def softmax(s):
            return impl._launch_online_softmax(x, None, s, out)

        # Checked before timing: logsumexp = m + log(l), and p against torch in fp32.
        lse_ref = torch.logsumexp(x.float(), dim=1)
        p_ref = torch.softmax(x.float(), dim=1)
        for s in sorted({1, splits}):
            m, l = stats(s)
            assert_close(m + torch.log(l), lse_ref)
            assert_close(softmax(s), p_ref)
        assert_close(torch.logsumexp(x, dim=1), lse_ref)
        assert_close(torch.softmax(x, dim=1), p_ref)
        del p_ref

        row = dict(M=M, N=N, mb=round(nbytes / 1e6), splits=splits)
        row["read_gbs"] = bench.read_ceiling_gbs(nbytes)
        row["copy_gbs"] = bench.copy_ceiling_gbs(nbytes)
        timed = {
            "stats_gbs": (nbytes, lambda: stats(1), "read_gbs"),
            "stats_split_gbs": (nbytes, lambda: stats(splits), "read_gbs"),
            "lse_gbs": (nbytes, lambda: torch.logsumexp(x, dim=1), "read_gbs"),
            "softmax_gbs": (2 * nbytes, lambda: softmax(1), "copy_gbs"),
            "softmax_split_gbs": (2 * nbytes, lambda: softmax(splits), "copy_gbs"),
            "torch_gbs": (2 * nbytes, lambda: torch.softmax(x, dim=1), "copy_gbs"),
        }
        for key, (moved, fn, ceiling) in timed.items():
            row[key] = bench.gbs(moved, bench.time_us(fn))
            row[key.replace("_gbs", "_ceiling")] = row[key] / row[ceiling]
        best = max(row["stats_gbs"], row["stats_split_gbs"])
        row["best_peak"] = best / peak if peak else None
        table.add(row)
        del x, out
        torch.cuda.empty_cache()

    notes = [
        "fp16 inputs, values 4 * randn. stats GB/s counts M * N * 2 bytes read; online_softmax and "
        "torch.softmax GB/s count 2 * M * N * 2 bytes (x read once, p written once), the least any "
        "softmax moves. online_softmax reads x a second time, which that count leaves out.",
        "read ceiling: `x.sum()` over an fp16 buffer of x's size; copy ceiling: `dst.copy_(src)` of x's "
        "size, counted as read + write; both measured in this run.",
        "split: the row is cut into `splits` programs (enough for about four per SM), their partial "
        "(m, l) states merged by a tree of log2(splits) merge_stats launches, included in the time.",
        "best T4 / datasheet: the faster softmax_stats column over the GPU's datasheet bandwidth.",
    ]
    return table, notes


def plot(rows, meta, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (
            "statistics (read ceiling)",
            [
                ("stats_ceiling", "softmax_stats, 1 split"),
                ("stats_split_ceiling", "softmax_stats, split"),
                ("lse_ceiling", "torch.logsumexp"),
            ],
        ),
        (
            "softmax (copy ceiling)",
            [
                ("softmax_ceiling", "online_softmax, 1 split"),
                ("softmax_split_ceiling", "online_softmax, split"),
                ("torch_ceiling", "torch.softmax"),
            ],
        ),
    ]
    labels = [f"{r['M']} x {r['N']}\nsplits={r['splits']}" for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, (title, series) in zip(axes, panels):
        width = 0.8 / len(series)
        for i, (key, name) in enumerate(series):
            ax.bar(
                [x + i * width for x in range(len(rows))],
                [r.get(key) or 0.0 for r in rows],
                width,
                label=name,
            )
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.set_xticks([x + width for x in range(len(rows))], labels)
        ax.set_title(title)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("fraction of the same-run ceiling")
    fig.suptitle(f"Online softmax, fp16, {meta['gpu']}, {meta['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def headline(impl) -> tuple[float, str, str]:
    """make progress on a GPU: online_softmax's GB/s (x read, p written) on the table's first shape, one
    split, through the public function, checked first."""
    M, N = SHAPES[0]
    x = torch.randn(M, N, device="cuda", dtype=torch.float16) * 4  # [M, N]
    out = torch.empty_like(x)
    assert_close(impl.online_softmax(x)[::64], torch.softmax(x[::64].float(), dim=1))  # every 64th row
    us = bench.time_us(lambda: impl.online_softmax(x, out=out))
    return bench.gbs(2 * x.numel() * x.element_size(), us), "GB/s", f"online_softmax {M} x {N}, fp16"


# --- The figures the explainer's sentences quote (bench.FIGURES); data is t4_online_softmax.bench.json


def _at(data, M: int) -> dict:
    return next(r for r in data["rows"] if r["M"] == M)


def _f(M: int, key: str):
    return lambda d: bench.num(_at(d, M)[key])


def _pair(key: str, sep: str = " and "):
    """The two many-row shapes, (4096, 32768) then (16384, 8192)."""
    return lambda d: f"{bench.num(_at(d, 4096)[key])}{sep}{bench.num(_at(d, 16384)[key])}"


def _same(key: str):
    """One value when both many-row shapes round to it, else both."""

    def figure(data) -> str:
        a, b = (bench.num(_at(data, M)[key]) for M in (4096, 16384))
        return a if a == b else f"{a} and {b}"

    return figure


FIGURES = {
    "torch_8192": _f(16384, "torch_gbs"),
    "online_8192": _f(16384, "softmax_gbs"),
    "stats_many": _same("stats_ceiling"),
    "stats_gbs": _pair("stats_gbs"),
    "lse_many": _pair("lse_ceiling"),
    "online_many": _pair("softmax_ceiling"),
    "torch_8192_ceiling": _f(16384, "torch_ceiling"),
    "torch_32768_ceiling": _f(4096, "torch_ceiling"),
    "online_32768_ceiling": _f(4096, "softmax_ceiling"),
    "online_16384_ceiling": _f(16384, "softmax_ceiling"),
    "long_stats_gbs": _f(64, "stats_gbs"),
    "long_stats_ceiling": _f(64, "stats_ceiling"),
    "long_split_gbs": _f(64, "stats_split_gbs"),
    "long_split_ceiling": _f(64, "stats_split_ceiling"),
    "long_online_gbs": _f(64, "softmax_gbs"),
    "long_online_ceiling": _f(64, "softmax_ceiling"),
    "long_online_split_gbs": _f(64, "softmax_split_gbs"),
    "long_online_split_ceiling": _f(64, "softmax_split_ceiling"),
    "long_torch_gbs": _f(64, "torch_gbs"),
}
