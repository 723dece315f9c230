"""The sampler's per-row inputs, kept from one step to the next: no Python loop over a step's rows while
its sequences stay the same.

A step's draw needs, for each row, the request's temperature, top_p, min_p and top_k, and the 32-bit key
of its noise. Read from each sequence's SamplingParams, that is a loop over 256 rows in Python every
decode step: some 80 to 160 us of host time, and in an overlapped decode step the host is the bound.
Yet a decode step's rows are nearly always last step's rows, in the same order, each one draw further.

SamplingRows keeps the last step's rows: their parameters as device tensors (sent once), and for each
seeded row its stream's seed and draw count as numpy uint64 arrays. A step with the same sequences (and
the same streams) reuses them: its keys are the splitmix64 hash of (seed, draws) for every seeded row at
once, in numpy, and one randint for the unseeded rows. A step whose sequences changed (one finished,
one joined) keeps each row it had, gathered by index, and reads only the new rows' SamplingParams.

The keys are the ones Stream gives, draw for draw, and the unseeded rows take one randint in row
order, as a step without this cache does: the tokens are the same with and without it. The streams of
rows kept on the device lag behind (their `draws` is brought up to date when the row leaves, or by
sync()), so nothing but this object may draw for those sequences meanwhile.
"""

from __future__ import annotations

import operator
from types import SimpleNamespace

import numpy as np
import torch

GREEDY, SEEDED, UNSEEDED = 0, 1, 2  # a row's kind
_PARAMS = operator.attrgetter("params")
_GENERATOR = operator.attrgetter("generator")
_U64 = np.uint64


MASK64 = (1 << 64) - 1


class Stream:
    """A request's random stream: its random_state and how many tokens it has drawn from it."""

    __slots__ = ("draws", "random_state", "_seed")

    def __init__(self, random_state: int):
        self.random_state = random_state
        self.draws = 0
        self._seed = _splitmix64(random_state & MASK64)  # once per request: the step pays one mix a row

    def next_key(self) -> int:
        """The key of the next draw, stream_key(random_state, draws); then one draw more."""
        key = _splitmix64(self._seed ^ self.draws) >> 32
        self.draws += 1
        return key

    def __repr__(self):
        return f"Stream(random_state={self.random_state}, draws={self.draws})"


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def stream_key(random_state: int, position: int) -> int:
    """The 32-bit key of draw number `position` of the stream started from `random_state` (any int)."""
    return _splitmix64(_splitmix64(random_state & MASK64) ^ position) >> 32


def splitmix64(x: np.ndarray) -> np.ndarray:
    """_splitmix64 over a uint64 array (numpy's uint64 arithmetic wraps modulo 2**64)."""
    with np.errstate(over="ignore"):
        x = x + _U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


class SamplingRows:
    """One engine's sampling rows. staging: the engine's pinned host-to-device copier (engine._Staging),
    or None: a plain copy (pinned first on a GPU, so that it does not wait for the queued step)."""

    def __init__(self, staging=None):
        self.staging = staging
        self.ids = None  # ((id(seq), id(seq.generator)) of each row): the last step's rows
        self.seqs = ()  # those sequences, held so that their ids stay theirs
        self.kind = np.zeros(0, np.int8)  # (R,) GREEDY, SEEDED or UNSEEDED
        self.host = np.zeros((0, 4), np.float64)  # (R, 4): temperature, top_p, min_p, top_k
        self.seed = np.zeros(0, _U64)  # (R,) each seeded row's stream seed (Stream._seed)
        self.draws = np.zeros(0, _U64)  # (R,) each seeded row's draws so far
        self.streams = []  # (R,) each row's Stream, or None
        self.device = None  # the parameters on the device: SimpleNamespace of (R,) tensors
        self.where = None  # and that device
        self.unseeded = None  # the unseeded rows, (U,) int64 numpy, or None
        self.unseeded_index = None
        self.cut = False  # some sampled row asks for top_k or top_p
        self.greedy = True  # every row is greedy
        self.misses = 0  # steps whose rows changed (read from SamplingParams, in part)
        self.hits = 0  # steps that reused every row

    def sync(self) -> None:
        """Bring every kept row's Stream up to the draws made here."""
        for stream, draws in zip(self.streams, self.draws.tolist()):
            if stream is not None:
                stream.draws = draws

    def prepare(self, seqs, vocab: int, device, generator: torch.Generator | None):
        """The step's (temperature, top_k, top_p, min_p, keys, cut): five (R,) device tensors and whether
        any sampled row asks for top_k or top_p; None for a step whose rows are all greedy. Advances each
        seeded row's draws by one."""
        ids = tuple(zip(map(id, seqs), map(id, map(_GENERATOR, seqs))))
        if ids == self.ids and device == self.where:
            self.hits += 1
        else:
            self._change(seqs, vocab, device)
            self.misses += 1
            # The new rows' streams were made just now: the ids to match next step are theirs.
            ids = tuple(zip(map(id, seqs), map(id, map(_GENERATOR, seqs))))
        self.ids, self.seqs = ids, tuple(seqs)
        if self.greedy:
            return None
        on_device = generator is not None and generator.device.type != "cpu"
        key = self._send(self._keys(None if on_device else generator, not on_device), device)  # (R,) int64
        if on_device and self.unseeded is not None:
            # An engine generator on the device draws those rows' keys there.
            fresh = torch.randint(
                0, 1 << 32, (len(self.unseeded),), generator=generator, device=generator.device
            )
            key = key.index_put((self._unseeded_index(device),), fresh.to(device))
        d = self.device
        return d.temperature, d.top_k, d.top_p, d.min_p, key, self.cut  # draw_keyed's order

    def _unseeded_index(self, device) -> torch.Tensor:
        if self.unseeded_index is None:
            self.unseeded_index = self._send(torch.from_numpy(self.unseeded), device)
        return self.unseeded_index

    def _keys(self, generator, unseeded: bool) -> torch.Tensor:
        """Each row's key, (R,) int64 on the host: a seeded row's Stream key at its draws (then one draw
        more), an unseeded row's from the generator (one randint for all, in row order; unseeded False:
        left 0, drawn on the device), 0 for greedy."""
        keys = np.zeros(len(self.kind), np.int64)
        seeded = self.kind == SEEDED
        if seeded.any():
            keys[seeded] = (splitmix64(self.seed[seeded] ^ self.draws[seeded]) >> _U64(32)).astype(np.int64)
            self.draws[seeded] += _U64(1)
        if unseeded and self.unseeded is not None:
            keys[self.unseeded] = torch.randint(
                0, 1 << 32, (len(self.unseeded),), generator=generator
            ).numpy()
        return torch.from_numpy(keys)

    def _change(self, seqs, vocab: int, device) -> None:
        """Rows for a new set of sequences: those kept gathered from the last step, the others read."""
        self.sync()  # the rows that leave (finished, preempted) take their draws with them
        last = {key: r for r, key in enumerate(self.ids or ())}
        index = [last.get((id(s), id(s.generator)), -1) for s in seqs]  # each row's row last step, or -1
        new = [r for r, j in enumerate(index) if j < 0]
        R = len(seqs)
        kind = np.zeros(R, np.int8)
        host = np.zeros((R, 4), np.float64)
        seed = np.zeros(R, _U64)
        draws = np.zeros(R, _U64)
        streams = [None] * R
        kept = [r for r, j in enumerate(index) if j >= 0]
        if kept:
            old = np.array([index[r] for r in kept], np.int64)
            kind[kept], host[kept], seed[kept], draws[kept] = (
                self.kind[old],
                self.host[old],
                self.seed[old],
                self.draws[old],
            )
            for r, j in zip(kept, old.tolist()):
                streams[r] = self.streams[j]
        made = {}  # id(SamplingParams) -> its row: requests often share one
        for r in new:
            seq = seqs[r]
            p = seq.params
            row = made.get(id(p))
            if row is None:
                row = made[id(p)] = _param_row(p, vocab)
            host[r] = row
            if row[0] == 0:
                continue  # greedy: draws nothing
            if p.random_state is None:
                kind[r] = UNSEEDED
                continue
            stream = seq.generator
            if not isinstance(stream, Stream):
                stream = seq.generator = Stream(p.random_state)
            kind[r], seed[r], draws[r], streams[r] = SEEDED, stream._seed, stream.draws, stream
        self.kind, self.host, self.seed, self.draws, self.streams = kind, host, seed, draws, streams
        self.greedy = not (kind != GREEDY).any()
        sampled = kind != GREEDY
        self.cut = bool((sampled & ((host[:, 3] > 0) | (host[:, 1] < 1))).any())
        unseeded = np.flatnonzero(kind == UNSEEDED)
        self.unseeded = unseeded if len(unseeded) else None  # their rows, (U,) int64
        self.unseeded_index = None  # the same on the device, made when a device generator needs it
        self.where = device
        values = torch.from_numpy(host)  # (R, 4) float64: every value exact
        d = self._send(values, device)
        temperature, top_p, min_p = d[:, :3].float().unbind(-1)  # (R,) each
        self.device = SimpleNamespace(temperature=temperature, top_p=top_p, min_p=min_p, top_k=d[:, 3].long())

    def _send(self, values: torch.Tensor, device) -> torch.Tensor:
        if device.type != "cuda":
            return values.clone().to(device)  # the host arrays change next step: the device copy owns its own
        if self.staging is not None:
            return self.staging.send(SimpleNamespace(values=values)).values
        return values.pin_memory().to(device, non_blocking=True)


def _param_row(p, vocab: int) -> tuple:
    """(temperature, top_p, min_p, top_k) of a SamplingParams; top_k -1 for every token."""
    top_k = getattr(p, "top_k", -1)  # a SamplingParams of an older C1 file has no top_k, min_p
    top_k = min(top_k, vocab) if top_k > 0 else -1
    return (p.temperature, p.top_p, getattr(p, "min_p", 0.0), top_k)
