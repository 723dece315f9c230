"""The tokenizer and chat template stored in the model's GGUF file.

The file carries a byte-level BPE vocabulary (`tokenizer.ggml.model` = "gpt2"): tokens, merges, token
types, the special token ids, and the Jinja chat template. They are rebuilt here as a fast tokenizer of
the `tokenizers` package (the Rust library behind transformers' fast tokenizers) without transformers:

  pre-tokenizer  every digit alone, then GPT-2's split and byte-to-unicode mapping: what the file's
                 `tokenizer.ggml.pre` = "smollm" means in llama.cpp, and what SmolLM2's own
                 tokenizer.json says (Digits(individual_digits) + ByteLevel)
  model          BPE over the file's vocabulary and merges (both already in byte-level spelling)
  special tokens the tokens the file marks as control (type 3), matched whole in the text, so the
                 template's <|im_start|> is one token
  decoder        byte-level: token spellings back to UTF-8 bytes

The chat template is rendered with Jinja2 in a sandbox, the way transformers renders it.
"""

from __future__ import annotations

from pathlib import Path

from drills.engine.loader import INSTALL_HINT, _metadata, open_gguf

CONTROL = 3  # llama.cpp's token type of a special token (<|im_start|>, <|endoftext|>, ...)
SUPPORTED_PRE = {"smollm"}  # the pre-tokenizer rules this file knows how to rebuild


class Tokenizer:
    """encode / decode / apply_chat_template for the model in a GGUF file."""

    def __init__(self, backend, chat_template: str, bos_token_id, eos_token_id, add_bos: bool, specials):
        self.backend = backend  # a tokenizers.Tokenizer
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id  # <|im_end|> for SmolLM2-Instruct: the end of an assistant turn
        self.add_bos = add_bos
        self.special_token_ids = frozenset(specials)
        self._template = None

    @classmethod
    def from_gguf(cls, path: str | Path | None = None) -> Tokenizer:
        """The tokenizer of the GGUF file at `path` (SmolLM2-135M-Instruct's when None; or an open GGUFReader)."""
        try:
            from tokenizers import AddedToken, decoders, models, pre_tokenizers
            from tokenizers import Tokenizer as Backend
        except ModuleNotFoundError:
            raise ModuleNotFoundError(f"the tokenizer needs the package tokenizers: {INSTALL_HINT}") from None
        reader = open_gguf(path)
        kind, pre = _metadata(reader, "tokenizer.ggml.model"), _metadata(reader, "tokenizer.ggml.pre", "")
        if kind != "gpt2" or pre not in SUPPORTED_PRE:
            # Another BPE split (llama3, qwen2, ...) would tokenize text differently from the model's training.
            raise ValueError(
                f"only byte-level BPE with pre-tokenizer {SUPPORTED_PRE} is rebuilt, got {kind}/{pre}"
            )
        tokens = _metadata(reader, "tokenizer.ggml.tokens")
        types = _metadata(reader, "tokenizer.ggml.token_type")
        merges = [tuple(m.split(" ")) for m in _metadata(reader, "tokenizer.ggml.merges")]

        bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
        backend = Backend(bpe)
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                # add_prefix_space=False: the file says tokenizer.ggml.add_space_prefix = false.
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        backend.decoder = decoders.ByteLevel()
        specials = [i for i, t in enumerate(types) if t == CONTROL]
        # Already in the vocabulary, so adding them keeps their ids; normalized=False matches them verbatim.
        backend.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in specials])
        return cls(
            backend,
            chat_template=_metadata(reader, "tokenizer.chat_template"),
            bos_token_id=int(_metadata(reader, "tokenizer.ggml.bos_token_id")),
            eos_token_id=int(_metadata(reader, "tokenizer.ggml.eos_token_id")),
            add_bos=bool(_metadata(reader, "tokenizer.ggml.add_bos_token", False)),
            specials=specials,
        )

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token(self, token_id: int) -> str:
        return self.backend.id_to_token(token_id)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text (<|im_start|>) become their ids."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        return [self.bos_token_id, *ids] if self.add_bos else ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` ([{"role": "user", "content": "..."}, ...]) by the file's template;
        add_generation_prompt ends it with the assistant header, so the model writes the reply next."""
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message):
                raise ValueError(message)

            # trim_blocks / lstrip_blocks: the settings HF chat templates are written for.
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.chat_template)
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            bos_token=self.token(self.bos_token_id),
            eos_token=self.token(self.eos_token_id),
        )

    def encode_chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt))
