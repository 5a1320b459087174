"""Small token constraints for tests of the bitmask hook (real grammars come from a library)."""
import numpy as np


def allow_only(words: np.ndarray, token: int) -> None:
    words.view(np.uint32)[token >> 5] = np.uint32(1 << (token & 31))


class Successor:
    """After the first token, only (previous committed token + 1) mod vocab is allowed. A mask built
    from anything but the freshly committed state breaks the chain."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.last: int | None = None

    def advance(self, token_id: int) -> None:
        self.last = token_id

    def is_terminated(self) -> bool:
        return False

    def fill_mask(self, words: np.ndarray) -> None:
        if self.last is None:
            words[:] = -1
        else:
            allow_only(words, (self.last + 1) % self.vocab_size)


class ForceAt:
    """Allows everything, except that at output index `index` only `token` is allowed."""

    def __init__(self, index: int, token: int) -> None:
        self.index, self.token, self.count = index, token, 0

    def advance(self, token_id: int) -> None:
        self.count += 1

    def is_terminated(self) -> bool:
        return False

    def fill_mask(self, words: np.ndarray) -> None:
        if self.count == self.index:
            allow_only(words, self.token)
        else:
            words[:] = -1


class ForceSequence:
    """Forces the given tokens one after another, then allows everything."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens, self.count = tokens, 0

    def advance(self, token_id: int) -> None:
        self.count += 1

    def is_terminated(self) -> bool:
        return False

    def fill_mask(self, words: np.ndarray) -> None:
        if self.count < len(self.tokens):
            allow_only(words, self.tokens[self.count])
        else:
            words[:] = -1
