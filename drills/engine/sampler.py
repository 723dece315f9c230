"""The sampler: one token per sequence from its logits row, under the sequence's SamplingParams.

temperature 0 is greedy (one argmax over every greedy row at once); otherwise softmax(logits /
temperature), cut to the likeliest tokens whose probabilities reach top_p, and drawn with the
sequence's own generator when its SamplingParams give a random_state, else with the engine's.
"""

from __future__ import annotations

import torch


def sample(logits: torch.Tensor, seqs, generator: torch.Generator | None) -> list[int]:
    """One token per row of logits (R, V), under each sequence's SamplingParams."""
    tokens = [0] * len(seqs)
    greedy = [i for i, s in enumerate(seqs) if s.params.temperature == 0]
    if greedy:
        picked = logits[greedy].argmax(-1).tolist()
        for i, t in zip(greedy, picked):
            tokens[i] = t
    for i, seq in enumerate(seqs):
        p = seq.params
        if p.temperature == 0:
            continue
        probs = torch.softmax(logits[i].float() / p.temperature, -1)  # (V,)
        if p.top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            # Keep the tokens before the running sum passes top_p, and the one that passes it.
            keep = sorted_probs.cumsum(0) - sorted_probs < p.top_p
            probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
        if p.random_state is not None and seq.generator is None:
            seq.generator = torch.Generator(device=probs.device).manual_seed(p.random_state)
        tokens[i] = int(torch.multinomial(probs, 1, generator=seq.generator or generator))
    return tokens
