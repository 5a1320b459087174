"""Tokenizer (a `tokenizers` fast tokenizer from tokenizer.json or GGUF metadata) and the
incremental detokenizer that the commit uses to stream text as tokens arrive."""
from __future__ import annotations

import codecs
import json
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4


class Tokenizer:
    def __init__(self, fast: FastTokenizer, chat_template: str | None = None, bos_token: str | None = None,
                 eos_token: str | None = None) -> None:
        self.fast = fast
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token

    @property
    def vocab_size(self) -> int:
        return self.fast.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.fast.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self.fast.decode(ids, skip_special_tokens=True)

    def token_id(self, token: str) -> int | None:
        return self.fast.token_to_id(token)

    @cached_property
    def token_bytes(self) -> list[bytes] | None:
        """Each token id's bytes (special tokens: none) when decoding is plain byte-level BPE, so the
        detokenizer can append bytes instead of re-decoding; None for any other decoder."""
        if not isinstance(self.fast.decoder, decoders.ByteLevel):
            return None
        to_byte = _byte_level_inverse()
        special = {t.content for t in self.fast.get_added_tokens_decoder().values() if t.special}
        vocab = self.fast.get_vocab(with_added_tokens=True)
        table = [b""] * (max(vocab.values()) + 1)
        for token, i in vocab.items():
            if token not in special:
                table[i] = b"".join(bytes([to_byte[c]]) if c in to_byte else c.encode() for c in token)
        return table

    @cached_property
    def max_token_bytes(self) -> int:
        """The most bytes of text one token can stand for: a text of B bytes encodes to at least
        B / this many tokens (exactly so for byte-level BPE; a normalizer could shrink text first,
        so with one the bound is loosened fourfold)."""
        table = self.token_bytes
        if table is not None:  # (special tokens are matched in text by their content)
            added = self.fast.get_added_tokens_decoder().values()
            longest = max([len(b) for b in table] + [len(t.content.encode()) for t in added])
        else:
            longest = max(len(t.encode()) for t in self.fast.get_vocab(with_added_tokens=True))
        return max(1, longest) * (4 if self.fast.normalizer is not None else 1)

    @classmethod
    def from_dir(cls, path: Path) -> "Tokenizer":
        file = path / "tokenizer.json"
        if not file.exists():
            raise FileNotFoundError(f"{path}: no tokenizer.json (slipstream reads fast tokenizers only)")
        try:
            fast = FastTokenizer.from_file(str(file))
        except Exception as e:
            raise ValueError(f"{file}: cannot be parsed as a tokenizers file: {e}") from None
        cfg: dict[str, Any] = {}
        cfg_file = path / "tokenizer_config.json"
        if cfg_file.exists():
            try:
                cfg = json.loads(cfg_file.read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{cfg_file}: malformed JSON ({e})") from None
        return cls(fast, cfg.get("chat_template"), _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token")))

    @classmethod
    def from_gguf(cls, meta: dict[str, Any], source: str) -> "Tokenizer":
        """A byte-level BPE tokenizer from GGUF's tokenizer.ggml.* fields."""
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"{source}: GGUF tokenizer model {kind!r} is not supported (byte-level BPE 'gpt2' is)")
        tokens = meta["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        fast = FastTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if meta.get("tokenizer.ggml.pre") == "smollm":  # SmolLM splits every digit on its own
            fast.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            fast.pre_tokenizer = byte_level
        fast.decoder = decoders.ByteLevel()
        types = meta.get("tokenizer.ggml.token_type") or []
        fast.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                                 for i, t in enumerate(types) if t == _GGUF_CONTROL])
        fast.add_tokens([AddedToken(tokens[i], normalized=False)
                         for i, t in enumerate(types) if t == _GGUF_USER_DEFINED])
        def token(key: str) -> str | None:
            return tokens[meta[key]] if key in meta else None

        return cls(fast, meta.get("tokenizer.chat_template"), token("tokenizer.ggml.bos_token_id"),
                   token("tokenizer.ggml.eos_token_id"))


def _token_text(v: Any) -> str | None:
    """tokenizer_config.json gives special tokens as strings or as {"content": ...} dicts."""
    return v.get("content") if isinstance(v, dict) else v


def _byte_level_inverse() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte, inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class IncrementalDetokenizer:
    """Turns a growing token list into text deltas without ever emitting half a UTF-8 character:
    a byte-level token can end mid-character, so text is released only once it decodes cleanly.

    Byte-level tokenizers take the fast path (each token's bytes into an incremental UTF-8 decoder,
    microseconds per token, which matters in a commit of 64 rows); others re-decode a small window
    per token, as vLLM does."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.table = tokenizer.token_bytes
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.ids: list[int] = []
        self.prefix = 0
        self.read = 0

    def push(self, token_id: int) -> str:
        if self.table is not None:
            return self.utf8.decode(self.table[token_id] if token_id < len(self.table) else b"")
        self.ids.append(token_id)
        before = self.tokenizer.decode(self.ids[self.prefix:self.read])
        after = self.tokenizer.decode(self.ids[self.prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):]

    def flush(self) -> str:
        """Whatever is still held back (an unfinished UTF-8 sequence), decoded as it is."""
        if self.table is not None:
            return self.utf8.decode(b"", final=True)
        before = self.tokenizer.decode(self.ids[self.prefix:self.read])
        after = self.tokenizer.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):]



def render_chat_template(tokenizer: Tokenizer, messages: list[dict[str, Any]]) -> str:
    """Render a conversation with the tokenizer's Jinja chat template, as transformers does
    (sandboxed, trim_blocks/lstrip_blocks, add_generation_prompt=True)."""
    if not tokenizer.chat_template:
        raise ValueError("this model has no chat template (tokenizer_config.json or GGUF metadata); "
                         "use generate() with a plain prompt")
    if not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise ValueError("chat messages must be dicts with 'role' and 'content'")
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(tokenizer.chat_template).render(
            messages=messages, add_generation_prompt=True, bos_token=tokenizer.bos_token or "",
            eos_token=tokenizer.eos_token or "")
    except TemplateError as e:
        raise ValueError(f"the chat template rejected the conversation: {e}") from None
