"""The engine's attention callbacks: the paged KV cache and the two ways to attend over it.

forward() in model.py calls attention(layer, q, k, v, meta) once per layer, meta being the step's
StepInputs (C1's prepare_inputs): slot_mapping, cu_seqlens_q, context_lens, block_tables.

KernelAttention       the course's kernels: L1 store_kvcache (or, with fused_store, the fused RoPE kernel's
                      store, see rope_store), then L4 paged_prefill for a step with any
                      prompt tokens, F1 split_kv_decode (planned once per step) for a pure decode step,
                      or F2 cascade_decode for a decode step whose sequences share their first pages;
                      a layer with a sliding window or sinks (gpt-oss) runs L5 unified_attention for
                      every step instead, its decode steps planned once per step as F1's
TorchPagedAttention   the same cache and the same inputs in plain torch (fp32 math): the fast path on a
                      CPU, and a second opinion on the kernels. It reads the cache only through the block
                      tables and stores only through the slots, so a wrong input breaks it as it breaks them.
"""

from __future__ import annotations

import math

import torch

from drills.engine.oracle import causal_attention


class PagedKVCache:
    """K and V of every layer: [num_layers, num_blocks, PAGE, Hkv, D] each, one pool shared by all
    sequences (L1's layout, one layer being k[layer])."""

    def __init__(self, config, num_blocks: int, block_size: int, dtype=torch.float16, device="cpu"):
        shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks = num_blocks
        self.block_size = block_size

    @staticmethod
    def bytes_per_block(config, block_size: int, dtype) -> int:
        elt = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * elt

    @property
    def dtype(self):
        return self.k.dtype


class KernelAttention:
    """Attention through the course's kernels (yours where they pass their graders, see sources.py).

    The kernels take fp16 or bf16: q, k and v are cast to the cache's dtype and the output back to q's.
    Call begin_step(inputs) once per step before the forward: a decode step's F1 plan reads the
    lengths on the host there, once, rather than once per layer.
    """

    def __init__(
        self,
        cache: PagedKVCache,
        kernels,
        num_q_heads: int | None = None,
        fused_store: bool = False,
        windows=None,
        sinks=None,
    ):
        """windows, sinks: per layer, the window (None: full) and the (Hq,) float32 sinks (None: none),
        as model.attention_features gives them; a layer with either runs L5, the others L4, F1, F2."""
        self.cache = cache
        self.kernels = kernels
        self.num_q_heads = num_q_heads  # Hq, which F2's plan needs (its prefix tiles hold query heads)
        # The fused forward calls rope_store() before each layer's attention: RoPE and the K/V store in
        # one kernel (fused.rope_store_), in place of L1's store_kvcache.
        if fused_store and num_q_heads is None:
            raise ValueError("fused_store needs num_q_heads: the kernel finds k's heads after q's")
        self.fused_store = fused_store
        self._stored = None  # the layer whose K and V rope_store() has just written
        self.plan = None
        self.cascade = None  # (F2's plan, prefix_group [B] int32, prefix_lens [G] int32) for this step
        layers = cache.k.shape[0]
        self.windows = list(windows) if windows is not None else [None] * layers
        self.sinks = list(sinks) if sinks is not None else [None] * layers
        self.unified = [w is not None or s is not None for w, s in zip(self.windows, self.sinks)]
        # The first such layer of a forward makes the decode rows' inputs for the others (see _unified).
        self._first_unified = next((i for i, on in enumerate(self.unified) if on), None)
        self.unified_plans = {}  # window -> L5's plan for this decode step (None for other steps)
        self._decode_rows = None  # (cu_seqlens_q, context_lens) of this decode step as L5 reads them
        self._aranges = {}  # B -> [B + 1] int32 0 .. B, kept: a captured CUDA graph reads its address

    def cascade_plan(self, context_lens: list[int], groups: list[int], prefix_lens: list[int]):
        """F2's plan for a decode step with these shared prefixes (engine._shared_prefixes), or None
        where its planner finds that reading each prefix once does not pay (F1 serves the step)."""
        if self.num_q_heads is None or not prefix_lens:
            return None
        cplan = self.kernels.cascade_plan(
            context_lens,
            groups,
            prefix_lens,
            self.num_q_heads,
            self.cache.k.shape[3],
            self.cache.block_size,
            device=self.cache.k.device,
        )
        return cplan if cplan.cascade else None

    def begin_step(self, inputs, plan_len: int | None = None, cascade=None):
        """plan_len: plan for this length instead of the step's longest (a CUDA graph is captured once
        for the longest context it will replay). cascade: (cascade_plan's plan, groups, prefix_lens)
        for a decode step F2 serves."""
        self.cascade = None
        self._decode_rows = None
        self.unified_plans = {}
        if inputs.is_decode and any(self.unified):
            lens = (
                inputs.context_lens_list if plan_len is None else [plan_len] * len(inputs.context_lens_list)
            )
            cu = list(range(len(lens) + 1))  # one new token per row
            for w in {w for w, on in zip(self.windows, self.unified) if on}:
                self.unified_plans[w] = self.kernels.unified_plan(
                    cu, lens, self.cache.k.shape[3], self.cache.block_size, window=w
                )
        if inputs.is_decode and cascade is not None:
            cplan, groups, prefix_lens = cascade
            device = self.cache.k.device
            self.cascade = (
                cplan,
                torch.tensor(groups, dtype=torch.int32).to(device, non_blocking=True),
                torch.tensor(prefix_lens, dtype=torch.int32).to(device, non_blocking=True),
            )
            self.plan = None
        elif inputs.is_decode:
            lens = (
                inputs.context_lens_list if plan_len is None else [plan_len] * len(inputs.context_lens_list)
            )
            self.plan = self.kernels.plan(lens, self.cache.k.shape[3], self.cache.block_size)
        else:
            self.plan = None

    def rope_store(self, layer, qkv, positions, cos, sin, meta) -> None:
        """RoPE on q's and k's heads of qkv (T, (Hq + 2 Hkv) D), in place, and the rotated K and V into
        `layer`'s cache at meta.slot_mapping: one launch; the next call for this layer only attends."""
        from drills.engine import fused

        kc, vc = self.cache.k[layer], self.cache.v[layer]  # [num_blocks, PAGE, Hkv, D]
        fused.rope_store_(qkv, positions, cos, sin, self.num_q_heads, kc, vc, meta.slot_mapping)
        self._stored = layer

    def __call__(self, layer, q, k, v, meta):
        # q (T, Hq, D), k, v (T, Hkv, D) -> (T, Hq, D)
        kc, vc = self.cache.k[layer], self.cache.v[layer]  # [num_blocks, PAGE, Hkv, D]
        dtype = kc.dtype
        if self._stored != layer:
            # False: the engine built the slots itself (prepare_inputs); a check would read them back
            # from the device once per layer and forbid CUDA-graph capture.
            self.kernels.store_kvcache(k.to(dtype), v.to(dtype), kc, vc, meta.slot_mapping, check=False)
        self._stored = None
        if self.unified[layer]:
            out = self._unified(layer, q.to(dtype), kc, vc, meta)
        elif meta.is_decode and self.cascade is not None:
            cplan, groups, prefix_lens = self.cascade
            out = self.kernels.cascade_decode(
                q.to(dtype),
                kc,
                vc,
                meta.block_tables,
                meta.context_lens,
                groups,
                prefix_lens,
                check=False,
                plan=cplan,
            )
        elif meta.is_decode:
            if self.plan is None:
                raise RuntimeError("KernelAttention.begin_step(inputs) was not called for this step")
            out = self.kernels.split_kv_decode(
                q.to(dtype), kc, vc, meta.block_tables, meta.context_lens, plan=self.plan, check=False
            )
        else:
            out = self.kernels.paged_prefill(
                q.to(dtype), kc, vc, meta.block_tables, meta.cu_seqlens_q, meta.context_lens, check=False
            )
        return out.to(q.dtype)

    def _unified(self, layer, q, kc, vc, meta):
        """L5 for a layer with a window or sinks: a decode step's rows as one token each, planned in
        begin_step; any other step as L4 would run it (no plan: one program per query tile)."""
        window, sinks = self.windows[layer], self.sinks[layer]
        if not meta.is_decode:
            return self.kernels.unified_attention(
                q, kc, vc, meta.block_tables, meta.cu_seqlens_q, meta.context_lens,
                window=window, sinks=sinks, check=False,
            )  # fmt: skip
        if window not in self.unified_plans:
            raise RuntimeError("KernelAttention.begin_step(inputs) was not called for this step")
        if self._decode_rows is None or layer == self._first_unified:
            # Made once per forward, by its first such layer, whatever an earlier run left: a CUDA graph
            # is captured after a warm-up run of the same forward, and a tensor that run made would be
            # read by every replay as a constant (the warm-up's lengths, in memory since freed), where
            # the clamp must be a kernel of the graph, run on each replay's lengths.
            # Padding rows of a CUDA graph's batch are one token over context length 0, which L5's guard
            # refuses (a row needs its own key): they read key 0 of block 0 instead (their table row is
            # zeros, a block that exists) and their output is never sampled.
            B = q.shape[0]
            if B not in self._aranges:
                self._aranges[B] = torch.arange(B + 1, dtype=torch.int32, device=q.device)
            self._decode_rows = (self._aranges[B], meta.context_lens.clamp(min=1))
        cu, ctx = self._decode_rows
        return self.kernels.unified_attention(
            q, kc, vc, meta.block_tables, cu, ctx,
            window=window, sinks=sinks, check=False, plan=self.unified_plans[window],
        )  # fmt: skip


class TorchPagedAttention:
    """The same paged cache in plain torch: scatter the new K and V to their slots, then each sequence
    gathers its pages through its block table and attends causally (bottom-right aligned) in fp32."""

    def __init__(self, cache: PagedKVCache, windows=None, sinks=None):
        """windows, sinks: per layer, as KernelAttention's."""
        self.cache = cache
        self.windows = list(windows) if windows is not None else [None] * cache.k.shape[0]
        self.sinks = list(sinks) if sinks is not None else [None] * cache.k.shape[0]

    def begin_step(self, inputs, plan_len: int | None = None, cascade=None):
        pass

    def __call__(self, layer, q, k, v, meta):
        kc, vc = self.cache.k[layer], self.cache.v[layer]  # [num_blocks, PAGE, Hkv, D]
        page = self.cache.block_size
        flat_k = kc.view(-1, *kc.shape[2:])  # [num_blocks * PAGE, Hkv, D]: slot s is row s
        flat_v = vc.view(-1, *vc.shape[2:])
        real = meta.slot_mapping >= 0  # padding rows store nothing
        flat_k[meta.slot_mapping[real]] = k[real].to(kc.dtype)
        flat_v[meta.slot_mapping[real]] = v[real].to(vc.dtype)

        scale = 1.0 / math.sqrt(q.shape[-1])  # q (T, Hq, D)
        out = torch.zeros_like(q)
        start = 0
        for b, (n, ctx) in enumerate(zip(meta.query_lens, meta.context_lens_list)):
            if n == 0 or ctx == 0:
                start += n
                continue  # padding: nothing to attend, output stays 0
            pages = meta.block_tables[b, : -(-ctx // page)].long()  # the pages holding keys 0 .. ctx-1
            slots = (pages[:, None] * page + torch.arange(page, device=q.device)[None, :]).flatten()[:ctx]
            # (ctx, Hkv, D) each, gathered through the table; then the same math as the reference's
            out[start : start + n] = causal_attention(
                q[start : start + n],
                flat_k[slots],
                flat_v[slots],
                scale,
                self.windows[layer],
                self.sinks[layer],
            )
            start += n
        return out
