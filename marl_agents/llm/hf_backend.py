"""In-process Hugging Face transformers backend: batched sampling with exact logprobs.

:class:`HFBackend` runs its own decoding loop over ``model(...)`` with a KV cache (left
padding, explicit position ids) instead of ``model.generate``, so that

* each prompt in a batch has its own ``torch.Generator`` seeded from its
  :class:`~marl_agents.llm.backend.SamplingParams`, from which its uniform numbers are drawn
  up front; each step draws every row's token in a few batched ops
  (:mod:`marl_agents.llm.row_sampling`) — a batched call samples the same tokens as the same
  prompts one by one (exactly so for greedy decoding; for sampling, up to float rounding
  differences between batch shapes flipping a draw, which we have not seen);
* rows with the same prompt (a GRPO group's) are prefilled once, the KV cache fanned out
  (:mod:`marl_agents.llm.prefix`), and :func:`teacher_forced_logprobs` runs a shared prompt
  once with gradients;
* the recorded ``logprobs`` are ``log_softmax`` of the raw float32 logits (temperature 1,
  no top-p), the same quantity :meth:`HFBackend.logprobs` recomputes teacher-forced; and
  ``sampling_logprobs`` are under the temperature / top-p distribution actually sampled
  (``log_softmax(logits / T)``, renormalised over the nucleus), which
  ``HFBackend.logprobs(..., temperature=T)`` recomputes when ``top_p = 1``.

Works on CPU or GPU (the model's device). Example:
    >>> from marl_agents.llm.tiny import make_tiny_model
    >>> tok, model = make_tiny_model(seed=0)
    >>> backend = HFBackend(model, tok)
    >>> [g] = backend.generate(["hello"], SamplingParams(temperature=0, max_new_tokens=4))
    >>> len(g.token_ids) == len(g.logprobs) <= 4
    True
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from marl_agents.llm.backend import Generation, Params, SamplingParams, encode_batch, stop_ids
from marl_agents.llm.constraints import RowMatchers, mask_logits
from marl_agents.llm.prefix import cache_of, distinct, fan_out, padded, suffix_logits
from marl_agents.llm.row_sampling import RowDraws
from scenarios.text_space import Prompt


class HFBackend:
    """A transformers causal LM as an :class:`~marl_agents.llm.backend.LLMBackend`.

    Args:
        model: a ``*ForCausalLM`` (any device, any dtype; logprobs are computed in float32).
        tokenizer: its tokenizer (needs ``pad_token_id`` or ``eos_token_id``, and a chat
            template for chat prompts).
        max_batch_size: split larger calls into chunks of this many prompts (``None``: one
            batch).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_batch_size: int | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else tokenizer.eos_token_id)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        **kwargs: Any,
    ) -> HFBackend:
        """Load a saved HF model directory (e.g. from ``make_tiny_model(path)``)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        return cls(model, tok, **kwargs)

    @property
    def device(self) -> torch.device:
        """The model's device."""
        return next(self.model.parameters()).device

    # ----- generation ----------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Prompt],
        params: Params = None,
        adapters: Sequence[str] | None = None,
    ) -> list[Generation]:
        """Sample one completion per prompt, all prompts in one batched decoding loop.

        Args:
            prompts: token ids, text or chat messages
                (see :data:`~marl_agents.llm.backend.Prompt`).
            params: one :class:`SamplingParams` for all, or one per prompt.
            adapters: one LoRA adapter name per prompt, the rows of several adapters on one
                base sampled in one batch (the model is then a
                :class:`~marl_agents.llm.lora.MixedAdapters`); ``None``: the model as it is.

        Returns:
            One :class:`Generation` per prompt, in order.
        """
        ids, plist = encode_batch(self.tokenizer, prompts, params)
        if not ids:
            return []
        if adapters is not None and len(adapters) != len(ids):
            raise ValueError(f"{len(adapters)} adapter names for {len(ids)} prompts")
        step = self.max_batch_size or len(ids)
        out: list[Generation] = []
        for i in range(0, len(ids), step):
            names = None if adapters is None else list(adapters[i : i + step])
            out.extend(self._generate_batch(ids[i : i + step], plist[i : i + step], names))
        return out

    def _model(self, adapters: list[str] | None, **inputs: Any) -> Any:
        """One forward of the model; with ``adapters``, row ``r`` runs adapter ``adapters[r]``."""
        if adapters is None:
            return self.model(**inputs)
        with self.model.rows(adapters):
            return self.model(**inputs)

    @torch.inference_mode()
    def _generate_batch(
        self,
        prompt_ids: list[list[int]],
        params: list[SamplingParams],
        adapters: list[str] | None = None,
    ) -> list[Generation]:
        dev = self.device
        n = len(prompt_ids)
        # one prefill per distinct prompt (a GRPO group's rows share one; of one adapter),
        # fanned out below
        keyed: list[list[Any]] = list(prompt_ids)
        if adapters is not None:
            keyed = [[*p, a] for p, a in zip(prompt_ids, adapters, strict=True)]
        firsts, index = distinct(keyed)
        prefill_adapters = None if adapters is None else [adapters[r] for r in firsts]
        prompts = [prompt_ids[r] for r in firsts]
        input_ids, mask, positions = padded(prompts, self.pad_id, dev, left=True)
        stops = [stop_ids(self.tokenizer, p) for p in params]
        limit = max(p.max_new_tokens for p in params)
        tokens: list[list[int]] = [[] for _ in range(n)]
        raw_lp: list[list[float]] = [[] for _ in range(n)]
        samp_lp: list[list[float]] = [[] for _ in range(n)]
        reason = ["length"] * n
        done = [False] * n

        out = self._model(  # logits of the last position only (262k-token vocabularies)
            prefill_adapters,
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        cache_key, cache = cache_of(out)
        logits = out.logits[:, -1, :].float()
        if len(prompts) < n:
            rows = torch.as_tensor(index, dtype=torch.long, device=dev)
            cache = fan_out(cache, rows, dev)
            logits, mask, positions = logits[rows], mask[rows], positions[rows]
        next_pos = positions[:, -1:] + 1
        matchers = _matchers(self.tokenizer, logits.shape[-1], params, stops)
        masks: list[list[torch.Tensor]] = [[] for _ in range(n)]
        draws = RowDraws(params, limit, dev)
        for step in range(limit):
            logp = torch.log_softmax(logits, dim=-1)
            step_masks = None
            if matchers is not None:  # one masking op for the batch (-1 rows: free)
                # budgets left: a row near its max_new_tokens samples a closing mask
                left = [params[r].max_new_tokens - len(tokens[r]) for r in range(n)]
                step_masks = matchers.next_masks(done, left)
                logits = mask_logits(logits, step_masks.to(dev))
            # every row's token in a few batched ops, one host sync (marl_agents.llm.row_sampling)
            toks, samp = draws.draw(logits, step)
            raw = logp.gather(1, toks[:, None]).squeeze(1)
            live = torch.tensor([not d for d in done], device=dev)
            chosen = torch.where(live, toks, self.pad_id)[:, None]
            step_toks, step_raw, step_samp = torch.stack(
                [toks.double(), raw.double(), samp.double()]
            ).tolist()
            for r in range(n):
                if done[r]:
                    continue
                if step_masks is not None and matchers.matchers[r] is not None:  # type: ignore[union-attr]
                    masks[r].append(step_masks[r])
                tok = int(step_toks[r])
                if matchers is not None:
                    matchers.accept(r, tok)
                tokens[r].append(tok)
                raw_lp[r].append(step_raw[r])
                samp_lp[r].append(step_samp[r])
                if tok in stops[r]:
                    done[r], reason[r] = True, "stop"
                elif len(tokens[r]) >= params[r].max_new_tokens:
                    done[r] = True
            if all(done):
                break
            mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=dev)], dim=1)
            out = self._model(
                adapters,
                input_ids=chosen,
                attention_mask=mask,
                position_ids=next_pos,
                use_cache=True,
                **{cache_key: cache},
            )
            cache = out[cache_key]
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1

        return [
            Generation(
                prompt_ids=list(prompt_ids[r]),
                token_ids=tokens[r],
                logprobs=raw_lp[r],
                text=self.tokenizer.decode(tokens[r], skip_special_tokens=True),
                finish_reason=reason[r],
                sampling_logprobs=samp_lp[r],
                token_masks=torch.stack(masks[r]).numpy() if masks[r] else None,
            )
            for r in range(n)
        ]

    # ----- teacher forcing -----------------------------------------------------------------
    def logprobs(
        self,
        prompt_ids: Sequence[Sequence[int]],
        token_ids: Sequence[Sequence[int]],
        *,
        temperature: float = 1.0,
        token_masks: Sequence[Any] | None = None,
    ) -> list[list[float]]:
        """Teacher-forced logprobs of ``token_ids`` after ``prompt_ids`` under ``logits / T``.

        With ``temperature=1`` (the default) the recompute of :attr:`Generation.logprobs`;
        with the sampling temperature (and ``top_p = 1``) the recompute of
        :attr:`Generation.sampling_logprobs` (of a constrained reply: with its
        ``token_masks``). One forward pass over each
        ``prompt + completion`` (batched, right-padded).

        Returns:
            Per completion, one float per token.
        """
        lp, _ = teacher_forced_logprobs(
            self.model,
            prompt_ids,
            token_ids,
            pad_id=self.pad_id,
            temperature=temperature,
            token_masks=token_masks,
        )
        return [row[: len(t)].tolist() for row, t in zip(lp, token_ids, strict=True)]


def teacher_forced_logprobs(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    token_ids: Sequence[Sequence[int]],
    *,
    pad_id: int = 0,
    with_entropy: bool = False,
    temperature: float | Sequence[float] | torch.Tensor = 1.0,
    token_masks: Sequence[Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprobs (and optionally entropies) of completion tokens, one forward pass.

    The distribution scored is ``softmax(logits / temperature)`` — the one a sampler at that
    temperature (and ``top_p = 1``) draws from, as TRL's GRPOTrainer and verl score it.
    Gradients flow when called outside ``torch.no_grad`` (the learner's use).

    Args:
        model: a causal LM returning ``.logits``.
        prompt_ids: per sequence, the prompt's ids.
        token_ids: per sequence, the completion's ids.
        pad_id: id used for right padding.
        with_entropy: also return the entropy of each next-token distribution.
        temperature: one temperature ``> 0`` for all sequences, or one per sequence.
        token_masks: per sequence, ``None`` or the bitmasks its tokens were sampled under
            (``[>= len(tokens), words]`` int32, :mod:`marl_agents.llm.constraints`): the
            token is then scored under the masked, renormalised distribution.

    Returns:
        ``(logprobs, entropy)``: float32 tensors ``[batch, max_completion_len]`` aligned with
        ``token_ids`` (zeros past each completion's end); ``entropy`` is ``None`` unless asked.

    Raises:
        ValueError: a temperature ``<= 0`` (greedy tokens have no logprobs to score) or one
            temperature per sequence of the wrong length.
    """
    dev = next(model.parameters()).device
    n = len(prompt_ids)
    temps = _temperatures(temperature, n)
    tlen = max((len(t) for t in token_ids), default=0)
    # rows sharing a prompt (a GRPO group) run it once (marl_agents.llm.prefix)
    logits = suffix_logits(model, prompt_ids, token_ids, pad_id=pad_id)
    if logits is not None:
        offsets = [0] * n  # logits[r, k] predicts token k
    else:
        logits, offsets = _full_logits(model, prompt_ids, token_ids, pad_id=pad_id)
    out = torch.zeros((n, tlen), dtype=torch.float32, device=dev)
    ent = torch.zeros((n, tlen), dtype=torch.float32, device=dev) if with_entropy else None
    for r, t in enumerate(token_ids):
        if not t:
            continue
        step_logits = logits[r, offsets[r] : offsets[r] + len(t)].float()
        row_mask = token_masks[r] if token_masks is not None else None
        if row_mask is not None:
            row_mask = torch.as_tensor(row_mask, device=dev)[: len(t)]
        row = torch.log_softmax(mask_logits(step_logits / temps[r], row_mask), dim=-1)
        tgt = torch.tensor(list(t), dtype=torch.long, device=dev)
        out[r, : len(t)] = row.gather(-1, tgt[:, None]).squeeze(-1)
        if ent is not None:  # masked tokens (-inf) add nothing
            ent[r, : len(t)] = -(row.exp() * row.clamp(min=torch.finfo(row.dtype).min)).sum(-1)
    return out, ent


def _full_logits(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    token_ids: Sequence[Sequence[int]],
    *,
    pad_id: int,
) -> tuple[torch.Tensor, list[int]]:
    """One right-padded forward over each ``prompt + tokens``: the logits from the first
    position that predicts a completion token on, and per row the column of the logits that
    predict its token 0 (the prompt's other positions would cost ``[batch, width, vocab]``
    floats: GBs with a 262k-token vocabulary)."""
    dev = next(model.parameters()).device
    seqs = [list(p) + list(t) for p, t in zip(prompt_ids, token_ids, strict=True)]
    input_ids, mask, positions = padded(seqs, pad_id, dev, left=False)
    start = max(0, min((len(p) for p, t in zip(prompt_ids, token_ids, strict=True) if t),
                       default=1) - 1)  # fmt: skip
    logits = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        logits_to_keep=input_ids.shape[1] - start,
    ).logits
    # logits at position j predict token j + 1: completion token 0 sits at len(p)
    return logits, [len(p) - 1 - start for p in prompt_ids]


def _temperatures(temperature: float | Sequence[float] | torch.Tensor, n: int) -> list[float]:
    """``temperature`` as one float per sequence, each checked ``> 0``."""
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.detach().cpu().reshape(-1).tolist()
    temps = [float(temperature)] * n if isinstance(temperature, int | float) else list(temperature)
    if len(temps) != n:
        raise ValueError(f"{len(temps)} temperatures for {n} sequences: give one, or one each")
    bad = [t for t in temps if not t > 0]
    if bad:
        raise ValueError(
            f"temperature {bad[0]} cannot be scored: logprobs need a temperature > 0 "
            "(greedy tokens, temperature 0, have no distribution to score)"
        )
    return [float(t) for t in temps]


def _matchers(
    tokenizer: Any, vocab_size: int, params: Sequence[SamplingParams], stops: list[set[int]]
) -> RowMatchers | None:
    """Grammar matchers of the constrained rows (``None`` when no row is constrained)."""
    if all(p.constraint is None for p in params):
        return None
    return RowMatchers(
        tokenizer, vocab_size, [p.constraint for p in params], sorted(set().union(*stops))
    )
