"""L3 benchmark: how fast the block manager allocates, and how many blocks prefix sharing saves.

10,000 requests share a 1,000-token system prompt, each followed by its own user turn of 20 to 199
tokens (a fixed random draw). All are allocated into one manager and stay live together, then all are freed. This
is plain Python on the host CPU: no GPU is touched (the CPU is named in the notes).

    blocks without sharing = sum over requests of ceil(len / block_size)
    blocks with sharing    = that - (R - 1) * floor(1000 / block_size)

Each row's counts are checked against these formulas (and every request's cached-token count against
floor(1000 / block_size) * block_size) before its times are reported. The ceiling measured in the same
run is computing every request's chained keys and nothing else, which any hash-based lookup must do.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import platform
import random
import time
from array import array

from drills import bench

NEEDS_CUDA = False  # pure Python: the block manager runs on the host

N_REQUESTS = 10_000
SYSTEM_TOKENS = 1_000
USER_TOKENS = (20, 200)  # each request's own turn: randint(20, 199) tokens
VOCAB = 32_000
CONFIGS = [(16, "python hash"), (16, "sha256"), (256, "python hash")]  # (block_size, key function)

COLUMNS = [
    ("block_size", "block size"),
    ("hash", "key"),
    ("requests", "requests"),
    ("blocks_shared", "blocks, shared"),
    ("blocks_unshared", "blocks, no sharing"),
    ("saved", "saved"),
    ("cached_per_request", "cached tokens / request"),
    ("alloc_rps", "allocate req/s"),
    ("alloc_us", "us / request"),
    ("alloc_mtok_s", "prompt Mtok/s"),
    ("ceiling_rps", "keys only req/s"),
    ("alloc_ceiling", "allocate / keys only"),
    ("unshared_rps", "allocate req/s, no sharing"),
    ("free_rps", "free req/s"),
]


def sha256_chain(prev_hash, token_ids):
    """The key vLLM uses by default since v0.10.2 (SHA-256 over the previous key and the tokens), as an int."""
    h = hashlib.sha256()
    if prev_hash is not None:
        h.update(prev_hash.to_bytes(32, "little"))
    h.update(array("q", token_ids).tobytes())
    return int.from_bytes(h.digest(), "little")


def make_requests(stream=0):
    rng = random.Random(stream)
    system = [rng.randrange(VOCAB) for _ in range(SYSTEM_TOKENS)]
    return [
        system + [rng.randrange(VOCAB) for _ in range(rng.randrange(*USER_TOKENS))] for _ in range(N_REQUESTS)
    ]


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def keys_only(requests, block_size, hash_fn):
    """The chained keys of every full block of every request: the floor under any hash-based lookup."""
    for tokens in requests:
        prev = None
        for i in range(0, len(tokens) // block_size * block_size, block_size):
            prev = hash_fn(prev, tuple(tokens[i : i + block_size]))


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(impl) -> tuple[bench.Table, list[str]]:
    table = bench.Table(COLUMNS)
    requests = make_requests()
    num_tokens = sum(len(r) for r in requests)
    for block_size, key_name in CONFIGS:
        hash_fn = sha256_chain if key_name == "sha256" else None
        unshared = sum(math.ceil(len(r) / block_size) for r in requests)
        shared_blocks = SYSTEM_TOKENS // block_size
        expected_shared = unshared - (N_REQUESTS - 1) * shared_blocks

        m = impl.BlockManager(unshared, block_size, hash_fn=hash_fn)
        t_alloc = seconds(lambda: [m.allocate(i, tokens) for i, tokens in enumerate(requests)])
        used = unshared - m.num_free_blocks
        assert used == expected_shared, (
            f"bs={block_size}: {used} blocks used with sharing, expected {expected_shared}"
        )
        cached = [m.num_cached_tokens(i) for i in range(N_REQUESTS)]
        assert cached[0] == 0 and set(cached[1:]) == {shared_blocks * block_size}, "wrong cached-token counts"
        t_free = seconds(lambda: [m.free(i) for i in range(N_REQUESTS)])
        assert m.num_free_blocks == unshared, "blocks still held after every request was freed"

        # No sharing: a key function that never repeats, so no lookup ever hits.
        counter = itertools.count()
        never = impl.BlockManager(unshared, block_size, hash_fn=lambda prev_hash, token_ids: next(counter))
        t_unshared = seconds(lambda: [never.allocate(i, tokens) for i, tokens in enumerate(requests)])
        assert never.num_free_blocks == 0, "without sharing every block should be in use"
        del never

        t_keys = seconds(lambda: keys_only(requests, block_size, hash_fn or (lambda p, t: hash((p, t)))))
        row = dict(
            block_size=block_size,
            hash=key_name,
            requests=N_REQUESTS,
            blocks_shared=used,
            blocks_unshared=unshared,
            saved=1 - used / unshared,
            cached_per_request=shared_blocks * block_size,
            alloc_rps=N_REQUESTS / t_alloc,
            alloc_us=1e6 * t_alloc / N_REQUESTS,
            alloc_mtok_s=num_tokens / t_alloc / 1e6,
            ceiling_rps=N_REQUESTS / t_keys,
            unshared_rps=N_REQUESTS / t_unshared,
            free_rps=N_REQUESTS / t_free,
        )
        row["alloc_ceiling"] = row["alloc_rps"] / row["ceiling_rps"]
        table.add(row)

    notes = [
        f"Host CPU, one thread: {cpu_name()}; Python {platform.python_version()}. No GPU is used: the GPU in "
        "the header is only the machine the run happened on.",
        f"{N_REQUESTS} requests, each a {SYSTEM_TOKENS}-token system prompt plus {USER_TOKENS[0]} to "
        f"{USER_TOKENS[1] - 1} tokens of its own (a fixed random draw), {num_tokens} prompt tokens in all, all live at once.",
        "blocks, no sharing: sum of ceil(len / block_size); blocks, shared: what the manager used, checked "
        "against that minus (requests - 1) * floor(1000 / block_size). With block size 256 only 768 of "
        "the 1000 system tokens fill whole blocks, so the other 232 are recomputed by every request.",
        "keys only: the chained key of every full block of every request and nothing else (the same-run "
        "ceiling); python hash is hash((prev_key, tokens)), sha256 hashes the previous key's 32 bytes and "
        "the tokens as int64.",
        "allocate req/s, no sharing: the same manager with a key function that never repeats, so every "
        "lookup misses and every block is new.",
    ]
    return table, notes


def plot(rows, meta, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"bs={r['block_size']}\n{r['hash']}" for r in rows]
    x = range(len(rows))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 4))
    w = 0.4
    ax0.bar([i - w / 2 for i in x], [r["blocks_unshared"] for r in rows], w, label="no sharing")
    ax0.bar([i + w / 2 for i in x], [r["blocks_shared"] for r in rows], w, label="prefix sharing")
    ax0.set_yscale("log")
    ax0.set_xticks(list(x), labels)
    ax0.set_ylabel(f"KV blocks held by {rows[0]['requests']:,} live requests")
    ax0.legend()
    w = 0.27
    for k, (key, name) in enumerate(
        [
            ("alloc_rps", "allocate"),
            ("unshared_rps", "allocate, no sharing"),
            ("ceiling_rps", "keys only (ceiling)"),
        ]
    ):
        ax1.bar([i + (k - 1) * w for i in x], [r[key] for r in rows], w, label=name)
    ax1.set_xticks(list(x), labels)
    ax1.set_ylabel("requests per second (host CPU)")
    ax1.legend()
    fig.suptitle(f"Prefix-cache block manager, {meta['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- The figures the explainer's sentences quote (bench.FIGURES); data is l3_prefix_cache.bench.json --


def _at(data, block_size: int, key: str = "python hash") -> dict:
    return next(r for r in data["rows"] if (r["block_size"], r["hash"]) == (block_size, key))


FIGURES = {
    "saved_blocks": lambda d: f"{_at(d, 16)['blocks_unshared'] - _at(d, 16)['blocks_shared']:,}",
    "used": lambda d: str(_at(d, 16)["blocks_shared"]),
    "unshared": lambda d: str(_at(d, 16)["blocks_unshared"]),
    "saved": lambda d: bench.num(_at(d, 16)["saved"]),
    "saved_256": lambda d: bench.num(_at(d, 256)["saved"]),
    "alloc_ceiling": lambda d: bench.num(_at(d, 16)["alloc_ceiling"]),
    "alloc_rps": lambda d: bench.num(_at(d, 16)["alloc_rps"]),
    "ceiling_rps": lambda d: bench.num(_at(d, 16)["ceiling_rps"]),
    "sha_us": lambda d: bench.num(_at(d, 16, "sha256")["alloc_us"]),
    "hash_us": lambda d: bench.num(_at(d, 16)["alloc_us"]),
    "sha_ceiling": lambda d: bench.num(_at(d, 16, "sha256")["alloc_ceiling"]),
}
