"""Well-formed UTF-8 in constrained replies: tokens a grammar mask allows but a decoder rejects.

xgrammar's masks accept any byte sequence of UTF-8's *shape* where a grammar allows a
character (a JSON string's), including surrogates (``ED A0..BF ..``), overlong forms
(``E0 80..9F ..``, ``F0 80..8F ..``), code points past U+10FFFF (``F4 90..BF ..``) and the
bytes that never occur in UTF-8 (``C0``, ``C1``, ``F5``–``FF``). A byte-level tokenizer can
sample them byte by byte, and decoding turns each such byte into U+FFFD: a string the grammar
counted as one character arrives as three, and the app's schema check (``maxLength``, an
``enum``) fails on a reply the constraint was meant to guarantee. :class:`Utf8Rule` turns
off, in a constrained row's mask, every token that contains such a pair or byte, and after a
token ending in a lead byte with a restricted follower (``E0``, ``ED``, ``F0``, ``F4``) every
token whose first byte is outside that follower's range — unless that would leave the row no
token, where the grammar's mask stands as it is. The combined mask is the one recorded for
the learner, so the learner scores each token under the mask it was drawn under.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

#: lead byte → the range its next byte must lie in (the other leads take 80..BF, which a
#: grammar's UTF-8 shape already requires)
FOLLOWERS = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}
#: bytes that never occur in UTF-8
NEVER = frozenset({0xC0, 0xC1, *range(0xF5, 0x100)})


def malformed(data: bytes) -> bool:
    """Whether ``data`` holds a byte that never occurs in UTF-8, or a restricted lead byte
    followed by a byte outside its range."""
    for i, byte in enumerate(data):
        if byte in NEVER:
            return True
        span = FOLLOWERS.get(byte)
        if span is not None and i + 1 < len(data) and not span[0] <= data[i + 1] <= span[1]:
            return True
    return False


def pack(allowed: np.ndarray, words: int) -> torch.Tensor:
    """``[vocab]`` bools → ``[words]`` int32 bitmask (bit ``i % 32`` of word ``i // 32``)."""
    bits = np.zeros(words * 32, dtype=np.uint64)
    bits[: len(allowed)] = allowed
    packed = (bits.reshape(words, 32) << np.arange(32, dtype=np.uint64)).sum(axis=1)
    return torch.from_numpy(packed.astype(np.uint32).view(np.int32))


class Utf8Rule:
    """The tokens of a vocabulary that keep a constrained reply well-formed UTF-8.

    Args:
        decoded_vocab: each token id's bytes (xgrammar's ``TokenizerInfo.decoded_vocab``).
        vocab_size: the model's logit width (ids past the vocabulary are left to the grammar).
        words: int32 words of a bitmask.
    """

    def __init__(self, decoded_vocab: Sequence[bytes], vocab_size: int, words: int) -> None:
        n = min(len(decoded_vocab), vocab_size)
        ok = np.ones(vocab_size, dtype=bool)
        first = np.full(vocab_size, -1)
        #: each token's last byte (-1: no bytes, or an id past the vocabulary)
        self.last = np.full(vocab_size, -1)
        for i in range(n):
            data = bytes(decoded_vocab[i])
            ok[i] = not malformed(data)
            if data:
                first[i], self.last[i] = data[0], data[-1]
        self.anywhere = pack(ok, words)
        self.after = {
            lead: pack(ok & ((first < 0) | ((first >= lo) & (first <= hi))), words)
            for lead, (lo, hi) in FOLLOWERS.items()
        }

    def allowed(self, last_byte: int | None) -> torch.Tensor:
        """The ``[words]`` bitmask of tokens that may follow a reply ending in ``last_byte``."""
        return self.after.get(last_byte, self.anywhere) if last_byte is not None else self.anywhere

    def last_byte(self, token: int) -> int | None:
        """``token``'s last byte (``None``: no bytes, or an id past the vocabulary)."""
        byte = int(self.last[token]) if 0 <= token < len(self.last) else -1
        return byte if byte >= 0 else None
