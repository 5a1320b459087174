"""Grammar-constrained decoding with XGrammar: JSON schema, any JSON object, regex, a choice of
strings, or an EBNF grammar. Grammars compile at submit (on the caller's thread, never the loop's)
in the matcher process, which keeps a bounded cache keyed by the grammar's text and each request's
matcher, advances it with each landed token and fills the next step's bitmask
(matcher_process.py: why a process)."""
from __future__ import annotations

import json
import os
import re
from typing import Any

from ..tokenizer import Tokenizer
from .matcher_process import MatcherProcess, finalize_discard

# Threads of the batched fill. XGrammar's default is half the cores; on the H200's 16-core host a fill
# of 32 / 64 rows took 0.29 / 0.36 ms that way (8 threads), 0.22 / 0.33 ms on 4 and 0.68 / 0.68 on 16
# (docs/benchmarks.md, run v): past four threads the fill only got slower.
FILL_THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))


class GrammarConstraint:
    """One request's grammar, whose matcher is in the matcher process. The scheduler binds it to the
    request's row at admission and frees it at release; here is kept only whether a stop token
    ended it (a matcher terminates when it accepts one: XGrammar's default)."""

    def __init__(self, process: MatcherProcess, mid: int, stop_ids: frozenset[int]) -> None:
        self.process = process
        self.mid = mid
        self.stop_ids = stop_ids
        self.terminated = False
        self.row = -1
        self._bound = [False]
        finalize_discard(self, process, mid, self._bound)

    def bind(self, row: int) -> None:
        self.row, self._bound[0] = row, True
        self.process.post(("bind", row, self.mid))

    def free(self) -> None:
        self.process.post(("free", self.row))

    def advance(self, token_id: int) -> None:
        self.terminated = token_id in self.stop_ids

    def is_terminated(self) -> bool:
        return self.terminated


class GrammarBackend:
    """The matcher process, started with our own tokenizer's vocabulary (offline), behind
    `constraint`."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int], runner: Any,
                 cache_size: int = 256) -> None:
        self.process = MatcherProcess(runner.shared, runner.signals, runner.shared_layout(), runner.max_rows,
                                      runner.slots[0].mask_host.shape[1], vocabulary(tokenizer, vocab_size),
                                      vocab_size, stop_token_ids, FILL_THREADS, cache_size)

    def constraint(self, option: str, value: Any) -> GrammarConstraint:
        """A fresh matcher for one request; a bad grammar raises ValueError naming the option."""
        try:
            text = canonical(option, value)
        except ValueError as e:
            raise ValueError(f"invalid {option}: not valid JSON ({e})") from None
        return GrammarConstraint(self.process, *self.process.compile(option, text))

    def close(self) -> None:
        self.process.close()


def vocabulary(tokenizer: Tokenizer, vocab_size: int) -> list[str]:
    """Each token id's text as the tokenizer stores it ("" for ids past its vocabulary)."""
    vocab = [""] * vocab_size
    for token, i in tokenizer.fast.get_vocab(with_added_tokens=True).items():
        if i < vocab_size:
            vocab[i] = token
    return vocab


def tokenizer_info(vocab: list[str], vocab_size: int, stop_token_ids: list[int]) -> Any:
    """XGrammar's view of a byte-level BPE vocabulary (`vocab[i]`: token i's text as the tokenizer stores it)."""
    import xgrammar as xgr

    return xgr.TokenizerInfo(vocab, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab_size, stop_token_ids=stop_token_ids)


def compile_grammar(compiler: Any, option: str, text: str) -> Any:
    compact = dict(any_whitespace=False, separators=(",", ":"))  # free whitespace lets a model loop forever
    if option in ("json_schema", "json_object"):
        return compiler.compile_json_schema(text, **compact)
    if option == "regex":
        return compiler.compile_regex(text)
    return compiler.compile_grammar(text)  # "grammar", and "choice" rendered as EBNF


def canonical(option: str, value: Any) -> str:
    """The text a grammar compiles from: the schema as JSON (property order kept: it is the order of
    generation), a choice as an EBNF rule."""
    if option == "json_schema":
        schema = json.loads(value) if isinstance(value, str) else value
        return json.dumps(schema)
    if option == "json_object":
        return json.dumps({"type": "object"})
    if option == "choice":
        return "root ::= " + " | ".join(json.dumps(c) for c in value)
    return value


def xgrammar_message(e: Exception) -> str:
    """XGrammar's error text without its '[time] source.cc:line:' prefix."""
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip().splitlines()[0])
