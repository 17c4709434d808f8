"""Constrained decoding: replies that parse, from the schema the app itself declares.

When an app's chat model is bound to tools (``bind_tools``, ``with_structured_output``, which
binds its schema as a forced tool) or asked for a JSON reply (``response_format``), the call
declares a :class:`Constraint`. The sampler compiles it into a grammar with **xgrammar**
(vLLM's and SGLang's grammar engine; the ``llm`` extra) and, at each generated token, keeps
only the tokens the grammar allows: ``logits`` outside the row's bitmask become ``-inf``
before the softmax, so the sampled ids and their behaviour logprobs are those of the
**masked, renormalised** distribution. The bitmask of every generated token travels with the
row (``Generation.token_masks``, the module's :data:`~marl_agents.llm.rl_module.TOKEN_MASK`
column) and the learner scores the token under the same mask (:func:`mask_logits`), so the
GRPO ratio compares the policy that sampled with itself.

What a constraint allows (the tool-call text of :mod:`scenarios.toolcalls`):

* **forced tools** (``tool_choice`` ``"any"``/``"required"``/a tool's name, as
  ``with_structured_output`` binds its schema): exactly one
  ``<tool>{"name": "<tool>", "arguments": {...}}</tool>`` whose arguments follow the tool's
  JSON schema, then EOS;
* **optional tools** (``tool_choice`` ``None``/``"auto"``): free text, and wherever ``<tool>``
  starts, a call as above (xgrammar's structural tags); ``"none"``: no constraint;
* **a JSON reply** (``response_format``: ``{"type": "json_schema", "json_schema": {"schema":
  ...}}``, ``{"type": "json_object"}``, a Pydantic model / TypedDict / schema dict): the whole
  reply is one JSON value of the schema.

A ``prefix`` (the chat model's ``prefill``) is text already in the prompt: the grammar is
advanced over it before the first sampled token.

**A constraint belongs to its call.** A chat model in a GraphEnv episode hands the
environment a token-id observation; the call's decoding settings (:class:`CallSettings`: its
constraint and, for a free reply, its ``stop`` strings) ride on that very array
(:class:`CallObservation`, made by :func:`with_constraint`; read back by :func:`call_of` /
:func:`constraint_of`). The sampler that batches the rows — the batched env runner, RLlib's
env runner through :mod:`marl_agents.llm.constraint_connector`, ``marl eval`` — puts each
row's :func:`call_key` into the forward batch (``CONSTRAINT_KEY``), and the module samples
each row under its own grammar and ends it at its own stop strings (the action, its behaviour
logprobs and masks are the ids up to and with the token completing the stop string, padded
as a reply ended by EOS is: :mod:`marl_agents.llm.stop_strings`). Two calls with the same
prompt ids (a prompt cut by ``max_prompt_tokens``, the same messages with another
``tool_choice``) and different settings are two decisions; nothing is keyed by prompt ids.
The bound tools are rendered into the prompt as before (their descriptions in the system
message); ``tool_choice`` and ``response_format`` are not (the chat templates here have no
slot for them): the grammar applies them, and the learner scores every token under the mask
it was drawn from.

**Replies that always close.** :class:`RowMatchers` gets each row's budget left; once it
comes within :data:`~marl_agents.llm.closing.MARGIN` of the fewest tokens that still complete
the grammar (:mod:`marl_agents.llm.closing`), the row samples under the closing mask (only
tokens after which the reply still closes in time; with exactly that many left, only tokens on
a shortest completion). That mask is the one recorded in ``TOKEN_MASK``. (The vLLM sampler
applies the grammar alone: vLLM does not see the budget, so a reply it cuts is named as cut
where it surfaces, ``reply cut at max_new_tokens=…``.) A constraint whose
shortest reply exceeds ``max_new_tokens`` is refused (:func:`check_reply_budget`:
:class:`ReplyBudgetError` naming the agent, the schema, its shortest length in this
tokenizer's tokens and the ``max_new_tokens`` to set), at plan time when the plan's trial
episode meets the call, else at the call (a 400 through the endpoint).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from marl_agents.llm.closing import MARGIN, Closer, Scan
from scenarios.toolcalls import CLOSE, OPEN
from topologies.errors import MarlError

__all__ = [
    "FREE",
    "CallObservation",
    "CallSettings",
    "Constraint",
    "ConstraintError",
    "ReplyBudgetError",
    "RowMatchers",
    "call_key",
    "call_of",
    "check_reply_budget",
    "constraint_keys",
    "constraint_of",
    "describe",
    "keyed_call",
    "keyed_constraint",
    "mask_logits",
    "mask_words",
    "replay_masks",
    "shortest_reply_tokens",
    "unpack_mask",
    "with_constraint",
]

#: ``tool_choice`` values that force one call
_FORCED = ("any", "required")


class ConstraintError(MarlError, ValueError):
    """A constraint that cannot be compiled or applied; the message names it and the fix."""


class ReplyBudgetError(ConstraintError):
    """A constrained reply that cannot close within ``max_new_tokens`` even at its shortest."""


@dataclasses.dataclass(frozen=True)
class Constraint:
    """What a reply must parse as (hashable; compiled once per tokenizer).

    Attributes:
        kind: ``"tools"`` (calls in the ``<tool>`` format) or ``"json"`` (one JSON value).
        spec: canonical JSON: the tools' ``[{"name", "parameters"}]`` or the JSON schema.
        forced: ``kind == "tools"``: exactly one call and nothing else.
        prefix: text already generated (a prefill) that the grammar consumes first.
    """

    kind: str
    spec: str
    forced: bool = False
    prefix: str = ""

    @classmethod
    def for_call(
        cls,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: Any = None,
        response_format: Any = None,
        prefix: str = "",
    ) -> Constraint | None:
        """The constraint a chat-model call declares (``None``: free text).

        Args:
            tools: OpenAI tool dicts (``convert_to_openai_tool``).
            tool_choice: as given to ``bind_tools``.
            response_format: an OpenAI ``response_format`` dict, a Pydantic model, a
                TypedDict or a JSON schema dict.
            prefix: the reply's prefill.
        """
        if response_format is not None:
            return cls("json", _canonical(_response_schema(response_format)), prefix=prefix)
        if not tools or tool_choice == "none":
            return None
        listed = [t.get("function", t) for t in tools]
        specs = [{"name": f["name"], "parameters": f.get("parameters") or {}} for f in listed]
        forced = tool_choice in _FORCED or tool_choice is True
        name = _chosen_name(tool_choice)
        if name is not None:
            specs = [s for s in specs if s["name"] == name]
            if not specs:
                raise ConstraintError(
                    f"tool_choice names {name!r}, which is not among the bound tools "
                    f"{[f['name'] for f in listed]}: bind it or name a bound tool"
                )
            forced = True
        return cls("tools", _canonical(specs), forced=forced, prefix=prefix)

    def grammar(self) -> Any:
        """The xgrammar ``Grammar`` of this constraint."""
        xgr = _xgrammar()
        if self.kind == "json":
            return xgr.Grammar.from_json_schema(self.spec, any_whitespace=False)
        specs = json.loads(self.spec)
        if self.forced:
            calls = [
                xgr.Grammar.concat(
                    _literal(f'{OPEN}{{"name": {json.dumps(s["name"])}, "arguments": '),
                    xgr.Grammar.from_json_schema(
                        _canonical(_object_schema(s["parameters"])), any_whitespace=False
                    ),
                    _literal("}" + CLOSE),
                )
                for s in specs
            ]
            return calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)
        tags = [
            xgr.StructuralTagItem(
                begin=f'{OPEN}{{"name": {json.dumps(s["name"])}, "arguments": ',
                schema=_canonical(_object_schema(s["parameters"])),
                end="}" + CLOSE,
            )
            for s in specs
        ]
        return xgr.Grammar.from_structural_tag(tags, [OPEN])

    def ebnf(self) -> str:
        """:meth:`grammar` as xgrammar EBNF text (cached): what an engine compiles itself
        (vLLM's ``StructuredOutputsParams(grammar=...)``) to constrain to the same language."""
        return _ebnf(dataclasses.replace(self, prefix=""))


@functools.lru_cache(maxsize=256)
def _ebnf(c: Constraint) -> str:
    return str(c.grammar())


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=False, separators=(",", ":"))


def _chosen_name(tool_choice: Any) -> str | None:
    if isinstance(tool_choice, str) and tool_choice not in (*_FORCED, "auto", "none"):
        return tool_choice
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function", tool_choice)
        return str(fn.get("name")) if fn.get("name") else None
    return None


def _object_schema(parameters: Mapping[str, Any]) -> dict[str, Any]:
    schema = dict(parameters) or {"type": "object", "properties": {}}
    schema.setdefault("type", "object")
    return schema


def _response_schema(response_format: Any) -> dict[str, Any]:
    if isinstance(response_format, Mapping):
        kind = response_format.get("type")
        if kind == "json_schema":
            inner = response_format.get("json_schema") or {}
            return dict(inner.get("schema", inner))
        if kind == "json_object":
            return {"type": "object"}
        return dict(response_format)  # a JSON schema dict
    from langchain_core.utils.function_calling import convert_to_json_schema

    try:
        return convert_to_json_schema(response_format)
    except Exception as exc:
        raise ConstraintError(
            f"response_format {response_format!r} is not a JSON schema: give an OpenAI "
            "response_format dict, a Pydantic model, a TypedDict or a JSON schema dict"
        ) from exc


def _literal(text: str) -> Any:
    return _xgrammar().Grammar.from_ebnf("root ::= " + json.dumps(text))


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:  # pragma: no cover - the llm extra installs it
        raise ConstraintError(
            "constrained decoding needs xgrammar: pip install 'marl-orchestra[llm]' "
            "(or xgrammar), or set the pool's constrain: off"
        ) from exc
    return xgrammar


# ----- masks ---------------------------------------------------------------------------------
def mask_words(vocab_size: int) -> int:
    """int32 words of one token's bitmask over ``vocab_size`` ids (bit ``i % 32`` of word
    ``i // 32`` set: token ``i`` allowed; xgrammar's layout)."""
    return (int(vocab_size) + 31) // 32


def unpack_mask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[..., words]`` int32 bitmasks → ``[..., vocab_size]`` bool (True: allowed)."""
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = (bitmask.to(torch.int32)[..., None] >> bits) & 1
    return allowed.reshape(*bitmask.shape[:-1], -1)[..., :vocab_size].bool()


def mask_logits(logits: torch.Tensor, bitmask: torch.Tensor | None) -> torch.Tensor:
    """``logits`` with the tokens outside ``bitmask`` at ``-inf`` (``None``: unchanged).

    ``bitmask`` is ``[..., words]`` aligned with ``logits`` ``[..., V]``; an all-ones row
    (``-1`` words: no constraint) changes nothing. Differentiable in ``logits``: the sampler
    and the learner mask with this one function.
    """
    if bitmask is None:
        return logits
    allowed = unpack_mask(bitmask, logits.shape[-1])
    return logits.masked_fill(~allowed, float("-inf"))


class RowMatchers:
    """One grammar matcher per constrained row of a batch (``None``: a free row).

    Args:
        tokenizer: the model's tokenizer.
        vocab_size: the model's logit width (may exceed ``len(tokenizer)``).
        constraints: one per row.
        stop_ids: token ids that end a reply (allowed where the grammar is complete).
    """

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        constraints: Sequence[Constraint | None],
        stop_ids: Sequence[int],
        strict_utf8: bool = True,
    ) -> None:
        self.vocab_size = int(vocab_size)
        self.words = mask_words(vocab_size)
        self.matchers: list[Any] = []
        compiler = _compiler(tokenizer, self.vocab_size, tuple(sorted(stop_ids)))
        # well-formed UTF-8 on top of the grammar (marl_agents.llm.utf8_rule): for sampling;
        # a replay of another engine's tokens records the grammar's masks alone
        self.utf8 = compiler.utf8(self.words) if strict_utf8 else None
        self._last: list[int | None] = [None] * len(constraints)
        self.closers: list[Any] = []
        self.scans: list[Any] = []
        self._vocab = compiler.decoded_vocab
        xgr = _xgrammar()
        for c in constraints:
            if c is None:
                self.matchers.append(None)
                self.closers.append(None)
                self.scans.append(None)
                continue
            m = xgr.GrammarMatcher(compiler.compile(c), max_rollback_tokens=-1)
            if c.prefix and not m.accept_string(c.prefix):
                raise ConstraintError(
                    f"the prefill {c.prefix!r} does not start a reply the declared "
                    f"{c.kind} constraint allows: drop the prefill or set constrain: off"
                )
            self.matchers.append(m)
            self.closers.append(compiler.closer(c, self.words))
            self.scans.append(Scan().advance(c.prefix.encode()))

    @property
    def active(self) -> bool:
        """Whether any row is constrained."""
        return any(m is not None for m in self.matchers)

    def next_masks(
        self, done: Sequence[bool], budgets: Sequence[int] | None = None
    ) -> torch.Tensor:
        """``[rows, words]`` int32 bitmasks of the next token (``-1`` words: free rows).

        ``budgets``: per row, the tokens it may still generate (this one included). Where the
        budget left comes within :data:`~marl_agents.llm.closing.MARGIN` of what the grammar
        still needs at its shortest, the row's mask is the closing mask
        (:meth:`~marl_agents.llm.closing.Closer.closing_mask`): only tokens after which the
        reply still closes within the budget."""
        out = torch.full((len(self.matchers), self.words), -1, dtype=torch.int32)
        for r, m in enumerate(self.matchers):
            if m is not None and not done[r]:
                m.fill_next_token_bitmask(out, r)
                if budgets is not None:
                    closing = self.closing(r, int(budgets[r]))
                    if closing is not None:
                        out[r] = closing
                if self.utf8 is not None:
                    both = out[r] & self.utf8.allowed(self._last[r])
                    if both.any():  # never leave a row without a token
                        out[r] = both
        return out

    def closing(self, row: int, budget: int) -> torch.Tensor | None:
        """Row ``row``'s closing mask with ``budget`` tokens left, or ``None`` while the budget
        is comfortably above the shortest completion (or no token keeps the reply closable:
        the grammar's own mask stays, and the reply is cut at the budget)."""
        m, closer, scan = self.matchers[row], self.closers[row], self.scans[row]
        if m is None or budget < 1:
            return None
        key = closer.key(m, scan)
        need = closer.distance(m, scan, budget + MARGIN, key)
        if need is not None and budget > need + MARGIN:
            return None
        mask = closer.closing_mask(m, scan, budget, key)
        return mask if bool(mask.any()) else None

    def accept(self, row: int, token: int) -> None:
        """Advance row ``row``'s matcher over the sampled ``token``."""
        m = self.matchers[row]
        if m is not None and not m.is_terminated() and not m.accept_token(int(token)):
            raise ConstraintError(f"row {row}: token {token} is outside its grammar's mask")
        if m is not None and 0 <= int(token) < len(self._vocab):
            self.scans[row] = self.scans[row].advance(self._vocab[int(token)])
        if self.utf8 is not None:
            self._last[row] = self.utf8.last_byte(int(token))


def replay_masks(
    tokenizer: Any,
    vocab_size: int,
    constraint: Constraint,
    token_ids: Sequence[int],
    stop_ids: Sequence[int],
) -> np.ndarray:
    """The bitmask each of ``token_ids`` was drawn under, by replaying the grammar over them.

    What a sampler that applies the grammar itself (vLLM's structured outputs) does not
    return: ``[len(token_ids), words]`` int32, the same masks :class:`RowMatchers` records
    while sampling with transformers.

    Raises:
        ConstraintError: a token lies outside its mask (the engine constrained to another
            language than ``constraint``'s grammar).
    """
    rows = RowMatchers(tokenizer, vocab_size, [constraint], stop_ids, strict_utf8=False)
    out = np.empty((len(token_ids), rows.words), dtype=np.int32)
    for k, token in enumerate(token_ids):
        out[k] = rows.next_masks([False])[0].numpy()
        rows.accept(0, token)
    return out


class _Compiler:
    """A tokenizer's xgrammar compiler with compiled grammars cached by constraint."""

    def __init__(self, tokenizer: Any, vocab_size: int, stops: tuple[int, ...]) -> None:
        xgr = _xgrammar()
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(stops) or None
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._cache: dict[Constraint, Any] = {}
        self._lock = threading.Lock()
        self._vocab = (info.decoded_vocab, int(vocab_size))
        self.decoded_vocab = info.decoded_vocab
        self._stops = stops
        self._closers: dict[Constraint, Any] = {}
        self._utf8: Any = None

    def closer(self, c: Constraint, words: int) -> Any:
        """The :class:`~marl_agents.llm.closing.Closer` of ``c``'s grammar (one per grammar:
        its memo serves every row and call)."""
        key = dataclasses.replace(c, prefix="")
        with self._lock:
            if key not in self._closers:
                self._closers[key] = Closer(self.decoded_vocab, words, self._stops)
            return self._closers[key]

    def utf8(self, words: int) -> Any:
        """The vocabulary's :class:`~marl_agents.llm.utf8_rule.Utf8Rule` (built once)."""
        from marl_agents.llm.utf8_rule import Utf8Rule

        with self._lock:
            if self._utf8 is None:
                self._utf8 = Utf8Rule(*self._vocab, words)
            return self._utf8

    def compile(self, c: Constraint) -> Any:
        key = dataclasses.replace(c, prefix="")
        with self._lock:
            if key not in self._cache:
                try:
                    self._cache[key] = self._compiler.compile_grammar(key.grammar())
                except Exception as exc:
                    raise ConstraintError(
                        f"xgrammar cannot compile the declared {c.kind} constraint "
                        f"{c.spec[:200]}: {exc}; simplify the schema or set constrain: off"
                    ) from exc
            return self._cache[key]


_COMPILERS: dict[tuple[int, int, tuple[int, ...]], _Compiler] = {}
_COMPILERS_LOCK = threading.Lock()


def _compiler(tokenizer: Any, vocab_size: int, stops: tuple[int, ...]) -> _Compiler:
    key = (id(tokenizer), vocab_size, stops)
    with _COMPILERS_LOCK:
        if key not in _COMPILERS:
            _COMPILERS[key] = _Compiler(tokenizer, vocab_size, stops)
        return _COMPILERS[key]


# ----- the call's decoding settings travel with its observation --------------------------------
@dataclasses.dataclass(frozen=True)
class CallSettings:
    """What a chat-model call asks of its reply's decoding, beyond the prompt (hashable).

    Attributes:
        constraint: what the reply must parse as (``None``: free).
        stop: the call's stop strings (:mod:`marl_agents.llm.stop_strings`): the sampler ends
            the reply where one first appears, the ids up to and with the token completing
            it (only a free reply's: the chat model gives none with a constraint or tools).
    """

    constraint: Constraint | None = None
    stop: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.constraint is not None or bool(self.stop)


#: a call that asks nothing beyond its prompt
FREE = CallSettings()


class CallObservation(np.ndarray):
    """A chat-model call's observation (its prompt ids) carrying the call's decoding settings
    (:class:`CallSettings`: its constraint and stop strings).

    :func:`with_constraint` makes one; the environment hands it on unchanged, and the sampler
    reads the settings off the row (:func:`call_of`, :func:`constraint_of`, or
    :func:`constraint_keys` for a batch column) — so two calls with the same prompt ids and
    different constraints or stop strings are two decisions, each decoded as its own call
    asked, whatever the truncation. A copy (an array of its shape made from it: RLlib's env
    runner copies observations) carries them too; arrays of another shape (slices, stacks: a
    batch is not one call's) carry none; pickled, it is a plain array."""

    call: CallSettings = FREE

    def __array_finalize__(self, obj: Any) -> None:
        same = obj is not None and getattr(obj, "shape", None) == self.shape
        self.call = getattr(obj, "call", FREE) if same else FREE

    def __reduce__(self) -> Any:
        return self.view(np.ndarray).__reduce__()


def with_constraint(
    observation: Any, constraint: Constraint | None, stop: Sequence[str] = ()
) -> np.ndarray:
    """``observation`` (an id array) as the observation of a call that declares ``constraint``
    and ``stop`` strings (neither: a free reply; the array is returned as it is)."""
    call = CallSettings(constraint, tuple(stop))
    if not call:
        return observation
    out = np.asarray(observation).view(CallObservation)
    out.call = call
    return out


def call_of(observation: Any) -> CallSettings:
    """The decoding settings of the call observing ``observation`` (:data:`FREE`: none)."""
    return getattr(observation, "call", FREE)


def constraint_of(observation: Any) -> Constraint | None:
    """The constraint the call observing ``observation`` declared (``None``: a free reply)."""
    return call_of(observation).constraint


#: most distinct call settings a process keys at once (oldest forgotten first)
MAX_KEYED = 4096
_KEYS: OrderedDict[CallSettings, int] = OrderedDict()
_BY_KEY: dict[int, CallSettings] = {}
_KEYS_LOCK = threading.Lock()
_NEXT_KEY = [1]


def call_key(call: CallSettings) -> int:
    """An int standing for ``call``'s settings in this process (``0``: :data:`FREE`), for a
    batch column (RLlib's connectors stack ints, not objects); equal settings share a key."""
    if not call:
        return 0
    with _KEYS_LOCK:
        key = _KEYS.get(call)
        if key is None:
            key = _KEYS[call] = _NEXT_KEY[0]
            _BY_KEY[key] = call
            _NEXT_KEY[0] += 1
            while len(_KEYS) > MAX_KEYED:
                _, old = _KEYS.popitem(last=False)
                _BY_KEY.pop(old, None)
        _KEYS.move_to_end(call)
        return key


def keyed_call(key: int) -> CallSettings:
    """The call settings of a :func:`call_key` (``0``: :data:`FREE`).

    Raises:
        ConstraintError: the key was forgotten (more than :data:`MAX_KEYED` distinct
            settings keyed since).
    """
    if int(key) == 0:
        return FREE
    with _KEYS_LOCK:
        found = _BY_KEY.get(int(key))
    if found is None:
        raise ConstraintError(
            f"call key {int(key)} is no longer known: more than {MAX_KEYED} distinct "
            "constraints / stop strings were declared in this process while its call was pending"
        )
    return found


def keyed_constraint(key: int) -> Constraint | None:
    """The constraint of the call settings keyed ``key`` (:func:`keyed_call`)."""
    return keyed_call(key).constraint


def constraint_keys(observations: Sequence[Any]) -> np.ndarray | None:
    """``[rows]`` int64 keys of the rows' call settings (:func:`call_key`: constraint and stop
    strings), ``None`` when no row carries any."""
    keys = [call_key(call_of(o)) for o in observations]
    return np.asarray(keys, dtype=np.int64) if any(keys) else None


# ----- the budget a constraint needs ------------------------------------------------------------
#: the longest shortest-reply a budget check searches for (beyond: "more than ...")
SHORTEST_SEARCH_LIMIT = 1024


def shortest_reply_tokens(
    tokenizer: Any,
    vocab_size: int,
    constraint: Constraint,
    stop_ids: Sequence[int],
    limit: int = SHORTEST_SEARCH_LIMIT,
) -> int | None:
    """The fewest tokens of ``tokenizer`` a reply under ``constraint`` needs to close (after
    its prefill), ``None``: more than ``limit``."""
    rows = RowMatchers(tokenizer, vocab_size, [constraint], stop_ids, strict_utf8=False)
    return rows.closers[0].distance(rows.matchers[0], rows.scans[0], limit)


def describe(constraint: Constraint) -> str:
    """A constraint in words, for messages: the forced tool(s) or the JSON schema."""
    spec = constraint.spec if len(constraint.spec) <= 160 else constraint.spec[:157] + "..."
    if constraint.kind == "json":
        return f"JSON reply (schema {spec})"
    names = [s["name"] for s in json.loads(constraint.spec)]
    what = "forced call of" if constraint.forced else "optional calls of"
    return f"{what} tool {' | '.join(names)} (schema {spec})"


def check_reply_budget(
    agent: str,
    constraint: Constraint | None,
    tokenizer: Any,
    vocab_size: int,
    stop_ids: Sequence[int],
    max_new_tokens: int,
) -> None:
    """Refuse a call whose constraint cannot close within ``max_new_tokens`` even at its
    shortest (cached per constraint and budget).

    Raises:
        ReplyBudgetError: naming the agent, the schema, its shortest length in this
            tokenizer's tokens and the ``max_new_tokens`` to set.
    """
    if constraint is None:
        return
    _check_budget(
        agent, constraint, tokenizer, int(vocab_size), tuple(sorted(stop_ids)), int(max_new_tokens)
    )


@functools.lru_cache(maxsize=1024)
def _check_budget(
    agent: str,
    constraint: Constraint,
    tokenizer: Any,
    vocab_size: int,
    stop_ids: tuple[int, ...],
    max_new_tokens: int,
) -> None:
    need = shortest_reply_tokens(tokenizer, vocab_size, constraint, stop_ids)
    if need is not None and need <= max_new_tokens:
        return
    length = f"{need} tokens" if need is not None else f"more than {SHORTEST_SEARCH_LIMIT} tokens"
    setting = f"max_new_tokens >= {need}" if need is not None else "a larger max_new_tokens"
    raise ReplyBudgetError(
        f"agent {agent!r}: its {describe(constraint)} needs {length} of this tokenizer at its "
        f"shortest, but max_new_tokens={max_new_tokens}: set the agent's {setting} "
        "(or simplify the schema)"
    )
