"""What the engine is configured with, every default written once: a model's shapes and the engine's settings.

LlamaConfig is a decoder's shapes (read from a GGUF file by loader.read_config, or one of the presets
below for random weights). EngineConfig is what LLM and Engine take: the attention path, the
scheduler's limits and the KV cache's size, as nano-vllm's config.py holds them in one Config.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION = ("kernels", "torch")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3")  # None means "auto": the cache in the model's fp16 or bf16


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
    # gpt-oss-style attention (served by L5's unified_attention): per layer None (full causal) or a
    # sliding window w >= 1 (the query at position p sees keys p - w < j <= p); None: no layer has one.
    windows: tuple[int | None, ...] | None = None
    sinks: bool = False  # every layer carries a learned [Hq] float32 sink logit (LayerWeights.sinks)

    def __post_init__(self):
        if not isinstance(self.sinks, bool):
            raise TypeError(f"sinks must be a bool, got {type(self.sinks).__name__} {self.sinks!r}")
        if self.windows is None:
            return
        if not isinstance(self.windows, (tuple, list)) or len(self.windows) != self.num_layers:
            raise ValueError(
                f"windows must be None or one entry per layer ({self.num_layers}), got {self.windows!r}"
            )
        for i, w in enumerate(self.windows):
            if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
                raise ValueError(f"windows[{i}] must be None or an int >= 1, got {w!r}")
        object.__setattr__(self, "windows", tuple(self.windows))  # hashable, as a frozen config is

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s sliding window, None for a full causal layer."""
        return None if self.windows is None else self.windows[layer]

    @property
    def group(self) -> int:
        """Query heads per kv head (3 for SmolLM2-135M: not a power of two)."""
        return self.num_heads // self.num_kv_heads

    @property
    def qkv_rows(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim


def smollm2_135m_config() -> LlamaConfig:
    """SmolLM2-135M-Instruct's shapes, for random weights where the GGUF file is absent (a GPU box).
    tests/test_engine_model.py checks every value against the file's metadata."""
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


def gpt_oss_shaped_config(num_layers: int = 4) -> LlamaConfig:
    """gpt-oss-120b's attention shapes on a dense Llama body: 64 query heads and 8 KV heads of 64, layers
    alternating a 128-token sliding window with full attention (the first one windowed, as gpt-oss), a
    sink logit per head in every layer. What L5 costs end to end beside the Llama-3-8B-shaped model."""
    return LlamaConfig(
        num_layers=num_layers,
        hidden_size=2880,
        num_heads=64,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=2880,
        vocab_size=201088,
        rope_theta=150000.0,
        rms_norm_eps=1e-5,
        max_position=8192,
        tie_word_embeddings=False,
        windows=tuple(128 if i % 2 == 0 else None for i in range(num_layers)),
        sinks=True,
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


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings. LLM(**settings) builds one from keyword arguments; Engine takes one.

    attention               "kernels" (the course's Triton kernels; under the interpreter on a CPU: slow)
                            or "torch" (TorchPagedAttention)
    max_num_seqs            sequences in one step at most (the largest batch a CUDA graph is captured for)
    max_num_batched_tokens  tokens in one step at most: the scheduler's token budget
    chunked_prefill         a prompt longer than the budget left is computed over several steps
    max_model_len           prompt + output tokens of a request at most; None: the model's context
    cuda_graphs             replay decode steps as CUDA graphs; None: on where attention="kernels" runs
                            on a GPU (they need both)
    prompt_graphs           replay steps with prompt tokens that fill max_num_batched_tokens exactly as
                            CUDA graphs too, attention included, one per batch size (graphs.PromptGraphs);
                            None: on wherever cuda_graphs is
    block_size              tokens per KV block (PAGE)
    num_blocks              blocks in the KV pool; None: LLM sizes it (40% of the free GPU memory,
                            capped at what max_num_seqs full-length sequences need; on a CPU one
                            sequence of max_model_len: a chat is one sequence)
    prefix_caching          reuse the blocks of earlier prompts with the same beginning (L3)
    cascade                 a decode step whose sequences share their first pages reads them once (F2's
                            cascade_decode), where F2's planner finds it pays; such a step runs eagerly,
                            without its CUDA graph, which costs more than it saves on the C1 benchmark
                            (c1_engine.md, section 6), so it is off unless asked for
    overlap                 the host schedules and prepares step n+1 while the GPU runs step n: every
                            step samples on the device and leaves its tokens there for the next step to
                            read; a request its real token stops ran one step too many, whose token is
                            dropped (engine.py, Engine.step); None: on wherever CUDA graphs are
    device_inputs           a decode step's inputs built on the device from block-table rows kept there
                            between steps, only new block ids sent (batch.DeviceBatch); the other steps
                            are built by C1's prepare_inputs, which also brings the rows up to date.
                            Off unless asked for (None: off) until a benchmark run shows it pays
    fused_kernels           the forward's RMSNorm + residual add, RoPE and SiLU-and-mul as fused Triton
                            kernels (fused.py); None: on where attention="kernels" runs on a GPU (under
                            the interpreter they would cost more than the torch ops they replace)
    fused_store             with fused kernels and attention="kernels": the RoPE kernel also writes each
                            token's rotated K and its V into the cache (fused.rope_store_), one launch a
                            layer fewer, in place of L1's store_kvcache, which then is not called; None: on
                            wherever both are; False runs L1's store (yours, where it passes)
    kv_cache_dtype          "auto" or None: the cache in the model's fp16 or bf16; "fp8_e4m3": K and V
                            stored as e4m3, one byte each (F3's store_kvcache_fp8 and fp8_decode; L4
                            reads the step's pages dequantized, fp8.dequantize_pages), so a memory
                            budget holds twice the blocks. Every scale is 1.0 (fp8.FP8Cache says why).
                            Not with fused_store (its kernel stores fp16 or bf16) nor cascade (F2 reads
                            fp16 or bf16): fused_store's None turns it off; asking for either raises
    """

    attention: str = "kernels"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    chunked_prefill: bool = True
    max_model_len: int | None = None
    cuda_graphs: bool | None = None
    block_size: int = 16
    num_blocks: int | None = None
    prefix_caching: bool = True
    cascade: bool = False
    fused_kernels: bool | None = None
    overlap: bool | None = None
    fused_store: bool | None = None
    prompt_graphs: bool | None = None
    device_inputs: bool | None = None
    kv_cache_dtype: str | None = None

    def __post_init__(self):
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")
        if self.kv_cache_dtype is not None and (
            not isinstance(self.kv_cache_dtype, str) or self.kv_cache_dtype not in KV_CACHE_DTYPES
        ):
            raise ValueError(
                f"kv_cache_dtype must be None or one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}"
            )
        if self.cascade and self.fp8_cache:
            raise ValueError(
                "cascade runs F2's decode, which reads fp16 or bf16: not with kv_cache_dtype='fp8_e4m3'"
            )

    @property
    def fp8_cache(self) -> bool:
        """Whether K and V are stored as e4m3 (kv_cache_dtype="fp8_e4m3")."""
        return self.kv_cache_dtype == "fp8_e4m3"

    def model_len(self, model: LlamaConfig) -> int:
        """The longest request in tokens: max_model_len, never past the context the model was trained for."""
        return min(self.max_model_len or model.max_position, model.max_position)

    def graphs_on(self, device) -> bool:
        """Whether decode steps replay as CUDA graphs on `device` (a torch.device)."""
        if self.cuda_graphs is None:
            return self.attention == "kernels" and device.type == "cuda"
        if self.cuda_graphs and (self.attention != "kernels" or device.type != "cuda"):
            raise ValueError("cuda_graphs needs attention='kernels' on a CUDA device")
        return self.cuda_graphs

    def prompt_graphs_on(self, device) -> bool:
        """Whether steps with prompt tokens that fill the token budget replay as CUDA graphs on `device`."""
        if self.prompt_graphs is None:
            return self.graphs_on(device)
        if self.prompt_graphs and not self.graphs_on(device):
            raise ValueError("prompt_graphs needs cuda_graphs: attention='kernels' on a CUDA device")
        return bool(self.prompt_graphs)

    def fused_on(self, device) -> bool:
        """Whether the forward runs fused.py's kernels on `device` (a torch.device)."""
        if self.fused_kernels is None:
            return self.attention == "kernels" and device.type == "cuda"
        return bool(self.fused_kernels)

    def fused_store_on(self, device) -> bool:
        """Whether the fused RoPE kernel stores K and V itself, so that L1's store_kvcache is not called."""
        on = self.attention == "kernels" and self.fused_on(device)
        if self.fused_store and self.fp8_cache:
            raise ValueError("fused_store stores fp16 or bf16: not with kv_cache_dtype='fp8_e4m3'")
        if self.fused_store is None:
            return on and not self.fp8_cache
        if self.fused_store and not on:
            raise ValueError("fused_store needs attention='kernels' and the fused kernels (fused_kernels)")
        return bool(self.fused_store)

    def device_inputs_on(self, device) -> bool:
        """Whether steady decode steps build their inputs on the device (batch.DeviceBatch)."""
        return bool(self.device_inputs)

    def overlap_on(self, device) -> bool:
        """Whether the step loop overlaps the host's next step with the device's current one."""
        if self.overlap is None:
            return self.graphs_on(device)
        return bool(self.overlap)
