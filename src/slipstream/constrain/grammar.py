"""Grammar-constrained decoding with XGrammar: JSON schema, any JSON object, regex, a choice of
strings, or an EBNF grammar. Grammars compile at submit (on the caller's thread, never the loop's),
through a bounded cache keyed by the grammar's text; each request gets its own matcher, which the
commit advances with the committed token and the finalize turns into the next step's bitmask."""
from __future__ import annotations

import json
import os
import re
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from ..tokenizer import Tokenizer


# Threads of the batched fill. XGrammar's default is half the cores; on the H200's 16-core host a fill
# of 32 / 64 rows took 0.29 / 0.36 ms that way (8 threads), 0.22 / 0.33 ms on 4 and 0.68 / 0.68 on 16
# (docs/benchmarks.md, run v): past four threads the fill only got slower.
FILL_THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))


class GrammarConstraint:
    """One request's XGrammar matcher behind the engine's TokenConstraint hook."""

    batch = None  # XGrammar's batch matcher (its thread pool), shared by every request

    def __init__(self, compiled: Any) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        # A matcher terminates when it accepts a stop token (XGrammar's default), so that is kept here
        # rather than asked of XGrammar twice a row at every tick (finalize and stop check): the tick's
        # calls into XGrammar stay one accept a row and the batched fill.
        self.stop_ids = frozenset(self.matcher.stop_token_ids)
        self.terminated = False

    def advance(self, token_id: int) -> None:
        if not self.matcher.accept_token(token_id):
            raise RuntimeError(f"token {token_id} was sampled against its grammar mask")
        self.terminated = token_id in self.stop_ids

    def fill_mask(self, words: np.ndarray) -> None:
        self.matcher.fill_next_token_bitmask(torch.from_numpy(words)[None], 0)

    def is_terminated(self) -> bool:
        return self.terminated

    @classmethod
    def fill_masks(cls, constraints: list["GrammarConstraint"], words: np.ndarray, rows: list[int]) -> None:
        """Fill many rows' bitmasks at once, in parallel threads inside XGrammar."""
        if cls.batch is None:
            import xgrammar as xgr

            cls.batch = xgr.BatchGrammarMatcher(FILL_THREADS)
        cls.batch.batch_fill_next_token_bitmask([c.matcher for c in constraints], words, rows)


def hold_lock_in_matcher_calls() -> None:
    """Make a matcher's own calls (accepting a token: a microsecond or two, once a constrained row a
    tick on the loop thread) keep the interpreter lock. tvm-ffi lets go of it around every call
    by default, and taking it back waits for any other thread that took it meanwhile: beside a busy
    Python thread, 64 accepts took 225 ms instead of 0.06 (the CPU machine). The batched fill, long
    and run on XGrammar's own threads, still lets go. XGrammar builds without tvm-ffi are left as
    they are."""
    try:
        from xgrammar.tvm_ffi_binding import _ffi_api

        methods = _ffi_api.GrammarMatcher.__tvm_ffi_type_info__.methods
    except (ImportError, AttributeError):
        return
    for method in methods:
        method.func.release_gil = False


class GrammarBackend:
    """XGrammar's tokenizer info built from our own tokenizer (offline), its compiler, and a bounded
    cache of compiled grammars."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, stop_token_ids: list[int], cache_size: int = 256,
                 threads: int = 2) -> None:
        import xgrammar as xgr

        encoded = [""] * vocab_size
        for token, i in tokenizer.fast.get_vocab(with_added_tokens=True).items():
            if i < vocab_size:
                encoded[i] = token
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=vocab_size,
                                 stop_token_ids=stop_token_ids)
        hold_lock_in_matcher_calls()
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads)
        self.cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.cache_size = cache_size
        self.lock = threading.Lock()

    def constraint(self, option: str, value: Any) -> GrammarConstraint:
        """A fresh matcher for one request; a bad grammar raises ValueError naming the option."""
        try:
            key = (option, _canonical(option, value))
        except ValueError as e:
            raise ValueError(f"invalid {option}: not valid JSON ({e})") from None
        with self.lock:
            compiled = self.cache.get(key)
            if compiled is not None:
                self.cache.move_to_end(key)
        if compiled is None:
            try:
                compiled = self._compile(option, key[1])
            except RuntimeError as e:
                raise ValueError(f"invalid {option}: {_xgrammar_message(e)}") from None
            with self.lock:
                self.cache[key] = compiled
                while len(self.cache) > self.cache_size:
                    self.cache.popitem(last=False)
        return GrammarConstraint(compiled)

    def _compile(self, option: str, text: str) -> Any:
        compact = dict(any_whitespace=False, separators=(",", ":"))  # free whitespace lets a model loop forever
        if option in ("json_schema", "json_object"):
            return self.compiler.compile_json_schema(text, **compact)
        if option == "regex":
            return self.compiler.compile_regex(text)
        return self.compiler.compile_grammar(text)  # "grammar", and "choice" rendered as EBNF


def _canonical(option: str, value: Any) -> str:
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


def _xgrammar_message(e: Exception) -> str:
    """XGrammar's error text without its '[time] source.cc:line:' prefix."""
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip().splitlines()[0])
