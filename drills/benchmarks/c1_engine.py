"""C1 benchmark: the whole engine serving a batch of chat requests, against Hugging Face transformers.

Requests: 256 chat prompts sharing a 300-token system prompt, each followed by 20 to 200
tokens of its own, 128 output tokens each with ignore_eos (every request generates exactly 128, so the
work is the same for every configuration and peer). Throughput does not depend on the weights' values,
so random weights of SmolLM2-135M-Instruct's shapes stand in for the 98 MB model file (bf16, as the
peer). Rows: this engine with CUDA-graph decode steps on and off, prefix caching on and off, F2's
cascade on and off (also on the same traffic with a 4,096-token shared prompt); transformers
5.24's batched `generate` (SDPA attention, left-padded batches of 64 and of 256, greedy, KV cache on) on
the same token ids and GPU; then a Llama-3-8B-shaped model cut to 4 layers: 5.3x the KV bytes per
token and layer, about 10x the weight bytes per step, where the kernels' bandwidth shows end to end.

Every engine row is checked before it counts: the first 16 tokens of 4 requests, teacher-forced
through the reference forward (drills/engine/oracle.py, contiguous caches), are each among the
reference's 5 likeliest (random weights give near-flat logits, where bf16 may flip an exact argmax). Times are wall-clock from the first request queued to the
last token sampled, after a warm-up run of the same traffic with other token ids (every kernel
specialisation compiled, the graphs captured).
"""

from __future__ import annotations

import time

import torch

from drills import bench

NUM_REQUESTS, SYSTEM_TOKENS, USER_TOKENS, OUTPUT_TOKENS = 256, 300, (20, 200), 128
LONG_SYSTEM_TOKENS, LONG_MODEL_LEN = 4096, 4608  # the second traffic: a long shared prompt

COLUMNS = [
    ("row", "row"),
    ("model", "model"),
    ("config", "configuration"),
    ("c1_tok_s", "output tok/s"),
    ("req_s", "requests/s"),
    ("seconds", "s"),
    ("prefill_tokens", "prefill tokens computed"),
    ("cached_tokens", "prompt tokens from the cache"),
    ("ttft_s", "mean time to first token, s"),
    ("steps", "steps"),
    ("cascade_steps", "steps F2 served"),
    ("vs_hf", "x transformers (best batch)"),
]


def requests(
    vocab: int, stream: int = 0, n: int = NUM_REQUESTS, system_tokens: int = SYSTEM_TOKENS
) -> list[list[int]]:
    """n prompts of token ids: one shared system prompt, then 20-200 tokens of each request's own."""
    g = torch.Generator().manual_seed(stream)
    system = torch.randint(100, vocab, (system_tokens,), generator=g).tolist()
    lens = torch.randint(USER_TOKENS[0], USER_TOKENS[1] + 1, (n,), generator=g).tolist()
    return [system + torch.randint(100, vocab, (k,), generator=g).tolist() for k in lens]


def _params(impl, max_tokens=None):
    return impl.SamplingParams(temperature=0.0, max_tokens=max_tokens or OUTPUT_TOKENS, ignore_eos=True)


def engine_row(impl, weights, prompts, label, model_name, **options) -> dict:
    """Build an LLM with `options`, warm it up on other prompts, then time all of `prompts`."""
    from types import SimpleNamespace

    from drills.engine.llm import LLM

    parts = SimpleNamespace(
        Scheduler=impl.Scheduler,
        Sequence=impl.Sequence,
        SamplingParams=impl.SamplingParams,
        prepare_inputs=impl.prepare_inputs,
    )
    options.setdefault("max_model_len", 2048)
    llm = LLM(weights, use="solutions", parts=parts, quiet=True, **options)
    # The same traffic with every token id shifted (no prefix hits later, the same lengths, so the same
    # steps): Triton compiles a kernel per class of its integer arguments (batch size, table width), and
    # every class the timed run meets is compiled here, not inside the timing.
    vocab = weights.config.vocab_size
    warm = [[100 + (t - 99) % (vocab - 100) for t in p] for p in prompts]
    llm.generate(warm, _params(impl))
    llm.engine.stats = type(llm.engine.stats)()
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = llm.generate(prompts, _params(impl))
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    produced = sum(len(o.token_ids) for o in outs)
    assert produced == len(prompts) * OUTPUT_TOKENS, (
        f"{produced} tokens, expected {len(prompts) * OUTPUT_TOKENS}"
    )
    _check_outputs(llm, prompts[:4], [o.token_ids for o in outs[:4]])
    s = llm.engine.stats
    row = dict(
        row=label,
        model=model_name,
        config=", ".join(f"{k}={v}" for k, v in options.items() if k != "max_model_len") or "defaults",
        c1_tok_s=produced / seconds,
        req_s=len(prompts) / seconds,
        seconds=seconds,
        prefill_tokens=s.prefill_tokens,
        cached_tokens=s.cached_tokens,
        ttft_s=sum(s.first_token_s) / max(1, len(s.first_token_s)),
        graph_steps=s.graph_steps,
        cascade_steps=s.cascade_steps,
        steps=s.steps,
        preemptions=llm.engine.scheduler.num_preemptions,
    )
    del llm
    torch.cuda.empty_cache()
    return row


def _check_outputs(llm, prompts, got, steps=16, top=5):
    """The first requests' tokens against the reference forward (contiguous caches, fp32 attention),
    teacher-forced on the engine's own tokens: each of the first `steps` tokens must be among the
    reference's `top` most likely at its position. Random weights give near-flat logits, where bf16 may
    flip an argmax; a wrong cache, slot or length gives tokens far outside the top few of 49,152."""
    from drills.engine.model import forward
    from drills.engine.oracle import ReferenceAttention, ReferenceMeta

    for prompt, tokens in zip(prompts, got):
        ids = prompt + tokens[:steps]
        attention = ReferenceAttention(llm.model.config)
        meta = ReferenceMeta(seq_ids=[0], query_lens=[len(ids)])
        device = llm.model.device
        logits = forward(
            llm.model,
            torch.tensor(ids, device=device),
            torch.arange(len(ids), device=device),
            attention,
            meta,
            torch.arange(len(prompt) - 1, len(ids) - 1, device=device),
        )  # (steps, V): the logits that chose each engine token
        likely = logits.float().topk(top, dim=-1).indices.tolist()
        misses = [i for i, t in enumerate(tokens[:steps]) if t not in likely[i]]
        assert not misses, f"engine tokens at steps {misses} are not among the reference's top {top}"


def transformers_row(weights, prompts, batch, model_name) -> dict | None:
    """transformers' batched generate on the same prompts (left-padded batches of `batch`), greedy,
    exactly OUTPUT_TOKENS new tokens each; None when transformers is not installed."""
    try:
        import transformers
    except ImportError:
        return None
    c = weights.config
    hf_config = transformers.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rope_theta=c.rope_theta,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position,
        tie_word_embeddings=c.tie_word_embeddings,
        pad_token_id=0,
        eos_token_id=None,
    )
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM._from_config(
            hf_config, attn_implementation="sdpa", dtype=torch.bfloat16
        ).eval()

    def run(chunk):
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in chunk], device="cuda")
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device="cuda")
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=OUTPUT_TOKENS,
            min_new_tokens=OUTPUT_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
        return out.shape[1] - width

    run(prompts[:batch][:8])  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    produced = 0
    for i in range(0, len(prompts), batch):
        produced += run(prompts[i : i + batch]) * len(prompts[i : i + batch])
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del model
    torch.cuda.empty_cache()
    return dict(
        row=f"transformers generate, batch {batch}",
        model=model_name,
        config=f"transformers {transformers.__version__}, sdpa, bf16",
        c1_tok_s=produced / seconds,
        req_s=len(prompts) / seconds,
        seconds=seconds,
    )


def run(impl) -> tuple[bench.Table, list[str]]:
    from drills.engine.config import EngineConfig, llama_8b_shaped_config, smollm2_135m_config
    from drills.engine.model import random_weights

    table = bench.Table(COLUMNS)
    notes = []
    small = random_weights(smollm2_135m_config(), stream=0, dtype=torch.bfloat16, device="cuda")
    prompts = requests(small.config.vocab_size)
    rows = [
        engine_row(impl, small, prompts, "engine", "SmolLM2-135M shapes"),
        engine_row(impl, small, prompts, "engine, no CUDA graphs", "SmolLM2-135M shapes", cuda_graphs=False),
        engine_row(
            impl, small, prompts, "engine, no prefix caching", "SmolLM2-135M shapes", prefix_caching=False
        ),
        engine_row(impl, small, prompts, "engine, cascade", "SmolLM2-135M shapes", cascade=True),
    ]
    # A long shared prompt, where reading it once per step (F2) instead of once per request matters most.
    long_prompts = requests(small.config.vocab_size, system_tokens=LONG_SYSTEM_TOKENS)
    long_rows = [
        engine_row(
            impl,
            small,
            long_prompts,
            f"engine, {LONG_SYSTEM_TOKENS:,}-token shared prompt",
            "SmolLM2-135M shapes",
            max_model_len=LONG_MODEL_LEN,
        ),
        engine_row(
            impl,
            small,
            long_prompts,
            f"engine, {LONG_SYSTEM_TOKENS:,}-token shared prompt, cascade",
            "SmolLM2-135M shapes",
            max_model_len=LONG_MODEL_LEN,
            cascade=True,
        ),
    ]
    peers = [transformers_row(small, prompts, b, "SmolLM2-135M shapes") for b in (64, 256)]
    peers = [p for p in peers if p is not None]
    best = max((p["c1_tok_s"] for p in peers), default=None)
    for row in rows:
        row["vs_hf"] = row["c1_tok_s"] / best if best else None
    del small
    torch.cuda.empty_cache()
    big = random_weights(llama_8b_shaped_config(4), stream=0, dtype=torch.bfloat16, device="cuda")
    big_prompts = requests(big.config.vocab_size)
    big_rows = [engine_row(impl, big, big_prompts, "engine", "Llama-3-8B shapes, 4 layers")]
    big_peer = transformers_row(big, big_prompts, 256, "Llama-3-8B shapes, 4 layers")
    if big_peer:
        big_rows[0]["vs_hf"] = big_rows[0]["c1_tok_s"] / big_peer["c1_tok_s"]
    for row in rows + long_rows + peers + big_rows + ([big_peer] if big_peer else []):
        table.add(row)
    c = EngineConfig()  # the rows' settings, except where a row's configuration says otherwise
    notes += [
        f"{NUM_REQUESTS} requests: a shared {SYSTEM_TOKENS}-token system prompt + {USER_TOKENS[0]}-{USER_TOKENS[1]} "
        f"tokens each, {OUTPUT_TOKENS} output tokens each (ignore_eos), greedy; random weights in bf16.",
        f"Engine: block size {c.block_size}, max_num_batched_tokens {c.max_num_batched_tokens}, max_num_seqs "
        f"{c.max_num_seqs}, the references of L1, L3, L4, F1; "
        "time from the first request queued to the last token, after a warm-up run of the same traffic with other token ids.",
        "prefill tokens computed counts prompt tokens the model ran (prefix hits excluded); requests admitted in "
        "the same step as the first one recompute the shared prompt, whose blocks are not written yet.",
        f"Cascade (F2): a decode step whose sequences share their first pages reads them once, where F2's planner "
        f"finds it pays; such steps run eagerly (off by default). The {LONG_SYSTEM_TOKENS:,}-token rows are the same traffic with a "
        "longer shared prompt (no transformers row: it recomputes the prompt per request).",
        "transformers: LlamaForCausalLM of the same config and weights' shapes (its own random init), "
        "generate() with left padding, min_new_tokens = max_new_tokens, SDPA attention.",
        "Target: at least 5x the better transformers batch of the same run"
        + (f" ({5 * best:,.0f} output tok/s here)." if best else "."),
    ]
    if not peers:
        notes.append("transformers is not installed here: its rows and the ratio are n/a.")
    return table, notes


def plot(rows, meta, path) -> None:
    """Horizontal bars, one per row (engine configurations and transformers), longest labels readable."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['row']} · {r['model'].split(',')[0]}" for r in rows]
    values = [r.get("c1_tok_s") or 0.0 for r in rows]
    colors = ["tab:gray" if r["row"].startswith("transformers") else "tab:blue" for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    ax.barh(range(len(rows)), values, color=colors)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()  # the table's order, top to bottom
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
    ax.set_xlabel("output tokens/s (256 requests, 128 tokens each)")
    ax.set_title(f"Engine (blue) vs transformers generate (gray), {meta.get('gpu')}", fontsize=10)
    ax.set_xlim(0, max(values) * 1.15 if values else 1)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- The figures the explainer's sentences quote (bench.FIGURES); data is c1_engine.bench.json ------


def _row(data, name: str, model: str = "SmolLM2") -> dict:
    return next(r for r in data["rows"] if r["row"] == name and r["model"].startswith(model))


def _best_hf(data, model: str = "SmolLM2") -> dict:
    peers = [r for r in data["rows"] if r["row"].startswith("transformers") and r["model"].startswith(model)]
    return max(peers, key=lambda r: r["c1_tok_s"])


FIGURES = {
    "tok_s": lambda d: bench.num(_row(d, "engine")["c1_tok_s"]),
    "vs_hf": lambda d: bench.num(_row(d, "engine")["vs_hf"], 1),
    "hf_best": lambda d: f"{_best_hf(d)['c1_tok_s']:,.0f}",
    "hf_best_batch": lambda d: _best_hf(d)["row"].rsplit(" ", 1)[-1],
    "target_tok_s": lambda d: f"{5 * _best_hf(d)['c1_tok_s']:,.0f}",
    "graphs_gain": lambda d: bench.num(
        _row(d, "engine")["c1_tok_s"] / _row(d, "engine, no CUDA graphs")["c1_tok_s"], 1
    ),
    "no_graphs_tok_s": lambda d: f"{_row(d, 'engine, no CUDA graphs')['c1_tok_s']:,.0f}",
    "prefill_without": lambda d: f"{_row(d, 'engine, no prefix caching')['prefill_tokens']:,}",
    "prefill_with": lambda d: f"{_row(d, 'engine')['prefill_tokens']:,}",
    "ttft_without": lambda d: bench.num(_row(d, "engine, no prefix caching")["ttft_s"]),
    "ttft_with": lambda d: bench.num(_row(d, "engine")["ttft_s"]),
    "big_tok_s": lambda d: f"{_row(d, 'engine', 'Llama')['c1_tok_s']:,.0f}",
    "big_vs_hf": lambda d: bench.num(_row(d, "engine", "Llama")["vs_hf"], 1),
    "big_hf": lambda d: f"{_best_hf(d, 'Llama')['c1_tok_s']:,.0f}",
    "cascade_tok_s": lambda d: f"{_row(d, 'engine, cascade')['c1_tok_s']:,.0f}",
    "cascade_steps": lambda d: str(_row(d, "engine, cascade")["cascade_steps"]),
    "long_tok_s": lambda d: (
        f"{_row(d, f'engine, {LONG_SYSTEM_TOKENS:,}-token shared prompt')['c1_tok_s']:,.0f}"
    ),
    "steps": lambda d: str(_row(d, "engine, cascade")["steps"]),
    "long_cascade_steps": lambda d: str(
        _row(d, f"engine, {LONG_SYSTEM_TOKENS:,}-token shared prompt, cascade")["cascade_steps"]
    ),
    "long_steps": lambda d: str(
        _row(d, f"engine, {LONG_SYSTEM_TOKENS:,}-token shared prompt, cascade")["steps"]
    ),
    "long_cascade_tok_s": lambda d: (
        f"{_row(d, f'engine, {LONG_SYSTEM_TOKENS:,}-token shared prompt, cascade')['c1_tok_s']:,.0f}"
    ),
}
