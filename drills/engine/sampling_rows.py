"""The sampler's per-row inputs, kept from one step to the next: no Python loop over a step's rows while
its sequences stay the same.

A step's draw needs, for each row, the request's temperature, top_p, min_p and top_k, and the 32-bit key
of its noise. Read from each sequence's SamplingParams, that is a loop over 256 rows in Python every
decode step: some 80 to 160 us of host time, and in an overlapped decode step the host is the bound.
Yet a decode step's rows are nearly always last step's rows, in the same order, each one draw further.

SamplingRows keeps the last step's rows: their parameters as device tensors (sent once), and for each
seeded row its stream's base (its random_state, hashed once) and draw count as numpy uint64 arrays. A step with the same sequences (and
the same streams) reuses them: its keys are the splitmix64 hash of (base, draws) for every seeded row at
once, in numpy, and one randint for the unseeded rows. A step whose sequences changed (one finished,
one joined) keeps each row it had, gathered by index, and reads only the new rows' SamplingParams.

The keys are the ones Stream gives, draw for draw, and the unseeded rows take one randint in row
order, as a step without this cache does: the tokens are the same with and without it. The streams of
rows kept on the device lag behind (their `draws` is brought up to date when the row leaves, or by
sync()), so nothing but this object may draw for those sequences meanwhile.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import torch

GREEDY, SEEDED, UNSEEDED = 0, 1, 2  # a row's kind
_GENERATOR, _NONE = itertools.repeat("generator"), itertools.repeat(None)  # getattr's arguments, row by row
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
        self.sid = np.zeros(0, np.int64)  # (R,) id() of each of the last step's sequences
        self.gid = np.zeros(0, np.int64)  # (R,) id() of each one's seq.generator
        self.seqs = []  # those sequences, held so that their ids stay theirs
        self.kind = np.zeros(0, np.int8)  # (R,) GREEDY, SEEDED or UNSEEDED
        self.host = np.zeros((0, 4), np.float64)  # (R, 4): temperature, top_p, min_p, top_k
        self.base = np.zeros(0, _U64)  # (R,) each seeded row's stream base (Stream._seed)
        self.draws = np.zeros(0, _U64)  # (R,) each seeded row's draws so far
        self.streams = np.full(0, None, dtype=object)  # (R,) each seeded row's Stream, else None
        self.device = None  # the parameters on the device: SimpleNamespace of (R,) tensors
        self.where = None  # and that device
        self.unseeded = None  # the unseeded rows, (U,) int64 numpy, or None
        self.unseeded_index = None
        self.cut = False  # some sampled row asks for top_k or top_p
        self.shared = False  # two seeded rows draw from one stream
        self.greedy = True  # every row is greedy
        self.some_greedy = True  # some row is
        self.misses = 0  # steps whose rows changed (read from SamplingParams, in part)
        self.hits = 0  # steps that reused every row

    def sync(self) -> None:
        """Bring every seeded row's Stream up to the draws made here."""
        seeded = np.flatnonzero(self.kind == SEEDED)
        for stream, draws in zip(self.streams[seeded].tolist(), self.draws[seeded].tolist()):
            stream.draws = draws

    def prepare(self, seqs, vocab: int, device, generator: torch.Generator | None):
        """The step's (temperature, top_k, top_p, min_p, keys, cut, greedy): five (R,) device tensors,
        whether any sampled row asks for top_k or top_p, and whether some row is greedy; None for a step
        whose rows are all greedy. Advances each seeded row's draws by one."""
        R = len(seqs)
        sid = np.fromiter(map(id, seqs), np.int64, R)  # (R,) each row's sequence, by identity
        # and its stream's (a Sequence without the attribute, which a greedy request never needs, has None)
        gid = np.fromiter(map(id, map(getattr, seqs, _GENERATOR, _NONE)), np.int64, R)
        if device == self.where and np.array_equal(sid, self.sid) and np.array_equal(gid, self.gid):
            self.hits += 1
        else:
            gid = self._change(seqs, sid, gid, vocab, device)
            self.misses += 1
        self.sid, self.gid, self.seqs = sid, gid, list(seqs)  # held: their ids stay theirs
        if self.greedy:
            return None
        on_device = _generator_on_device(generator)
        # The index first: a send through the staging buffer writes over the views of the sends before it.
        index = self._unseeded_index(device) if on_device and self.unseeded is not None else None
        key = self._send(self._keys(None if on_device else generator, not on_device), device)  # (R,) int64
        if index is not None:
            # An engine generator on the device draws those rows' keys there.
            fresh = torch.randint(
                0, 1 << 32, (len(self.unseeded),), generator=generator, device=generator.device
            )
            key = key.index_put((index,), fresh.to(device))
        d = self.device
        return d.temperature, d.top_k, d.top_p, d.min_p, key, self.cut, self.some_greedy  # draw_keyed's order

    def _unseeded_index(self, device) -> torch.Tensor:
        if self.unseeded_index is None:
            # Cloned: kept from step to step, and the engine's staging buffer is written again every step.
            self.unseeded_index = self._send(torch.from_numpy(self.unseeded), device).clone()
        return self.unseeded_index

    def _keys(self, generator, unseeded: bool) -> torch.Tensor:
        """Each row's key, (R,) int64 on the host: a seeded row's Stream key at its draws (then one draw
        more), an unseeded row's from the generator (one randint for all, in row order; unseeded False:
        left 0, drawn on the device), 0 for greedy."""
        keys = np.zeros(len(self.kind), np.int64)
        seeded = self.kind == SEEDED
        if seeded.any() and self.shared:
            # Two rows on one stream (a sequence twice in the step): each draws in turn, as the stream does.
            at = np.flatnonzero(seeded).tolist()
            keys[at] = [self.streams[r].next_key() for r in at]
            self.draws[at] = [self.streams[r].draws for r in at]
        elif seeded.any():
            keys[seeded] = (splitmix64(self.base[seeded] ^ self.draws[seeded]) >> _U64(32)).astype(np.int64)
            self.draws[seeded] += _U64(1)
        if unseeded and self.unseeded is not None:
            keys[self.unseeded] = torch.randint(
                0, 1 << 32, (len(self.unseeded),), generator=generator
            ).numpy()
        return torch.from_numpy(keys)

    def _change(self, seqs, sid: np.ndarray, gid: np.ndarray, vocab: int, device) -> np.ndarray:
        """Rows for a new set of sequences: those kept (the same sequence and stream) gathered from the last
        step, the others read from their SamplingParams. Returns gid with the new streams' ids."""
        self.sync()  # the rows that leave (finished, preempted) take their draws with them
        index = np.full(len(seqs), -1, np.int64)  # (R,) each row's row last step, or -1
        if len(self.sid):
            order = np.argsort(self.sid)
            at = order[np.searchsorted(self.sid, sid, sorter=order).clip(max=len(order) - 1)]
            same = (self.sid[at] == sid) & (self.gid[at] == gid)
            index = np.where(same, at, -1)
        kept = np.flatnonzero(index >= 0)
        old = index[kept]
        R = len(seqs)
        kind = np.zeros(R, np.int8)
        host = np.zeros((R, 4), np.float64)
        base = np.zeros(R, _U64)
        draws = np.zeros(R, _U64)
        streams = np.full(R, None, dtype=object)
        kind[kept], host[kept], base[kept], draws[kept] = (
            self.kind[old],
            self.host[old],
            self.base[old],
            self.draws[old],
        )
        streams[kept] = self.streams[old]
        new = np.flatnonzero(index < 0).tolist()
        if new:
            made = {}  # id(SamplingParams) -> its row: requests often share one
            rows, seeded = [], []
            for r in new:
                seq = seqs[r]
                p = seq.params
                row = made.get(id(p))
                if row is None:
                    row = made[id(p)] = _param_row(p, vocab)
                rows.append(row)
                if row[0] != 0 and p.random_state is not None:
                    stream = seq.generator
                    if not isinstance(stream, Stream):
                        stream = seq.generator = Stream(p.random_state)
                    seeded.append((r, stream))
            host[new] = rows
            kind[new] = np.where(host[new, 0] == 0, GREEDY, UNSEEDED)
            if seeded:
                at = [r for r, _ in seeded]
                kind[at] = SEEDED
                base[at] = [stream._seed for _, stream in seeded]
                draws[at] = [stream.draws for _, stream in seeded]
                streams[at] = [stream for _, stream in seeded]
                gid = gid.copy()
                gid[at] = [id(stream) for _, stream in seeded]
        self.kind, self.host, self.base, self.draws, self.streams = kind, host, base, draws, streams
        seeded_gid = gid[kind == SEEDED]
        self.shared = len(np.unique(seeded_gid)) < len(seeded_gid)  # a stream on two rows
        sampled = kind != GREEDY
        self.greedy = not sampled.any()
        self.some_greedy = not sampled.all()
        self.cut = bool((sampled & ((host[:, 3] > 0) | (host[:, 1] < 1))).any())
        unseeded = np.flatnonzero(kind == UNSEEDED)
        self.unseeded = unseeded if len(unseeded) else None  # their rows, (U,) int64
        self.unseeded_index = None  # the same on the device, made when a device generator needs it
        self.where = device
        d = self._send(torch.from_numpy(host), device)  # (R, 4) float64: every value exact
        # Each column contiguous, once: the kernels take (R,) tensors, and a strided view would be copied
        # every step by the draw's .contiguous().
        temperature, top_p, min_p = d[:, :3].float().t().contiguous().unbind(0)  # (R,) each
        self.device = SimpleNamespace(temperature=temperature, top_p=top_p, min_p=min_p, top_k=d[:, 3].long())
        return gid

    def _send(self, values: torch.Tensor, device) -> torch.Tensor:
        """values on the device. Through the staging buffers, a view that the next step's send writes
        over (in stream order, after this step's kernels read it): keep nothing of it past the step."""
        if device.type != "cuda":
            return values.clone().to(device)  # the host arrays change next step: the device copy owns its own
        if self.staging is not None:
            return self.staging.send(SimpleNamespace(values=values)).values
        return values.pin_memory().to(device, non_blocking=True)


def _generator_on_device(generator) -> bool:
    """Whether the engine's generator draws on a device (a CUDA generator): the unseeded rows' keys are
    then drawn there, not on the host."""
    return generator is not None and generator.device.type != "cpu"


def _param_row(p, vocab: int) -> tuple:
    """(temperature, top_p, min_p, top_k) of a SamplingParams; top_k -1 for every token."""
    top_k = getattr(p, "top_k", -1)  # a SamplingParams of an older C1 file has no top_k, min_p
    top_k = min(top_k, vocab) if top_k > 0 else -1
    return (p.temperature, p.top_p, getattr(p, "min_p", 0.0), top_k)
