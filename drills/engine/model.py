"""The model: a Llama's weights and its forward over a packed batch, attention left to the caller.

An engine step runs `forward(model, input_ids, positions, attention, meta, logits_rows)`:

    input_ids (T,)  the new tokens of every scheduled sequence, packed one sequence after another
    positions (T,)  each token's position in its own sequence (a decode row: its context length - 1)
    attention(layer, q, k, v, meta) -> o  stores k, v in its cache and attends q over each sequence's
                    whole history; meta is whatever the engine passes (slot mapping, block tables, ...)
    logits_rows (R,) the rows that sample a token (the last new token of each sequence)

Everything except attention is plain torch here, so the engine's lesson stays about the engine. The
weights come from loader.load_gguf (the real model) or from `random_weights(config, stream)`, of the
same shapes, for tests and GPU benchmarks, where the 98 MB file cannot travel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from drills.engine.config import LlamaConfig

# ---------------------------------------------------------------------------------------------------
# The weights


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # (H,)
    # q, k and v rows stacked, so one GEMM projects all three: a decode step is launch-bound at small batch.
    wqkv: torch.Tensor  # ((Hq + 2 Hkv) D, H), q and k rows in the half-split RoPE layout of transformers
    wo: torch.Tensor  # (H, Hq D)
    mlp_norm: torch.Tensor  # (H,)
    w_gate_up: torch.Tensor  # (2 I, H): gate rows then up rows, one GEMM for the same reason
    w_down: torch.Tensor  # (H, I)
    # (Hq,) float32 sink logits where config.sinks (gpt-oss): head h's softmax denominator gains
    # exp(sinks[h]). Kept in float32 whatever the model's dtype, as L5 reads them.
    sinks: torch.Tensor | None = None


@dataclass
class LlamaWeights:
    config: LlamaConfig
    embed: torch.Tensor  # (V, H)
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # (H,)
    lm_head: torch.Tensor  # (V, H); the very tensor `embed` when config.tie_word_embeddings

    def to(self, device=None, dtype=None) -> LlamaWeights:
        """A copy on `device` in `dtype`; a tied lm_head stays one tensor with the embedding."""

        def move(t):
            return t.to(device=device, dtype=dtype)

        def move_layer(layer):
            moved = {k: move(v) for k, v in vars(layer).items() if k != "sinks"}
            sinks = None if layer.sinks is None else layer.sinks.to(device=device, dtype=torch.float32)
            return LayerWeights(**moved, sinks=sinks)

        embed = move(self.embed)
        return LlamaWeights(
            config=self.config,
            embed=embed,
            layers=[move_layer(layer) for layer in self.layers],
            final_norm=move(self.final_norm),
            lm_head=embed if self.config.tie_word_embeddings else move(self.lm_head),
        )


def random_weights(config: LlamaConfig, stream: int, dtype=torch.float32, device="cpu") -> LlamaWeights:
    """Weights of `config`'s shapes drawn from N(0, 0.02^2) (norm weights around 1), for tests and benchmarks.
    Drawn with a generator on `device`: the same stream number gives the same weights on one kind of device."""
    c = config
    g = torch.Generator(device=device).manual_seed(stream)

    def normal(*shape, std=0.02, mean=0.0):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * std + mean).to(dtype)

    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    embed = normal(c.vocab_size, H)
    layers = [
        LayerWeights(
            # Not exactly 1: a forward that forgets to multiply by the norm weight must change the output.
            attn_norm=normal(H, std=0.1, mean=1.0),
            wqkv=normal(c.qkv_rows, H),
            wo=normal(H, c.num_heads * D),
            mlp_norm=normal(H, std=0.1, mean=1.0),
            w_gate_up=normal(2 * I, H),
            w_down=normal(H, I),
            # Sinks of a few units, as gpt-oss's: large enough to take a visible share of each row's
            # softmax, so that an engine that drops them changes the output.
            sinks=normal(c.num_heads, std=1.0).float() if c.sinks else None,
        )
        for _ in range(c.num_layers)
    ]
    final_norm = normal(H, std=0.1, mean=1.0)
    lm_head = embed if c.tie_word_embeddings else normal(c.vocab_size, H)
    return LlamaWeights(config=c, embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)


# ---------------------------------------------------------------------------------------------------
# The forward


@dataclass
class Llama:
    """Weights plus the RoPE table, on one device in one dtype: what forward() needs."""

    weights: LlamaWeights
    rope_cos: torch.Tensor = field(init=False)  # (max_position, D/2) float32
    rope_sin: torch.Tensor = field(init=False)  # (max_position, D/2) float32

    def __post_init__(self):
        c = self.config
        device = self.weights.embed.device
        check_sinks(self.weights)
        # The inverse frequencies theta ** (-2i / D), in fp32 and in the same operations as transformers.
        exponent = torch.arange(0, c.head_dim, 2, dtype=torch.int64, device=device).float() / c.head_dim
        inv_freq = 1.0 / (c.rope_theta**exponent)  # (D/2,)
        # A table indexed by position: no per-step trigonometry, and a gather is CUDA-graph friendly.
        angles = torch.arange(c.max_position, device=device).float()[:, None] * inv_freq[None, :]
        self.rope_cos, self.rope_sin = angles.cos(), angles.sin()

    @property
    def config(self) -> LlamaConfig:
        return self.weights.config

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device


def check_sinks(weights: LlamaWeights) -> None:
    """Every layer holds finite (Hq,) float32 sinks where config.sinks says so, and none where it does not."""
    c = weights.config
    for i, layer in enumerate(weights.layers):
        s = layer.sinks
        if not c.sinks:
            if s is not None:
                raise ValueError(f"layers[{i}].sinks is given but config.sinks is False")
            continue
        if s is None or not isinstance(s, torch.Tensor):
            raise ValueError(
                f"layers[{i}].sinks must be a ({c.num_heads},) float32 tensor: config.sinks is True"
            )
        if s.shape != (c.num_heads,) or s.dtype != torch.float32:
            raise ValueError(
                f"layers[{i}].sinks must be ({c.num_heads},) float32, got {s.dtype} {tuple(s.shape)}"
            )
        if not bool(torch.isfinite(s).all()):
            raise ValueError(f"layers[{i}].sinks must be finite")


def attention_features(model: Llama) -> tuple[list[int | None], list[torch.Tensor | None]]:
    """Per layer: its sliding window (None: full) and its (Hq,) float32 sinks (None: none), on the
    model's device; what the engine's attention serves through L5 where either is set."""
    c = model.config
    windows = [c.window(i) for i in range(c.num_layers)]
    return windows, [layer.sinks for layer in model.weights.layers]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # In fp32 whatever the model dtype, as transformers does: a bf16 mean of squares over 576 values drifts.
    x32 = x.float()  # (T, H)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate dim i with dim i + D/2 of every head (transformers' rotate_half layout)."""
    # x (T, heads, D); cos, sin (T, 1, D/2) in x's dtype
    x1, x2 = x.chunk(2, dim=-1)  # (T, heads, D/2) each
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@torch.inference_mode()
def forward(
    model: Llama,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    attention,
    meta=None,
    logits_rows: torch.Tensor | None = None,
    fused: bool = False,
) -> torch.Tensor:
    """Logits (R, V) for the packed rows `logits_rows` (all T rows when None) of one engine step.

    input_ids (T,) int64, positions (T,) int64; attention(layer, q, k, v, meta) -> (T, Hq, D), with q
    (T, Hq, D) and k, v (T, Hkv, D) already rotated: it must store k and v before it attends, since a
    prefill's queries read the keys of their own step. fused: the same computation through fused.py's
    Triton kernels (9 to 11 launches a layer instead of about 35), which q and k then reach as strided
    views of the QKV GEMM's output.
    """
    if fused:
        return _forward_fused(model, input_ids, positions, attention, meta, logits_rows)
    c, w = model.config, model.weights
    T = input_ids.shape[0]
    Hq, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
    # One gather per step shared by all layers; (T, 1, D/2) broadcasts over heads.
    cos = model.rope_cos[positions].to(model.dtype)[:, None, :]
    sin = model.rope_sin[positions].to(model.dtype)[:, None, :]

    h = F.embedding(input_ids, w.embed)  # (T, H)
    for i, layer in enumerate(w.layers):
        x = rms_norm(h, layer.attn_norm, c.rms_norm_eps)  # (T, H)
        qkv = x @ layer.wqkv.T  # (T, (Hq + 2 Hkv) D)
        q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
        q = apply_rope(q.view(T, Hq, D), cos, sin)  # (T, Hq, D)
        k = apply_rope(k.view(T, Hkv, D), cos, sin)  # (T, Hkv, D)
        v = v.view(T, Hkv, D)  # (T, Hkv, D), a view into qkv: the kernels take row and head strides
        o = attention(i, q, k, v, meta)  # (T, Hq, D)
        h = h + o.reshape(T, Hq * D) @ layer.wo.T  # (T, H)

        x = rms_norm(h, layer.mlp_norm, c.rms_norm_eps)
        gate, up = (x @ layer.w_gate_up.T).chunk(2, dim=-1)  # (T, I) each
        h = h + (F.silu(gate) * up) @ layer.w_down.T  # (T, H)

    # The norm is per row, so only the rows that sample pay for it and for the (V x H) GEMM.
    if logits_rows is not None:
        h = h[logits_rows]  # (R, H)
    return rms_norm(h, w.final_norm, c.rms_norm_eps) @ w.lm_head.T  # (R, V)


def _forward_fused(model, input_ids, positions, attention, meta, logits_rows):
    """forward() through fused.py: the residual add inside the next RMSNorm, RoPE in place on the QKV
    rows (and, where the attention was built with fused_store, the K/V store in the same kernel), SiLU
    and the multiply in one kernel. The residual stream `h` is updated in place."""
    from drills.engine import fused

    c, w = model.config, model.weights
    T = input_ids.shape[0]
    Hq, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
    eps = c.rms_norm_eps
    store = getattr(attention, "fused_store", False)  # KernelAttention built with fused_store=True
    h = F.embedding(input_ids, w.embed)  # (T, H), the residual stream
    x = fused.rms_norm(h, w.layers[0].attn_norm, eps) if w.layers else h
    for i, layer in enumerate(w.layers):
        qkv = x @ layer.wqkv.T  # (T, (Hq + 2 Hkv) D)
        if store:  # RoPE and the K/V store in one launch; attention() below then only attends
            attention.rope_store(i, qkv, positions, model.rope_cos, model.rope_sin, meta)
        else:
            fused.rope_(qkv, positions, model.rope_cos, model.rope_sin, Hq + Hkv, D)  # q's and k's heads
        q = qkv[:, : Hq * D].view(T, Hq, D)  # views: rows (Hq + 2 Hkv) D apart
        k = qkv[:, Hq * D : (Hq + Hkv) * D].view(T, Hkv, D)
        v = qkv[:, (Hq + Hkv) * D :].view(T, Hkv, D)
        o = attention(i, q, k, v, meta)  # (T, Hq, D)
        x = fused.rms_norm(o.reshape(T, Hq * D) @ layer.wo.T, layer.mlp_norm, eps, residual=h)
        act = fused.silu_mul(x @ layer.w_gate_up.T)  # (T, I)
        after = w.layers[i + 1].attn_norm if i + 1 < len(w.layers) else w.final_norm
        x = fused.rms_norm(act @ layer.w_down.T, after, eps, residual=h)  # the next layer's input
    if not w.layers:
        x = fused.rms_norm(h, w.final_norm, eps)
    if logits_rows is not None:
        x = x[logits_rows]  # (R, H), already through the final norm
    return x @ w.lm_head.T  # (R, V)
