"""Committed tokens to text: incremental detokenization, stop strings matched on the text, and
hold-back of any tail that could still turn into a stop string, so streamed text never has to
be taken back and always concatenates to the final text."""
from __future__ import annotations

from .tokenizer import IncrementalDetokenizer, Tokenizer


class TextStream:
    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stop = stop
        self.longest_stop = max((len(s) for s in stop), default=0)
        self.text = ""
        self.emitted = 0
        self.stopped = False  # a stop string appeared; text ends just before it

    def push(self, token_id: int) -> str:
        """Add a committed token; returns the text that is now safe to emit."""
        if not self.stop:  # (the common case, per row of every commit: nothing is ever held back)
            piece = self.detok.push(token_id)
            self.text += piece
            self.emitted = len(self.text)
            return piece
        self._append(self.detok.push(token_id))
        return self._release(final=self.stopped)

    def finish(self) -> str:
        """The request ended: flush bytes of an unfinished character and release held-back text."""
        if not self.stopped:
            self._append(self.detok.flush())
        return self._release(final=True)

    def _append(self, piece: str) -> None:
        if not piece or self.stopped:
            return
        start = max(0, len(self.text) - self.longest_stop + 1)
        self.text += piece
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
            self.stopped = True

    def _release(self, final: bool) -> str:
        end = len(self.text) if final else len(self.text) - self._holdback()
        delta = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return delta

    def _holdback(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best
