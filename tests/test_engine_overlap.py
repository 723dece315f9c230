"""The overlapped loop (Engine.step with overlap on) on requests that stop and sample.

Every step leaves its tokens on the device and the scheduler books placeholders; a request whose real
token turns out to stop it ran one step too many, and that step's token must be dropped, its blocks
freed. Each test runs the same requests through the lockstep loop and the overlapped one on the tiny
model (the CPU, attention in torch) and names the mistake it catches.
"""

from __future__ import annotations

import dataclasses

import torch

from drills.engine.config import tiny_config
from drills.engine.model import random_weights
from drills.solutions.c1_engine import SamplingParams

# Untied: with the logits read off the embedding, each token predicts itself and every output repeats
# one token; an end-of-sequence id would then stop a request at its first token or never.
CONFIG = dataclasses.replace(tiny_config(), tie_word_embeddings=False)
VOCAB = CONFIG.vocab_size
NUM_BLOCKS = 14  # too few for all prompts at once: preemptions happen


def _llm(overlap: bool, eos_id=None, **settings):
    from drills.engine.llm import LLM

    llm = LLM(
        random_weights(CONFIG, stream=14),
        attention="torch",
        use="solutions",
        device="cpu",
        dtype=torch.float32,
        block_size=8,
        num_blocks=NUM_BLOCKS,
        max_num_batched_tokens=24,  # prompts in chunks
        overlap=overlap,
        quiet=True,
        **settings,
    )
    llm.engine.eos_id = eos_id
    return llm


def _prompts(stream: int, lens=(5, 40, 17, 33, 9, 60)) -> list[list[int]]:
    g = torch.Generator().manual_seed(stream)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lens]


def _common_token(outputs: list[list[int]]) -> int:
    """The token the most requests really produce after their first: an end-of-sequence id that stops
    several of them mid-way."""
    seen = torch.zeros(VOCAB, dtype=torch.int64)
    for o in outputs:
        seen[sorted(set(o[1:]))] += 1
    return int(seen.argmax())


def _both(prompts, params, eos_id=None) -> dict:
    """Both loops on the same requests: per loop, the completions (token_ids, finish_reason), what
    was streamed, the stats and the pool afterwards."""
    runs = {}
    for on in (False, True):
        llm = _llm(on, eos_id)
        streamed = [[] for _ in prompts]
        outs = llm.generate(prompts, params, on_token=lambda i, t, got=streamed: got[i].append(t))
        runs[on] = dict(
            outs=[(o.token_ids, o.finish_reason) for o in outs],
            streamed=streamed,
            stats=llm.engine.stats,
            preemptions=llm.engine.scheduler.num_preemptions,
            free=llm.block_manager.num_free_blocks,
            running=len(llm.engine.scheduler.running),
            pending=llm.engine.pending_seq_ids,
            rows=llm.engine.sampling_rows,
        )
    return runs


def _assert_same(runs, what: str) -> None:
    lock, over = runs[False], runs[True]
    assert over["outs"] == lock["outs"], (
        f"{what}: the overlapped loop's (tokens, finish reason) differ from lockstep's; a request that "
        "stops ran one step past its end and that step's token was kept (or a placeholder came out)"
    )
    assert over["streamed"] == [t for t, _ in over["outs"]], f"{what}: a token past a stop was streamed"
    assert over["stats"].output_tokens == lock["stats"].output_tokens, (
        f"{what}: output_tokens counts the dropped tokens"
    )
    assert over["free"] == NUM_BLOCKS and over["running"] == 0 and not over["pending"], (
        f"{what}: after every request ended, {NUM_BLOCKS - over['free']} blocks are held, "
        f"{over['running']} requests run: a stopped request's blocks were never freed"
    )
    assert over["stats"].overlap_steps == over["stats"].steps, (
        f"{what}: {over['stats'].steps - over['stats'].overlap_steps} of {over['stats'].steps} steps ran "
        "in lockstep: the overlap serves every step"
    )


def test_greedy_requests_that_stop_on_eos_end_where_lockstep_ends():
    """Greedy requests with ragged max_tokens, an end-of-sequence token some of them produce mid-way,
    chunked prompts and preemptions: the same tokens and finish reasons as lockstep, the token computed
    past each stop dropped, every block freed."""
    prompts = _prompts(15)
    free = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (40, 20, 40, 40, 1, 40)]
    eos = _common_token([o.token_ids for o in _llm(False).generate(prompts, free)])
    params = [dataclasses.replace(p, ignore_eos=False) for p in free]
    runs = _both(prompts, params, eos)
    _assert_same(runs, "greedy requests stopping on eos")
    reasons = [r for _, r in runs[True]["outs"]]
    assert "stop" in reasons and "length" in reasons, f"the eos was meant to stop some requests: {reasons}"
    assert runs[True]["preemptions"] > 0, "the pool was meant to be small enough for a preemption"


def test_sampled_requests_with_seeds_give_lockstep_tokens():
    """Sampled requests (temperature, top_p), each with its own random_state, stopping on eos: the
    overlapped loop draws on the device, one step ahead, and must give the lockstep loop's tokens (a
    request's draws come from its own generator, whatever the batch and the loop)."""
    prompts = _prompts(16)
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=m, random_state=100 + i)
        for i, m in enumerate((20, 3, 31, 8, 1, 14))
    ]
    free = [dataclasses.replace(p, ignore_eos=True) for p in params]
    eos = _common_token([o.token_ids for o in _llm(False).generate(prompts, free)])
    runs = _both(prompts, params, eos)
    _assert_same(runs, "sampled requests with seeds")
    assert any(r == "stop" for _, r in runs[True]["outs"]), "the eos was meant to stop a request"
    rows = runs[True]["rows"]
    assert rows.hits and rows.misses, (
        f"the overlapped steps were meant to reuse their sampling rows and to change them: {rows.hits} "
        f"steps reused them, {rows.misses} changed them"
    )


def test_a_stop_token_ends_a_request_in_both_loops():
    """A SamplingParams with stop_token_ids (a field a sampler may add): the engine ends the request at
    the first one, in lockstep as in the overlapped loop, and drops the token computed past it."""
    fields = [("stop_token_ids", tuple, dataclasses.field(default=()))]
    WithStops = dataclasses.make_dataclass("WithStops", fields, bases=(SamplingParams,), frozen=True)
    prompts = _prompts(17)
    free = [SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)] * len(prompts)
    outs = [o.token_ids for o in _llm(False).generate(prompts, free)]
    stop = _common_token(outs)
    params = [WithStops(temperature=0.0, max_tokens=12, ignore_eos=True, stop_token_ids=(stop,))] * len(
        prompts
    )
    runs = _both(prompts, params)
    _assert_same(runs, "requests with a stop token")
    for (tokens, _), full in zip(runs[False]["outs"], outs):
        end = full.index(stop) + 1 if stop in full else len(full)
        assert tokens == full[:end], f"lockstep did not end at the stop token {stop}: {tokens} of {full}"


def test_abort_drops_the_token_on_its_way_and_frees_the_blocks():
    """Engine.abort under the overlap: a running request whose last token is still on the device, and
    one still waiting. The first keeps the tokens known (a prefix of its lockstep output), the second
    none; their blocks are freed and the other requests give lockstep's tokens."""
    prompts = _prompts(18)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    lock = [o.token_ids for o in _llm(False).generate(prompts, params)]
    llm = _llm(True)
    eng = llm.engine
    seqs = [eng.add_request(p, params) for p in prompts]
    while len(seqs[0].output) < 4:
        eng.step()
    assert seqs[0].seq_id in eng.pending_seq_ids, "the request's last token was meant to be on the device"
    waiting = next(s for s in reversed(seqs) if s.status == "waiting")
    eng.abort(seqs[0])
    eng.abort(waiting)
    assert seqs[0].finished and waiting.finished
    assert seqs[0].seq_id not in eng.pending_seq_ids
    while eng.has_work:
        eng.step()
    eng.flush()
    got = [s.output for s in seqs]
    assert all(t < VOCAB for o in got for t in o), "a placeholder stayed in an aborted request's output"
    assert got[0] == lock[0][: len(got[0])] and len(got[0]) == 3, (
        f"the aborted request holds {got[0]}: the 3 tokens known when it was aborted, of {lock[0]}"
    )
    assert waiting.output == []
    for i, s in enumerate(seqs):
        if s is not seqs[0] and s is not waiting:
            assert got[i] == lock[i], f"request {i}: another request's abort changed its tokens"
    assert llm.block_manager.num_free_blocks == NUM_BLOCKS, "an aborted request's blocks were never freed"


def test_decode_inputs_built_on_the_device_are_prepare_inputs():
    """Decode steps' inputs built from block-table rows kept on the device (DeviceBatch), with only new
    block ids sent, checked field by field against C1's prepare_inputs at every step they build, through
    chunked prompts, preemptions, requests that stop on eos, and the overlap: the same tokens as the
    lockstep loop that builds every step with prepare_inputs."""
    from drills.solutions.c1_engine import prepare_inputs

    prompts = _prompts(15)  # the eos test's requests: a preemption among them
    free = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (40, 20, 40, 40, 1, 40)]
    eos = _common_token([o.token_ids for o in _llm(False).generate(prompts, free)])
    params = [dataclasses.replace(p, ignore_eos=False) for p in free]
    lock = [(o.token_ids, o.finish_reason) for o in _llm(False, eos).generate(prompts, params)]
    for overlap, pad in ((False, None), (True, None), (True, 8)):
        llm = _llm(overlap, eos, device_inputs=True)
        batch = llm.engine.batch
        batch.check = prepare_inputs  # every step built on the device, compared with prepare_inputs'
        if pad:  # padded to a batch of 8, as a CUDA graph's replay pads it (padding rows read nothing)
            build = batch.build
            batch.build = lambda scheduled, bm, pad_to=None, build=build, pad=pad: build(
                scheduled, bm, pad_to=pad
            )
        got = [(o.token_ids, o.finish_reason) for o in llm.generate(prompts, params)]
        assert got == lock, f"overlap={overlap}: the tokens differ with decode inputs built on the device"
        assert batch.built > len(got), f"overlap={overlap}: only {batch.built} steps were built on the device"
        assert llm.engine.stats.device_input_steps == batch.built
        assert llm.engine.scheduler.num_preemptions > 0, (
            "the pool was meant to be small enough for a preemption"
        )
        assert llm.block_manager.num_free_blocks == NUM_BLOCKS
