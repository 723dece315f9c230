"""The engine's settings have one home, EngineConfig: LLM and Engine take every default from it.

A default written a second time drifts (LLM once budgeted 8192 tokens a step where Engine, built
directly as the C1 grader builds it, budgeted 4096). These tests build both on a tiny random-weights
model with attention in torch: CPU only, under a second.
"""

from __future__ import annotations

import dataclasses
import inspect

from drills.engine.attention import PagedKVCache
from drills.engine.config import EngineConfig, tiny_config
from drills.engine.engine import Engine
from drills.engine.llm import LLM
from drills.engine.model import Llama, random_weights
from drills.solutions import c1_engine, l3_prefix_cache

SETTINGS = {f.name for f in dataclasses.fields(EngineConfig)}


def _llm(**settings) -> LLM:
    weights = random_weights(tiny_config(), 0)
    return LLM(weights, attention="torch", use="solutions", device="cpu", quiet=True, **settings)


def _engine(config: EngineConfig | None) -> Engine:
    """An Engine built the way the C1 grader builds it: the parts and the pool passed in."""
    model = Llama(random_weights(tiny_config(), 0))
    manager = l3_prefix_cache.BlockManager(64, 16)
    cache = PagedKVCache(model.config, 64, 16)
    return Engine(model, c1_engine, manager, cache, config)


def test_no_setting_has_a_default_outside_engine_config():
    for init in (LLM.__init__, Engine.__init__):
        twice = sorted(SETTINGS & set(inspect.signature(init).parameters))
        assert not twice, (
            f"{init.__qualname__} declares {twice} with a default of its own: they are EngineConfig's fields"
        )


def test_llm_and_engine_agree_on_every_default():
    llm = _llm()
    direct = _engine(None)  # no config at all: EngineConfig's defaults
    expected = dataclasses.replace(EngineConfig(), attention="torch")
    assert llm.config == expected and llm.engine.config == expected
    for name in SETTINGS - {"attention"}:
        ours, theirs = getattr(llm.engine.config, name), getattr(direct.config, name)
        assert ours == theirs, f"{name}: LLM's engine has {ours!r}, an Engine built directly {theirs!r}"
    # What each part was given, not only what the config says: the scheduler's own defaults differ.
    for engine in (llm.engine, direct):
        s = engine.scheduler
        limits = (s.max_num_seqs, s.max_num_batched_tokens, s.chunked_prefill)
        defaults = EngineConfig()
        assert limits == (defaults.max_num_seqs, defaults.max_num_batched_tokens, defaults.chunked_prefill)
        assert engine.max_model_len == tiny_config().max_position
    assert llm.cache.block_size == EngineConfig().block_size


def test_llm_settings_reach_the_engine():
    llm = _llm(max_num_seqs=3, max_num_batched_tokens=40, chunked_prefill=False, max_model_len=100)
    s = llm.engine.scheduler
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.chunked_prefill) == (3, 40, False)
    assert llm.engine.max_model_len == 100
    # On a CPU the pool holds one request of the longest length: 100 tokens in blocks of 16.
    assert llm.cache.num_blocks == 7
    base = EngineConfig(block_size=8, num_blocks=20)
    llm = LLM(random_weights(tiny_config(), 0), None, base, attention="torch", use="solutions", quiet=True)
    assert (llm.cache.block_size, llm.cache.num_blocks, llm.config.attention) == (8, 20, "torch")
