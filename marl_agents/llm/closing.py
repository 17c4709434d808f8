"""Replies that always close: the shortest completion of a grammar state, in tokens.

A constrained reply must end as a complete value within ``max_new_tokens``. The grammar alone
does not see the budget: it accepts every tokenisation of every value, and a sampled reply may
take a long one (``{"next": "FI`` cut at the budget). :class:`Closer` measures, from a
matcher's state, the fewest tokens *of this tokenizer* that complete the grammar
(:meth:`Closer.distance`), and the **closing mask** (:meth:`Closer.closing_mask`): the tokens
``t`` the grammar allows after which the rest still fits, ``1 + distance(after t) <= budget``.
:class:`~marl_agents.llm.constraints.RowMatchers` samples under the closing mask once the
budget left comes within :data:`MARGIN` tokens of the distance; with exactly the distance left,
only tokens on a shortest completion remain. The mask is recorded with the token like any
grammar mask (``TOKEN_MASK``), so the learner scores the token under it and the ratio stays
exact.

**Search.** Breadth-first over tokens from the matcher's state (``fill_next_token_bitmask``,
``accept_token`` / ``rollback``, ``fork``), states merged by a key: xgrammar's parser state
(``_debug_print_internal_state``, positions made relative: assumption 1 below) with the JSON
skeleton of the accepted text (:class:`Scan`: open brackets, the last key and item count of
each, whether a string or an escape is open — the parser state alone does not show how deep a
recursive rule is nested). Inside a free string every continuing token reaches the same key,
so the frontier stays small. Distances found are memoised per key (exact for the states on a
shortest path; a search that finds none within its limit caches nothing), closing masks per
key and budget.

xgrammar assumptions (0.2.x):

1. ``GrammarMatcher._debug_print_internal_state()`` prints ``There are N steps in history.
   Last step: [ParserState(rule_id=…, sequence_id=…, element_id=…, rule_start_pos=P, …)]``;
   ``P`` counts steps, so ``P - N`` is the same for the same state reached at another length.
2. ``GrammarMatcher(compiled, max_rollback_tokens=-1)`` rolls back any number of tokens;
   ``fork()`` copies the state.

**Limit.** A token that raises the distance by more than :data:`MARGIN` at once while the
budget left is above ``distance + MARGIN`` can still leave a reply that cannot close (none of
the schemas in the tests or apps does); such a reply is then cut at ``max_new_tokens``, named
so where it surfaces.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

#: budget left (above the distance) at which the closing mask replaces the grammar's
MARGIN = 8
#: memoised distances per grammar before the memo starts over
MEMO_MAX = 200_000
#: keys explored per search before it gives up (the distance is then unknown: no mask)
SEARCH_MAX = 20_000

_POS = re.compile(r"rule_start_pos=(-?\d+)")
_STEPS = re.compile(r"There are (\d+) steps in history\.")


class Scan:
    """The JSON skeleton of accepted bytes (immutable; :meth:`advance` returns a new one).

    ``key`` holds what the grammar's parser state does not show: each open container's bracket,
    its last key (objects) and item count, and whether a string or an escape is open; the text
    of an open string is not part of it."""

    __slots__ = ("cur", "esc", "in_str", "key", "stack")

    def __init__(
        self,
        stack: tuple[tuple[int, int, bytes], ...] = (),
        in_str: bool = False,
        esc: bool = False,
        cur: bytes = b"",
    ) -> None:
        self.stack, self.in_str, self.esc, self.cur = stack, in_str, esc, cur
        self.key = (stack, in_str, esc)

    def advance(self, data: bytes) -> Scan:
        stack, in_str, esc, cur = list(self.stack), self.in_str, self.esc, self.cur
        for b in data:
            if in_str:
                if esc:
                    esc = False
                elif b == 0x5C:  # backslash
                    esc = True
                elif b == 0x22:  # closing quote: the string is the container's last key
                    in_str = False
                    if stack and stack[-1][0] == 0x7B:
                        stack[-1] = (stack[-1][0], stack[-1][1], cur[:32])
                else:
                    cur += bytes((b,))
            elif b == 0x22:
                in_str, cur = True, b""
            elif b in (0x7B, 0x5B):  # { [
                stack.append((b, 0, b""))
            elif b in (0x7D, 0x5D) and stack:  # } ]
                stack.pop()
            elif b == 0x2C and stack:  # ,
                stack[-1] = (stack[-1][0], stack[-1][1] + 1, stack[-1][2])
        return Scan(tuple(stack), in_str, esc, cur if in_str else b"")


def parser_state(matcher: Any) -> str:
    """The matcher's parser state with positions relative to its length (assumption 1)."""
    text = matcher._debug_print_internal_state()
    found = _STEPS.search(text)
    steps = int(found.group(1)) if found else 0
    body = text[found.end() :] if found else text
    return _POS.sub(lambda m: f"p{int(m.group(1)) - steps if int(m.group(1)) >= 0 else -1}", body)


class Closer:
    """Shortest completions of one compiled grammar in one tokenizer's tokens, memoised.

    Args:
        decoded_vocab: each token id's bytes (xgrammar's ``TokenizerInfo.decoded_vocab``).
        words: int32 words of a bitmask.
        stop_ids: token ids that end a reply (never part of a completion; allowed where the
            grammar is complete).
    """

    def __init__(self, decoded_vocab: Sequence[bytes], words: int, stop_ids: Sequence[int]) -> None:
        self.vocab = list(decoded_vocab)
        self.words = words
        self.stops = sorted(int(s) for s in stop_ids)
        self.dist: dict[tuple[Any, ...], int] = {}
        self.masks: dict[tuple[tuple[Any, ...], int], torch.Tensor] = {}

    def key(self, matcher: Any, scan: Scan) -> tuple[Any, ...]:
        return (parser_state(matcher), scan.key)

    def _allowed(self, matcher: Any) -> np.ndarray:
        bits = torch.zeros((1, self.words), dtype=torch.int32)
        matcher.fill_next_token_bitmask(bits, 0)
        raw = bits.numpy().view(np.uint8)
        ids = np.flatnonzero(np.unpackbits(raw, bitorder="little"))
        return ids[ids < len(self.vocab)]

    def _children(self, matcher: Any, scan: Scan) -> list[tuple[int, tuple[Any, ...], Any, Scan]]:
        """``(token, key, matcher after it or None where an earlier token reached that key,
        scan)`` per grammar-allowed token that is not a stop id; ``matcher`` is left as it was."""
        out: list[tuple[int, tuple[Any, ...], Any, Scan]] = []
        seen: set[tuple[Any, ...]] = set()
        stops = set(self.stops)
        for t in self._allowed(matcher).tolist():
            if t in stops or not matcher.accept_token(t):
                continue
            child_scan = scan.advance(self.vocab[t])
            key = (parser_state(matcher), child_scan.key)
            fork = None
            if key not in seen:
                seen.add(key)
                fork = matcher.fork()
            out.append((t, key, fork, child_scan))
            matcher.rollback(1)
        return out

    def distance(
        self, matcher: Any, scan: Scan, limit: int, key: tuple[Any, ...] | None = None
    ) -> int | None:
        """The fewest tokens that complete the grammar from ``matcher``'s state (``None``: more
        than ``limit``, or the search ran past :data:`SEARCH_MAX` states); ``key``: the state's
        :meth:`key` if known."""
        root = key if key is not None else self.key(matcher, scan)
        if matcher.is_completed():
            return 0
        if root in self.dist:
            return self.dist[root] if self.dist[root] <= limit else None
        if len(self.dist) > MEMO_MAX:
            self.dist.clear()
        parent: dict[tuple[Any, ...], tuple[Any, ...] | None] = {root: None}
        depth = {root: 0}
        level: list[tuple[tuple[Any, ...], Any, Scan]] = [(root, matcher, scan)]
        best, best_key, d = limit + 1, None, 0
        while level and d < best:
            nxt: list[tuple[tuple[Any, ...], Any, Scan]] = []
            for key, m, sc in level:
                known = 0 if m.is_completed() else self.dist.get(key)
                if known is not None:
                    if d + known < best:
                        best, best_key = d + known, key
                    continue
                if d + 1 >= best:
                    continue
                for _, ckey, child, cscan in self._children(m, sc):
                    if child is None or ckey in depth:
                        continue
                    depth[ckey], parent[ckey] = d + 1, key
                    nxt.append((ckey, child, cscan))
                if len(depth) > SEARCH_MAX:
                    return None
            level, d = nxt, d + 1
        if best_key is None:
            return None
        key: tuple[Any, ...] | None = best_key
        while key is not None:  # states on a shortest path: their distance is exact
            self.dist[key] = best - depth[key]
            key = parent[key]
        return best

    def closing_mask(
        self, matcher: Any, scan: Scan, budget: int, key: tuple[Any, ...] | None = None
    ) -> torch.Tensor:
        """``[words]`` int32: the grammar-allowed tokens after which the rest still fits in
        ``budget - 1`` tokens, and the stop ids where the grammar is complete (all zeros: no
        token keeps the reply closable); memoised by state and budget."""
        memo = (key if key is not None else self.key(matcher, scan), int(budget))
        found = self.masks.get(memo)
        if found is not None:
            return found
        if len(self.masks) > MEMO_MAX:
            self.masks.clear()
        allowed = np.zeros(self.words * 32, dtype=np.uint8)
        if matcher.is_completed():
            allowed[self.stops] = 1
        fits: dict[tuple[Any, ...], bool] = {}
        for t, key, child, cscan in self._children(matcher, scan):
            if child is not None:
                d = self.distance(child, cscan, budget - 1)
                fits[key] = d is not None and 1 + d <= budget
            if fits[key]:
                allowed[t] = 1
        packed = np.packbits(allowed, bitorder="little").view(np.int32)
        mask = self.masks[memo] = torch.from_numpy(packed.copy())
        return mask


__all__ = ["MARGIN", "Closer", "Scan", "parser_state"]
