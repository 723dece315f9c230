"""The graders' oracle: attention in pure torch over one contiguous cache per sequence, and greedy decoding.

`ReferenceAttention` is model.forward's attention callback with each sequence's K and V kept in one
tensor per layer: what the paged kernels (L1 store, L4 prefill, F1/L2 decode) replace, and what their
engine must agree with. `packed_step` builds one step's inputs for it, and `greedy_generate` runs one
prompt through forward the way an engine does (a prefill step, then one decode step per token).
`causal_attention` is the math of one sequence, shared with attention.TorchPagedAttention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from drills.engine.config import LlamaConfig
from drills.engine.model import Llama, forward


@dataclass
class ReferenceMeta:
    """What the reference attention needs of a step: which sequence each packed segment belongs to."""

    seq_ids: list  # one per sequence in the step, in packing order
    query_lens: list[int]  # new tokens of each (prompt tokens or a chunk of them; 1 for a decode row)


class ReferenceAttention:
    """attention(layer, q, k, v, meta) in pure torch: each sequence keeps its K and V in one contiguous
    tensor per layer; new keys are appended, then each new query attends causally over the sequence's
    whole history (cached tokens + the new ones up to itself), or its window of it where
    config.windows gives the layer one, with the layer's sink logits in the denominator where `sinks`
    (one (Hq,) tensor or None per layer) gives them. Computed in fp32."""

    def __init__(self, config: LlamaConfig, sinks=None):
        self.config = config
        self.sinks = sinks or [None] * config.num_layers
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
            out[start : start + n] = causal_attention(
                q[start : start + n], keys, values, scale, c.window(layer), self.sinks[layer]
            )
            start += n
        return out


def causal_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float,
    window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """One sequence's n newest queries over its whole history, in fp32: q (n, Hq, D), keys and values
    (L, Hkv, D) with the n new tokens last -> (n, Hq, D) in q's dtype. Shared by ReferenceAttention and
    attention.TorchPagedAttention, which differ only in where the keys are kept.

    window  None, or the query at position p sees only the keys p - window < j <= p
    sinks   None, or (Hq,) logits: head h's denominator gains exp(sinks[h]), its numerator nothing"""
    n, Hq, D = q.shape
    L, Hkv, _ = keys.shape
    # GQA with consecutive grouping: query head h reads kv head h // group (transformers' repeat_kv).
    qg = q.float().view(n, Hkv, Hq // Hkv, D)  # (n, Hkv, G, D)
    scores = torch.einsum("nkgd,lkd->kgnl", qg, keys.float()) * scale  # (Hkv, G, n, L)
    # New query i sits at position L - n + i of its sequence and sees keys 0 .. L - n + i.
    query_pos = torch.arange(L - n, L, device=q.device)[:, None]  # (n, 1)
    key_pos = torch.arange(L, device=q.device)[None, :]  # (1, L)
    visible = key_pos <= query_pos  # (n, L)
    if window is not None:
        visible = visible & (key_pos > query_pos - window)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        # The sink as one more key of logit sinks[h] and value zero: a column in the softmax, then dropped.
        sink = sinks.float().view(Hkv, Hq // Hkv, 1, 1).expand(Hkv, Hq // Hkv, n, 1)
        probs = torch.cat([scores, sink], dim=-1).softmax(-1)[..., :L]  # (Hkv, G, n, L)
    else:
        probs = scores.softmax(-1)
    o = torch.einsum("kgnl,lkd->nkgd", probs, values.float())  # (n, Hkv, G, D)
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
    attention = ReferenceAttention(model.config, [layer.sinks for layer in model.weights.layers])
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
