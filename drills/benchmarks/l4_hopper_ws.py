"""Does Triton's Hopper warp specialisation help T5 or L4? Measured, not quoted: L4's explainer
(section 4) renders its sentences on it from drills/content/l4_paged_prefill.hopper_ws.json.

Since 3.4 (triton-lang/triton PR #7136), Triton's sm_90 pipeline runs a warp-specialisation pass on loops marked
`tl.range(..., warp_specialize=True)`, meant for loops whose loads go through tensor descriptors
(`tl.make_tensor_descriptor`). This script times each loop at fixed tiles with and without the flag,
and records whether the compiled TTGIR holds a `ttg.warp_specialize` op (the pass applied), a loop
compiled as without the flag, or the error the compiler or the output check gave:

  t5     T5's non-causal forward over contiguous K and V: pointer loads (the course's T5 kernel, and
         the same loop with K loaded as V is) against tensor-descriptor loads.
  paged  L4's fully visible key tiles (every key visible to every row, the loop L4 runs before its
         masked tiles) over a paged cache: L4's per-key gather through the block table against one
         descriptor load per page, a [PAGE, D] box at the page's row (PAGE = BLOCK_N, so a tile is one
         page), the block id read once per tile. PAGE 16 is also tried with 4 warps and 128 x 64 tiles,
         the tile that was fastest at PAGE 64.
  control  the positive control: the upstream attention tutorial's own warp-specialised forward
         (python/tutorials/06-fused-attention.py of the installed Triton's tag, non-causal; on
         sm_90 it passes host tensor descriptors without the flag and builds them on the device with
         it, its own choice for Hopper), imported from the file TRITON_ATTENTION_TUTORIAL names (default
         .whl/06-fused-attention.py; rows say "absent" without it), with warp_specialize False and
         True, on T5's shape with K and V repeated to every query head (the tutorial has no GQA); and
         T5's loop in the tutorial's Hopper configuration (host descriptors, 128 x 64, 4 warps, 3
         stages), with and without the flag. If the tutorial's kernel warp-specialises and is right
         here, the failures of the other loops are theirs; if it fails too, the pass is.

Every output is checked against SDPA in fp32 before it is timed. Run on a CUDA GPU (sm_90 for the
question to mean anything): `python -m drills.benchmarks.l4_hopper_ws OUT.json [PART ...]` (parts
control, t5, paged; all three when none is named), a few minutes per part on an H200. Parts named run
and replace their keys in OUT.json, and the other parts' keys already there are kept, so each part can
run under its own time limit. It is not a lesson's benchmark (drills/benchmarks/<stem>.py): `make bench`
does not run it.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import torch
import triton
import triton.language as tl

from drills.bench import stamp, tflops, time_us

HQ, HKV, D = 32, 8, 128


@triton.jit
def _softmax_step(acc, l_i, m_i, q, k, v, qk_scale):
    s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N]
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.math.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_new


@triton.jit
def t5_kernel(
    q_ptr,  # [B, Hq, N, D] contiguous
    k_ptr,  # [B, Hkv, N, D] contiguous
    v_ptr,
    o_ptr,  # [B, Hq, N, D]
    qk_scale,
    N,
    q_rows,  # B * Hq * N
    kv_rows,  # B * Hkv * N
    HQ: tl.constexpr,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DESC: tl.constexpr,  # 0 pointer loads, 1 tl.make_tensor_descriptor, 2 descriptors made on the host
    WS: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // HQ
    kvh = (pid_bh % HQ) // GROUP
    q_row = pid_bh * N + pid_m * BLOCK_M
    kv_row = (b * (HQ // GROUP) + kvh) * N
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    if DESC == 2:  # the upstream tutorial's way: TensorDescriptor objects in place of q, k, v
        dq, dk, dv = q_ptr, k_ptr, v_ptr
        q = dq.load([q_row, 0])
    elif DESC == 1:
        dq = tl.make_tensor_descriptor(q_ptr, [q_rows, D], [D, 1], [BLOCK_M, D])
        dk = tl.make_tensor_descriptor(k_ptr, [kv_rows, D], [D, 1], [BLOCK_N, D])
        dv = tl.make_tensor_descriptor(v_ptr, [kv_rows, D], [D, 1], [BLOCK_N, D])
        q = dq.load([q_row, 0])
    else:
        q = tl.load(q_ptr + (q_row + offs_m)[:, None].to(tl.int64) * D + offs_d[None, :])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in tl.range(0, N, BLOCK_N, warp_specialize=WS):
        if DESC:
            k = dk.load([kv_row + start_n, 0])
            v = dv.load([kv_row + start_n, 0])
        else:
            rows = (kv_row + start_n + offs_n)[:, None].to(tl.int64) * D + offs_d[None, :]
            k = tl.load(k_ptr + rows)
            v = tl.load(v_ptr + rows)
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, q, k, v, qk_scale)
    out = acc / l_i[:, None]
    tl.store(
        o_ptr + (q_row + offs_m)[:, None].to(tl.int64) * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty)
    )


@triton.jit
def paged_kernel(
    q_ptr,  # [B * Nq, Hq, D] packed new tokens
    k_cache,  # [num_blocks, PAGE, Hkv, D] contiguous
    v_cache,
    table_ptr,  # [B, pages per sequence] int32
    o_ptr,  # [B * Nq, Hq, D]
    qk_scale,
    Nq,
    ctx,  # keys per sequence, a multiple of BLOCK_N; every key visible to every row
    cache_rows,  # num_blocks * PAGE
    pages_per_seq,
    HQ: tl.constexpr,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DESC: tl.constexpr,
    WS: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    kvh = h // GROUP
    HKV: tl.constexpr = HQ // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q_rows = (b * Nq + offs_m).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * (HQ * D) + h * D + offs_d[None, :])
    table = table_ptr + b * pages_per_seq
    if DESC:
        dk = tl.make_tensor_descriptor(k_cache, [cache_rows, HKV * D], [HKV * D, 1], [PAGE, D])
        dv = tl.make_tensor_descriptor(v_cache, [cache_rows, HKV * D], [HKV * D, 1], [PAGE, D])
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for start_n in tl.range(0, ctx, BLOCK_N, warp_specialize=WS):
        if DESC:  # PAGE == BLOCK_N: the tile is one page, one [PAGE, D] box at its row
            phys = tl.load(table + start_n // PAGE)
            k = dk.load([phys * PAGE, kvh * D])
            v = dv.load([phys * PAGE, kvh * D])
        else:  # L4's gather: one block id per key (section 3.3)
            cols = start_n + offs_n
            phys_n = tl.load(table + cols // PAGE)
            off = (phys_n * PAGE + cols % PAGE).to(tl.int64) * (HKV * D) + kvh * D
            k = tl.load(k_cache + off[:, None] + offs_d[None, :])
            v = tl.load(v_cache + off[:, None] + offs_d[None, :])
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, q, k, v, qk_scale)
    out = acc / l_i[:, None]
    tl.store(o_ptr + q_rows[:, None] * (HQ * D) + h * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty))


def _ws_applied(compiled) -> dict:
    ttgir = compiled.asm.get("ttgir", "")
    total = re.search(r'"ttg.total-num-warps" = (\d+)', ttgir)
    return {
        "warp_specialized": "ttg.warp_specialize" in ttgir,
        "total_warps": int(total.group(1)) if total else None,
        "regs": getattr(compiled, "n_regs", None),
        "spills": getattr(compiled, "n_spills", None),
    }


def _variant(name, config, ws, launch, check, flops):
    row = {"variant": name, "config": config, "warp_specialize": ws}
    try:
        compiled = launch()
        torch.cuda.synchronize()
        row["max_err"] = check()
        if hasattr(compiled, "asm"):  # the course's T5 launcher returns its output instead
            row.update(_ws_applied(compiled))
        if not row["max_err"] <= 2e-2:  # NaN is wrong too
            row["error"] = "wrong output"
        else:
            us = time_us(launch)
            row["us"], row["tflops"] = us, tflops(flops, us)
    except Exception as exc:  # a config the compiler refuses is a result too
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    print(json.dumps(row), flush=True)
    return row


CONFIGS = [(128, 128, 8, 3), (128, 64, 8, 3), (128, 128, 4, 2), (128, 128, 4, 3), (128, 64, 4, 3)]
LOADS = {0: "pointer loads", 1: "tensor descriptors (in the kernel)", 2: "tensor descriptors (host)"}


def _fp32_ref(q, k, v, scale):
    """SDPA in fp32 on [B, H, N, D] views: the answer every variant is checked against."""
    return torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), scale=scale, enable_gqa=True
    )


def t5_variants():
    """T5's non-causal forward, contiguous K and V: (shape, [(name, config, ws, launch, check, flops)])."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from drills.solutions import t5_flash_attention as t5

    B, N = 4, 4096
    torch.manual_seed(0)
    q = torch.randn(B, HQ, N, D, device="cuda", dtype=torch.float16)
    k = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    scale = 1 / math.sqrt(D)
    ref = _fp32_ref(q, k, v, scale)
    out = torch.empty_like(q)
    flops = 4.0 * B * HQ * N * N * D

    def check():
        return (out.float() - ref).abs().max().item()

    found = [("t5 course kernel (K^T by pointers)", list(t5._config(D)), False,
              lambda: t5._launch(q, k, v, False, scale, out), check, flops)]  # fmt: skip
    for bm, bn, warps, stages in CONFIGS:
        for desc in (0, 1, 2):
            if desc == 2 and warps == 8:
                continue  # the host descriptors only where the pass may apply (one warpgroup)
            for ws in (False, True):

                def launch(bm=bm, bn=bn, warps=warps, stages=stages, desc=desc, ws=ws):
                    args = (q, k, v)
                    if desc == 2:
                        args = (TensorDescriptor.from_tensor(q.view(-1, D), [bm, D]),
                                TensorDescriptor.from_tensor(k.view(-1, D), [bn, D]),
                                TensorDescriptor.from_tensor(v.view(-1, D), [bn, D]))  # fmt: skip
                    return t5_kernel[(N // bm, B * HQ)](
                        *args, out, scale * 1.4426950408889634, N, B * HQ * N, B * HKV * N,
                        HQ=HQ, GROUP=HQ // HKV, D=D, BLOCK_M=bm, BLOCK_N=bn, DESC=desc, WS=ws,
                        num_warps=warps, num_stages=stages,
                    )  # fmt: skip

                found.append((f"t5 loop, {LOADS[desc]}", [bm, bn, warps, stages], ws, launch, check, flops))
    return {"B": B, "Hq": HQ, "Hkv": HKV, "N": N, "D": D, "causal": False}, found


def paged_variants():
    """L4's fully visible key tiles over a paged cache: (shape, [(name, config, ws, launch, check, flops)])."""
    B, Nq, ctx = 4, 1024, 8192
    torch.manual_seed(0)
    q = torch.randn(B * Nq, HQ, D, device="cuda", dtype=torch.float16)
    out = torch.empty_like(q)
    scale = 1 / math.sqrt(D)
    flops = 4.0 * B * HQ * Nq * ctx * D
    found = []
    for page in (16, 64, 128):  # L4's benchmark page; pages one tile long
        pages = ctx // page
        num_blocks = B * pages + 7
        k_cache = torch.randn(num_blocks, page, HKV, D, device="cuda", dtype=torch.float16)
        v_cache = torch.randn_like(k_cache)
        table = torch.randperm(num_blocks, device="cuda")[: B * pages].view(B, pages).to(torch.int32)
        kg = k_cache[table.long()].reshape(B, ctx, HKV, D).permute(0, 2, 1, 3)
        vg = v_cache[table.long()].reshape(B, ctx, HKV, D).permute(0, 2, 1, 3)
        ref = _fp32_ref(q.view(B, Nq, HQ, D).permute(0, 2, 1, 3), kg, vg, scale)
        ref = ref.permute(0, 2, 1, 3).reshape(B * Nq, HQ, D)
        del kg, vg

        def check(ref=ref):
            return (out.float() - ref).abs().max().item()

        for bm, bn, warps, stages in CONFIGS:
            if (
                page == 16
                and (bm, bn, warps, stages) not in (CONFIGS[0], (128, 64, 4, 3))
                or page > 16
                and page != bn
            ):
                continue  # PAGE 16: L4's own tile, and the 4-warp tile best at PAGE 64; otherwise a tile is one page
            for desc in (False, True) if page == bn else (False,):
                for ws in (False, True):

                    def launch(bm=bm, bn=bn, warps=warps, stages=stages, desc=desc, ws=ws, kc=k_cache,
                               vc=v_cache, table=table, page=page, pages=pages, nb=num_blocks):  # fmt: skip
                        return paged_kernel[(Nq // bm, HQ, B)](
                            q, kc, vc, table, out, scale * 1.4426950408889634, Nq, ctx, nb * page, pages,
                            HQ=HQ, GROUP=HQ // HKV, D=D, PAGE=page, BLOCK_M=bm, BLOCK_N=bn, DESC=desc,
                            WS=ws, num_warps=warps, num_stages=stages,
                        )  # fmt: skip

                    name = f"PAGE {page}, " + (
                        "a descriptor load per page" if desc else "gather per key (L4)"
                    )
                    found.append((name, [bm, bn, warps, stages], ws, launch, check, flops))
    return {"B": B, "new tokens": Nq, "keys (all visible)": ctx, "Hq": HQ, "Hkv": HKV, "D": D}, found


TUTORIAL = Path(os.environ.get("TRITON_ATTENTION_TUTORIAL", ".whl/06-fused-attention.py"))


def _tutorial():
    """The upstream tutorial's module, imported from its file (None when the file is absent). Its top
    level imports pytest for its own tests; a stand-in serves where pytest is not installed."""
    if not TUTORIAL.exists():
        return None
    try:
        import pytest  # noqa: F401
    except ImportError:
        mark = types.SimpleNamespace(parametrize=lambda *a, **k: lambda f: f)
        sys.modules["pytest"] = types.SimpleNamespace(mark=mark)
    spec = importlib.util.spec_from_file_location("triton_attention_tutorial", TUTORIAL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compiled_of(jit) -> list:
    """Every compiled kernel a (possibly autotuned) Triton function holds in its caches: the TTGIR of
    the configs the autotuner tried. Walked loosely, as the cache's layout moves between versions."""
    while hasattr(jit, "fn") and not hasattr(jit, "device_caches"):
        jit = jit.fn  # Autotuner / Heuristics wrap the JITFunction
    found = []
    for entry in getattr(jit, "device_caches", {}).values():
        for part in entry if isinstance(entry, tuple) else (entry,):
            if isinstance(part, dict):
                found += [k for k in part.values() if hasattr(k, "asm")]
    return found


def control_variants():
    """The positive control: (shape, [(name, config, ws, launch, check, flops)])."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    B, N = 4, 4096
    torch.manual_seed(0)
    q = torch.randn(B, HQ, N, D, device="cuda", dtype=torch.float16)
    k = torch.randn(B, HKV, N, D, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    scale = 1 / math.sqrt(D)
    ref = _fp32_ref(q, k, v, scale)
    flops = 4.0 * B * HQ * N * N * D
    out = torch.empty_like(q)
    got = {}

    def check():
        return (got.get("out", out).float() - ref).abs().max().item()

    found = []
    module = _tutorial()
    if module is not None:  # the tutorial has one KV head per query head: [B, Hq, N, D], repeated once here
        kr, vr = (x.repeat_interleave(HQ // HKV, dim=1) for x in (k, v))
    for ws in (False, True):
        name = f"upstream tutorial _attn_fwd ({TUTORIAL.name})"

        def launch(ws=ws):
            if module is None:
                raise FileNotFoundError(f"absent: {TUTORIAL} (set TRITON_ATTENTION_TUTORIAL)")
            got["out"] = module.attention(q, kr, vr, False, scale, ws)
            if ("compiled", ws) not in got:  # the first call only: timed calls stay bare
                torch.cuda.synchronize()
                best = getattr(module._attn_fwd, "best_config", None)
                got["best_config"] = str(best) if best is not None else None
                ttgir = "\n".join(kern.asm.get("ttgir", "") for kern in _compiled_of(module._attn_fwd))
                got["compiled", ws] = types.SimpleNamespace(asm={"ttgir": ttgir}, n_regs=None, n_spills=None)
            return got["compiled", ws]

        found.append((name, ["autotuned"], ws, launch, check, flops))
    for ws in (False, True):  # T5's loop in the tutorial's Hopper tile: host descriptors, 128 x 64, 4 warps

        def launch(ws=ws, bm=128, bn=64):
            got.pop("out", None)
            args = (TensorDescriptor.from_tensor(q.view(-1, D), [bm, D]),
                    TensorDescriptor.from_tensor(k.view(-1, D), [bn, D]),
                    TensorDescriptor.from_tensor(v.view(-1, D), [bn, D]))  # fmt: skip
            return t5_kernel[(N // bm, B * HQ)](
                *args, out, scale * 1.4426950408889634, N, B * HQ * N, B * HKV * N,
                HQ=HQ, GROUP=HQ // HKV, D=D, BLOCK_M=bm, BLOCK_N=bn, DESC=2, WS=ws,
                num_warps=4, num_stages=3,
            )  # fmt: skip

        found.append(("t5 loop, tensor descriptors (host)", [128, 64, 4, 3], ws, launch, check, flops))
    return {"B": B, "Hq": HQ, "Hkv": HKV, "N": N, "D": D, "causal": False}, found


EXPERIMENTS = {"control": control_variants, "t5": t5_variants, "paged": paged_variants}


def _risky(variant) -> bool:
    """One warpgroup with the flag on: where the pass runs, and where it has crashed the process (an
    illegal address poisons the CUDA context), so each of these runs in a process of its own; and the
    tutorial's kernel with the flag, whatever tile its autotuner picks."""
    return variant[2] and (variant[1][2:3] == [4] or variant[1] == ["autotuned"])


def run_part(path: str, part: str, only: int | None = None) -> dict:
    """One experiment's rows; only=i runs variant i alone (in the process of its own that run_part
    starts for each risky variant) and writes them at path."""
    shape, variants = EXPERIMENTS[part]()
    rows = []
    for i, variant in enumerate(variants):
        if (only is None and _risky(variant)) or (only is not None and i != only):
            continue
        row = _variant(*variant)
        row["index"] = i
        if variant[1] == ["autotuned"]:
            row["best_config"] = _last_best_config(variant)
        rows.append(row)
    if only is None:
        for i, variant in enumerate(variants):
            if _risky(variant):
                sub = f"{path}.{part}.{i}"
                try:
                    done = subprocess.run(
                        [sys.executable, "-m", __spec__.name, sub, part, str(i)],
                        # the tutorial's autotuner compiles some 30 tiles before its first timed call
                        timeout=300 if variant[1] == ["autotuned"] else 90,
                    )
                    got = json.load(open(sub))["rows"] if done.returncode == 0 else []
                except (subprocess.TimeoutExpired, OSError, ValueError):
                    got = []
                if not got:
                    got = [{"variant": variant[0], "config": variant[1], "warp_specialize": True,
                            "error": "no result: its process printed none", "index": i}]  # fmt: skip
                rows += got
        rows.sort(key=lambda r: r["index"])
    result = {"shape": shape, "rows": rows}
    if only is not None:
        with open(path, "w") as f:
            json.dump(result, f)
    return result


def _last_best_config(variant) -> str | None:
    """The tile the tutorial's autotuner chose in the call just made (its launch closure keeps it)."""
    cells = variant[4].__closure__ or ()
    for cell in cells:
        if isinstance(cell.cell_contents, dict) and "best_config" in cell.cell_contents:
            return cell.cell_contents["best_config"]
    return None


def main(path: str, parts: list[str] | None = None) -> None:
    """The named experiments (all when None) into one JSON at path: meta, then <part>_shape and <part>
    for each; the keys of parts not named, already in the file, are kept."""
    # In-kernel tensor descriptors live in a global scratch buffer the launch asks for.
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    data = json.load(open(path)) if os.path.exists(path) else {}
    data["meta"] = stamp()
    for part in parts or list(EXPERIMENTS):
        result = run_part(path, part)
        data[f"{part}_shape"], data[part] = result["shape"], result["rows"]
        with open(path, "w") as f:  # after each part: a run stopped later keeps the first
            json.dump(data, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) > 3:  # one risky variant, started by run_part
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        run_part(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    else:
        main(sys.argv[1], sys.argv[2:] or None)
