"""The ``LLMBackend`` protocol: generate → token ids, per-token logprobs, text.

Every backend (:class:`~marl_agents.llm.hf_backend.HFBackend`,
:class:`~marl_agents.llm.vllm_backend.VLLMBackend`,
:class:`~marl_agents.llm.vllm_backend.OpenAIServerBackend`) takes a list of prompts and
returns one :class:`Generation` per prompt. Training uses the token ids exactly as generated
(never re-tokenised text) and the logprobs recorded at sampling time as the behaviour policy's.

**Which logprobs.** ``Generation.logprobs[i]`` is ``log softmax(logits)[token_ids[i]]`` of the
model's raw next-token logits: temperature 1, no top-p truncation (vLLM's default
``logprobs_mode="raw_logprobs"`` is the same quantity). ``Generation.sampling_logprobs``, when
a backend records it, is the log-probability under the distribution the token was actually
drawn from (logits / temperature, renormalised over the top-p nucleus); it is ``None`` where
the backend cannot give it. For temperature 1 and top_p 1 the two agree.

The behaviour policy of a PPO/GRPO ratio is the *sampling* distribution: the trained
:class:`~marl_agents.llm.rl_module.CausalLMModule` stores ``sampling_logprobs`` as the
ratio's old logprobs and its learner scores the tokens teacher-forced under
``logits / temperature`` (``teacher_forced_logprobs(..., temperature=T)``), as TRL's
GRPOTrainer and verl do. A top-p nucleus is not reproduced by the learner, so a trained pool
must sample with ``top_p = 1`` (config validation says so); greedy tokens (temperature 0)
have no distribution to score and cannot be trained on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

# prompts are rendered where the environments render them
from scenarios.text_space import Prompt, encode_prompt

__all__ = [
    "Generation",
    "LLMBackend",
    "Params",
    "SamplingParams",
    "encode_batch",
    "per_prompt_params",
    "stop_ids",
]


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    Attributes:
        temperature: softmax temperature; ``0`` means greedy (argmax).
        top_p: nucleus sampling: keep the smallest set of tokens whose probability (after
            temperature) reaches ``top_p``; ``1`` keeps all.
        max_new_tokens: stop after this many generated tokens (``finish_reason="length"``).
        seed: per-request seed; the same prompt, params and seed give the same tokens on
            the same backend. ``None``: draw from the backend's own generator.
        stop_token_ids: extra token ids that end generation (the tokenizer's EOS always
            does); the stop token is included in ``token_ids``.
        constraint: what the reply must parse as
            (:class:`~marl_agents.llm.constraints.Constraint`: sampled from the masked
            distribution); ``None``: free text.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    constraint: Any = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        """Whether this is greedy decoding (temperature 0)."""
        return self.temperature == 0


#: what ``generate`` takes as sampling parameters: one for all prompts, one per prompt, or none
Params = SamplingParams | Sequence[SamplingParams] | None


@dataclasses.dataclass
class Generation:
    """One completion.

    Attributes:
        prompt_ids: the prompt's token ids as the model saw them (after the chat template).
        token_ids: the generated token ids, including a final EOS / stop token if one was
            generated.
        logprobs: per generated token, its log-probability under the model's raw logits
            (temperature 1, no truncation); same length as ``token_ids``.
        text: ``token_ids`` decoded with special tokens skipped.
        finish_reason: ``"stop"`` (EOS or a stop token) or ``"length"``.
        sampling_logprobs: per generated token, its log-probability under the distribution
            it was drawn from (temperature, top-p), or ``None`` if the backend does not give
            it. Greedy tokens have ``0.0`` here. Under a constraint, of the masked,
            renormalised distribution.
        token_masks: under a constraint, the bitmask each token was drawn under
            (``[len(token_ids), words]`` int32, :mod:`marl_agents.llm.constraints`);
            ``None`` for a free reply.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str = "length"
    sampling_logprobs: list[float] | None = None
    token_masks: Any = None

    def __post_init__(self) -> None:
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs: "
                "a backend must give one logprob per generated token"
            )


@runtime_checkable
class LLMBackend(Protocol):
    """Anything that turns a batch of prompts into :class:`Generation` objects.

    ``tokenizer`` is a Hugging Face tokenizer for the backend's model: the chat model adapter
    and the trainers use it to render prompts and decode, so token ids mean the same thing
    on every backend serving the same weights.
    """

    tokenizer: Any

    def generate(self, prompts: Sequence[Prompt], params: Params = None) -> list[Generation]:
        """Generate one completion per prompt (in one batch where the backend can).

        Args:
            prompts: token ids, text, or chat messages (see :data:`Prompt`).
            params: one :class:`SamplingParams` for all prompts, or one per prompt.
        """
        ...


def per_prompt_params(params: Params, n: int) -> list[SamplingParams]:
    """Broadcast ``params`` to ``n`` prompts.

    Raises:
        ValueError: a list of the wrong length.
    """
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    out = list(params)
    if len(out) != n:
        raise ValueError(f"{len(out)} SamplingParams for {n} prompts: give one, or one per prompt")
    return out


def encode_batch(
    tokenizer: Any, prompts: Sequence[Prompt], params: Params
) -> tuple[list[list[int]], list[SamplingParams]]:
    """The prompts' token ids (rendered with ``tokenizer``) and one :class:`SamplingParams`
    per prompt: what every backend's ``generate`` starts with."""
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    return ids, per_prompt_params(params, len(ids))


def stop_ids(tokenizer: Any, params: SamplingParams) -> set[int]:
    """The token ids that end generation: the tokenizer's EOS ids and ``params.stop_token_ids``."""
    eos = tokenizer.eos_token_id
    ids = set(params.stop_token_ids)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos is not None:
        ids.update(int(e) for e in eos)
    return ids
