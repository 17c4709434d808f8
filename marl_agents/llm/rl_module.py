"""``CausalLMModule``: a Hugging Face causal LM as an RLlib policy (new API stack).

The module acts in a text environment whose spaces come from
:class:`~scenarios.text_space.TextSpaces`: the observation is the prompt's token ids,
the action the generated token ids, both right-padded with ``pad_id = vocab_size``.

* **Exploration** (``forward_exploration``, what env runners call while sampling): sample a
  completion per row with :class:`~marl_agents.llm.hf_backend.HFBackend`'s KV-cache loop and
  return the token ids as ``Columns.ACTIONS`` (RLlib's ``GetActions`` passes them through
  unchanged: nothing is re-sampled or re-tokenised), their summed logprob as
  ``Columns.ACTION_LOGP``, the per-token logprobs as the extra model output
  :data:`TOKEN_LOGP` — under the distribution that drew them, ``softmax(logits / T)``
  (the behaviour policy: the ``old_logprobs`` of the GRPO ratio) — and the temperature
  ``T`` of each row as the extra model output :data:`SAMPLING_TEMPERATURE`, so the
  temperature travels with the batch to the learner. A batch may carry one seed per row
  (:data:`SAMPLING_SEEDS`, the batched sampler's draw from the row's env stream): each row
  is then sampled with its own ``SamplingParams(seed=...)``, on either sampler.
* **Sampler** (``model_config["sampler"]``): ``"transformers"`` samples with the module's LM
  as above; ``"vllm"`` with a vLLM engine in this process
  (:class:`~marl_agents.llm.vllm_sampler.VLLMSampler`) that loads the module's weights
  whenever :meth:`CausalLMModule.set_state` (RLlib's weight sync) moved
  :attr:`~CausalLMModule.weights_version` since its last sample; its behaviour logprobs are
  vLLM's, at the same temperature (the learner's TIS correction absorbs kernel differences).
* **Constrained decoding** (``model_config["constrain"]``, ``"auto"`` by default): a row
  whose chat-model call declared tools or a response schema (carried by the row's
  observation, :func:`marl_agents.llm.constraints.with_constraint`, into the forward batch's
  :data:`CONSTRAINT_KEY` column by the sampler) is sampled under its grammar's mask (the
  closing mask near ``max_new_tokens``, :mod:`marl_agents.llm.closing`), and the module
  returns every token's bitmask as the extra model output :data:`TOKEN_MASK` (``-1`` words:
  a free token), so the masks travel with the episode to the learner, which scores each
  token under the same mask (the temperature rule's twin). On either sampler: the vLLM
  engine applies the same grammar itself (vLLM's xgrammar structured outputs; without the
  closing mask: vLLM does not see it) and the masks are replayed over its tokens
  (:mod:`marl_agents.llm.vllm_backend`). ``"off"``: every reply free, no :data:`TOKEN_MASK`
  column.
* **Stop strings**: a free reply whose call gave ``stop`` strings (carried with the
  constraint: :class:`~marl_agents.llm.constraints.CallSettings`, in the same
  :data:`CONSTRAINT_KEY` column) ends where one first appears, on either sampler: the module
  cuts each row's generation with :func:`~marl_agents.llm.stop_strings.cut_at_stop` (the ids
  up to and with the token completing the stop string; the rule the chat model applies to
  what the app receives) before it makes its outputs, so ``Columns.ACTIONS``, the behaviour
  logprobs and :data:`TOKEN_MASK` hold exactly the ids the recorded step holds, padded past
  them as a reply ended by EOS is (the learner's loss mask is ``actions != pad_id``). The
  tokens sampled after the stop string are dropped (generation is not stopped early:
  :mod:`marl_agents.llm.stop_strings` says why).
* **Inference** (``forward_inference``, evaluation): the same with greedy decoding unless
  ``model_config["inference_temperature"]`` says otherwise.
* **Training** (``forward_train``): one teacher-forced pass over ``prompt + completion`` with
  gradients, scoring each row under ``logits / T`` with the row's
  :data:`SAMPLING_TEMPERATURE` (the module's ``temperature`` when the batch has no such
  column), returning :data:`TOKEN_LOGP` and :data:`TOKEN_ENTROPY` ``[B, max_new_tokens]``
  aligned with the action ids (zeros on padding). Both sides of the ratio are thus the
  same tempered policy (as in TRL's GRPOTrainer and verl). Greedy rows (``T = 0``) and a
  module sampling with ``top_p < 1`` (a nucleus the learner does not reproduce) raise
  :class:`SamplingConfigError` instead of training on a policy that did not sample.

There is no value head (GRPO needs none); dropout is kept off in every pass so that the
trained distribution is the one that sampled the tokens.

``model_config`` keys:

* ``model``: ``"tiny"`` (:func:`~marl_agents.llm.tiny.make_tiny_model`, built from
  ``tiny_seed``) or a directory with a saved HF model and tokenizer of a supported family
  (Qwen2/Qwen3, Llama, Mistral: :mod:`marl_agents.llm.checkpoints`).
* ``tiny_seed`` (default 0), ``dtype`` (``"float32"``, ``"bfloat16"``, …).
* ``temperature`` (1.0), ``top_p`` (1.0): exploration sampling. Training needs
  ``temperature > 0`` and ``top_p = 1`` (:meth:`CausalLMModule.check_trainable`).
* ``sampler`` (``"transformers"``): or ``"vllm"`` (see above).
* ``constrain`` (``"auto"``): or ``"off"`` (see above).
* ``inference_temperature`` (0.0): evaluation sampling (0 = greedy). Its rows carry their own
  temperature, so were they ever trained on they would be scored at it (greedy ones raise).
* ``lora`` (a :class:`~marl_agents.pools.LoRAConfig` or its dict) and/or ``adapter`` (a peft
  adapter directory), with ``pool`` (the pool id): a LoRA module. ``model`` is then an
  :class:`~marl_agents.llm.lora.AdapterModel` on the process's shared base and the module's
  parameters (``adapter``: what the optimizer, ``state_dict``/``get_state``, weight sync and
  checkpoints see) are its adapter's only (:mod:`marl_agents.llm.lora`).

Example:
    >>> from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    >>> from scenarios.text_space import TextSpaces
    >>> spaces = TextSpaces(vocab_size=384, max_prompt_tokens=16, max_new_tokens=4)
    >>> spec = RLModuleSpec(module_class=CausalLMModule,
    ...                     observation_space=spaces.observation_space,
    ...                     action_space=spaces.action_space, model_config={"model": "tiny"})
    >>> module = spec.build()
    >>> obs = torch.as_tensor(spaces.encode_prompt([5, 6, 7]))[None]
    >>> out = module.forward_exploration({"obs": obs})
    >>> tuple(out["actions"].shape), tuple(out[TOKEN_LOGP].shape)
    ((1, 4), (1, 4))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.torch import TorchRLModule
from typing_extensions import override

from marl_agents.llm.backend import Generation, SamplingParams
from scenarios.text_space import TextSpaces
from topologies.errors import MarlError

#: extra model output / train-forward key: per-token logprobs ``[B, max_new_tokens]``.
TOKEN_LOGP = "token_logp"
#: train-forward key: per-token next-token entropy (nats) ``[B, max_new_tokens]``.
TOKEN_ENTROPY = "token_entropy"
#: extra model output / batch column: the temperature each row was sampled at ``[B]``
#: (``0``: greedy); the learner scores the row's tokens under ``logits / temperature``.
SAMPLING_TEMPERATURE = "sampling_temperature"
#: optional forward-batch key: one sampling seed per row ``[B]`` (int). A row's tokens then
#: depend on its prompt, the weights and its seed only, not on the rows sharing the batch
#: (the batched sampler draws each from the row's env stream); absent: the backend's own RNG.
SAMPLING_SEEDS = "sampling_seeds"
#: extra model output / batch column (``constrain: auto``): per generated token, the bitmask
#: it was sampled under ``[B, max_new_tokens, words]`` int32 (``-1`` words: free); the
#: learner scores the token under the masked distribution.
TOKEN_MASK = "token_mask"
#: optional forward-batch key: per row, the key of the decoding settings its call declared
#: (its constraint and stop strings) ``[B]`` int64 (``0``: free;
#: :func:`marl_agents.llm.constraints.call_key`), read off the row's observation by the
#: sampler (:func:`~marl_agents.llm.constraints.constraint_keys`): they travel with the call,
#: not with its prompt ids.
CONSTRAINT_KEY = "constraint_key"
#: ``model_config["constrain"]`` values
CONSTRAIN_MODES = ("auto", "off")


def add_constraint_keys(batch: dict[str, Any], observations: Sequence[Any]) -> dict[str, Any]:
    """``batch`` with its :data:`CONSTRAINT_KEY` column: each row's call key (constraint and
    stop strings) read off its observation as the env handed it on (``observations``, in row
    order); unchanged when no row carries any. What every sampler of an LLM module does to its
    forward batch (the batched runner, evaluation; RLlib's runner through
    :mod:`marl_agents.llm.constraint_connector`)."""
    from marl_agents.llm.constraints import constraint_keys

    keys = constraint_keys(observations)
    if keys is not None:
        batch[CONSTRAINT_KEY] = torch.from_numpy(keys)
    return batch


class SamplingConfigError(MarlError, ValueError):
    """Tokens the learner cannot score under the distribution that sampled them.

    Raised for greedy rows (temperature 0: no distribution to score) and for a trained module
    that samples with ``top_p < 1`` (the learner does not reproduce the nucleus). The message
    names the module or rows and the fix.
    """


def load_causal_lm(
    model: str, *, tiny_seed: int = 0, dtype: str | torch.dtype = "float32"
) -> tuple[Any, Any]:
    """``(tokenizer, model)`` for ``"tiny"``, a saved HF directory or a named pretrained model /
    ``.gguf`` file (:mod:`scenarios.pretrained`), loaded in ``dtype``; eval mode, CPU.

    Raises:
        CheckpointError: ``model`` is neither ``"tiny"`` nor a directory holding a model of a
            supported family (:data:`~marl_agents.llm.checkpoints.FAMILIES`) and its tokenizer.
    """
    from marl_agents.llm.checkpoints import inspect_checkpoint

    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if model == "tiny":
        from marl_agents.llm.tiny import make_tiny_model

        return make_tiny_model(seed=int(tiny_seed), dtype=torch_dtype)
    inspect_checkpoint(model)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scenarios.pretrained import complete_tokenizer, resolve

    path = str(Path(resolve(model)).expanduser())  # a named model / .gguf: its converted dir
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    # the family's chat template where the tokenizer has none (Gemma from GGUF)
    tok = complete_tokenizer(AutoTokenizer.from_pretrained(path), lm.config.model_type)
    return tok, lm.eval()


class CausalLMModule(TorchRLModule):
    """A causal LM policy over :class:`~scenarios.text_space.TextSpaces` (module doc)."""

    #: the batched sampler (``trainers.sampling.batched_runner``) hands this module its token-id
    #: observations as they are (no float cast) and stores its outputs as it returns them
    acts_with_token_ids = True

    @override
    def setup(self) -> None:
        cfg = dict(self.model_config or {})
        self.spaces = spaces_from(self.observation_space, self.action_space)
        self.lora = bool(cfg.get("lora") or cfg.get("adapter"))
        if self.lora:
            from marl_agents.llm.lora import attach

            tokenizer, view = attach(cfg, str(cfg.get("pool", "adapter")))
            self.tokenizer = tokenizer
            # the shared base is not a submodule: parameters(), state_dict() and get_state()
            # hold this module's adapter only (the same Parameter objects the base runs with)
            object.__setattr__(self, "model", view)
            self.adapter = torch.nn.ParameterDict(view.params)
        else:
            self.tokenizer, self.model = load_causal_lm(
                str(cfg.get("model", "tiny")),
                tiny_seed=int(cfg.get("tiny_seed", 0)),
                dtype=cfg.get("dtype", "float32"),
            )
        vocab = int(self.model.config.vocab_size)
        if vocab > self.spaces.vocab_size:
            raise ValueError(
                f"the model has {vocab} token ids but the spaces allow {self.spaces.vocab_size}: "
                "size the spaces with TextSpaces.for_tokenizer(tokenizer, ..., model=model)"
            )
        self.model.eval()
        self.temperature = float(cfg.get("temperature", 1.0))
        self.top_p = float(cfg.get("top_p", 1.0))
        self.inference_temperature = float(cfg.get("inference_temperature", 0.0))
        self.constrain = str(cfg.get("constrain", "auto"))
        if self.constrain not in CONSTRAIN_MODES:
            raise ValueError(
                f"model_config['constrain']={self.constrain!r}: use 'auto' (constrain replies "
                "to the tools / schema the app declares) or 'off'"
            )
        pad = self.tokenizer.pad_token_id
        self._lm_pad = int(pad if pad is not None else self.tokenizer.eos_token_id)

    # ----- helpers -------------------------------------------------------------------------
    @property
    def pad_id(self) -> int:
        """The padding value of observation and action arrays (``vocab_size``)."""
        return self.spaces.pad_id

    def prompts(self, obs: torch.Tensor | np.ndarray) -> list[list[int]]:
        """Per row, the prompt ids of a ``[B, max_prompt_tokens]`` observation batch."""
        rows = obs.detach().cpu().numpy() if isinstance(obs, torch.Tensor) else np.asarray(obs)
        return [self.spaces.decode_prompt(r) for r in rows.reshape(len(rows), -1)]

    def completions(self, actions: torch.Tensor | np.ndarray) -> list[list[int]]:
        """Per row, the generated ids of a ``[B, max_new_tokens]`` action batch."""
        rows = (
            actions.detach().cpu().numpy()
            if isinstance(actions, torch.Tensor)
            else np.asarray(actions)
        )
        return [self.spaces.decode_action(r) for r in rows.reshape(len(rows), -1)]

    def check_trainable(self, where: str = "this CausalLMModule") -> None:
        """Raise unless the exploration sampler is one the learner scores exactly.

        Args:
            where: names the module in the message (e.g. ``"module 'orchestrator'"``).

        Raises:
            SamplingConfigError: ``temperature == 0`` or ``top_p < 1``.
        """
        if not self.temperature > 0:
            raise SamplingConfigError(
                f"{where} samples greedily (temperature={self.temperature}) but is trained: "
                "greedy tokens have no distribution to score and GRPO's rollouts of a task "
                "would be identical; set model_config['temperature'] > 0 (e.g. 1.0)"
            )
        if self.top_p < 1:
            raise SamplingConfigError(
                f"{where} samples with top_p={self.top_p} but is trained: the learner scores "
                "tokens under logits / temperature and does not reproduce the top-p nucleus, so "
                "the GRPO ratio would compare a different policy with the sampler; set "
                "top_p: 1 (lower the temperature to sharpen sampling) or freeze the module"
            )

    def batch_temperature(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """Per row, the temperature it was sampled at (``[B]`` float32, CPU).

        The batch's :data:`SAMPLING_TEMPERATURE`, or the module's ``temperature`` for a batch
        without that column.

        Raises:
            SamplingConfigError: a row sampled greedily (temperature 0).
        """
        n = len(batch[Columns.ACTIONS])
        temps = batch.get(SAMPLING_TEMPERATURE)
        if temps is None:
            temps = torch.full((n,), self.temperature, dtype=torch.float32)
        temps = torch.as_tensor(temps, dtype=torch.float32).reshape(-1)
        greedy = int((~(temps > 0)).sum())
        if greedy:
            raise SamplingConfigError(
                f"{greedy} of {n} rows were sampled greedily (temperature 0, e.g. "
                "forward_inference with inference_temperature 0): greedy tokens have no "
                "logprobs to train on; train on forward_exploration samples at temperature > 0"
            )
        return temps

    def batch_token_mask(self, batch: Mapping[str, Any]) -> torch.Tensor | None:
        """The batch's :data:`TOKEN_MASK` (``None``: no column, every token free)."""
        masks = batch.get(TOKEN_MASK)
        return None if masks is None else torch.as_tensor(masks, dtype=torch.int32)

    @property
    def sampler(self) -> str:
        """What samples this module: ``"transformers"`` (its own LM) or ``"vllm"``."""
        return str((self.model_config or {}).get("sampler", "transformers"))

    @property
    def weights_version(self) -> int:
        """How many times the weights changed since setup (:meth:`set_state`, or
        :meth:`weights_moved` for a module sharing another's tensors); 0: as loaded."""
        return int(getattr(self, "_weights_version", 0))

    def weights_moved(self) -> None:
        """Count a change of the weights: a vLLM sampler loads them before its next sample."""
        self._weights_version = self.weights_version + 1

    @override
    def set_state(self, state: Any) -> None:
        # RLlib syncs the learner's weights into env-runner modules here: a new version,
        # which a vLLM sampler loads before its next generate
        super().set_state(state)
        self.weights_moved()

    def share_weights_from(self, source: torch.nn.Module) -> bool:
        """Make this module's parameters and buffers the very tensors of ``source`` (the same
        pool's module on the learner, in the process that samples with this one): one copy
        of the weights in memory, and every optimizer step is seen here at once, so a weight
        sync has nothing left to copy (call :meth:`weights_moved` after each update instead).

        Returns ``False`` and changes nothing unless every parameter and buffer of this
        module has a namesake in ``source`` of the same shape, dtype and device (a LoRA
        module: its adapter's; the shared base is one copy already).
        """
        theirs = dict(source.named_parameters()) | dict(source.named_buffers())
        mine = [*self.named_parameters(), *self.named_buffers()]
        same = [
            name in theirs
            and (theirs[name].shape, theirs[name].dtype, theirs[name].device)
            == (t.shape, t.dtype, t.device)
            for name, t in mine
        ]
        if not mine or not all(same):
            return False
        for name, t in mine:
            t.data = theirs[name].data
        self.weights_moved()
        return True

    def generate(
        self,
        prompts: list[list[int]],
        temperature: float,
        seeds: Sequence[int] | None = None,
        constraints: Sequence[Any] | None = None,
    ) -> list[Generation]:
        """Sample one completion per prompt (at most ``max_new_tokens``) with the module's LM:
        in process with transformers, or with the module's vLLM engine (``sampler: vllm``),
        which first loads the module's weights if they changed since its last sample.
        ``seeds``: one per prompt (its own ``SamplingParams.seed``), or None.
        ``constraints``: one :class:`~marl_agents.llm.constraints.Constraint` (or ``None``)
        per prompt, or None."""
        return self.sample(
            prompts, self.sampling_params(len(prompts), temperature, seeds, constraints)
        )

    def sample(
        self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[Generation]:
        """Sample one completion per prompt with explicit :class:`SamplingParams` (one, or one
        per prompt): in process with transformers, or with the module's vLLM engine."""
        if self.sampler == "vllm":
            return self.vllm_sampler().generate(prompts, params, version=self.weights_version)
        if self.sampler != "transformers":
            raise ValueError(
                f"model_config['sampler']={self.sampler!r}: use 'transformers' or 'vllm'"
            )
        from marl_agents.llm.hf_backend import HFBackend

        return HFBackend(self.model, self.tokenizer).generate(prompts, params)

    def sampling_params(
        self,
        n: int,
        temperature: float,
        seeds: Sequence[int] | None = None,
        constraints: Sequence[Any] | None = None,
    ) -> SamplingParams | list[SamplingParams]:
        """This module's sampling settings for ``n`` prompts: one :class:`SamplingParams`, or
        one per prompt when ``seeds`` or ``constraints`` (one per prompt) are given."""
        one = SamplingParams(
            temperature=temperature,
            top_p=self.top_p if temperature > 0 else 1.0,
            max_new_tokens=self.spaces.max_new_tokens,
        )
        if seeds is None and constraints is None:
            return one
        for name, given in (("sampling seeds", seeds), ("constraints", constraints)):
            if given is not None and len(given) != n:
                raise ValueError(f"{len(given)} {name} for {n} prompts")
        return [
            dataclasses.replace(
                one,
                seed=None if seeds is None else int(seeds[r]),
                constraint=None if constraints is None else constraints[r],
            )
            for r in range(n)
        ]

    def vllm_sampler(self) -> Any:
        """This module's :class:`~marl_agents.llm.vllm_sampler.VLLMSampler`, holding the
        module's current weights (started on first use, synced when the version moved)."""
        from marl_agents.llm.vllm_sampler import make_sampler

        sampler = getattr(self, "_vllm_sampler", None)
        version = self.weights_version
        if sampler is None:
            name = str((self.model_config or {}).get("model", "tiny"))
            path = None if name == "tiny" else str(Path(name).expanduser())
            sampler = make_sampler(
                self.model,
                self.tokenizer,
                path=path,
                version=version if path is None else 0,  # a directory holds setup's weights
                max_model_len=self.spaces.max_prompt_tokens + self.spaces.max_new_tokens,
            )
            self._vllm_sampler = sampler
        if sampler.version != version:
            sampler.sync(self.model, version)
        return sampler

    def _act(self, batch: Mapping[str, Any], temperature: float) -> dict[str, Any]:
        seeds, constraints = self.row_settings(batch)
        gens = self.generate(self.prompts(batch[Columns.OBS]), temperature, seeds, constraints)
        return self.act_outputs(batch, gens, temperature, constraints)

    def row_settings(self, batch: Mapping[str, Any]) -> tuple[list[int] | None, list[Any] | None]:
        """A forward batch's per-row sampling seeds (:data:`SAMPLING_SEEDS`) and constraints
        (:meth:`row_constraints`), each ``None`` where there are none."""
        seeds = batch.get(SAMPLING_SEEDS)
        if seeds is not None:
            seeds = np.asarray(seeds.cpu() if isinstance(seeds, torch.Tensor) else seeds).tolist()
        return seeds, self.batch_constraints(batch)

    def act_outputs(
        self,
        batch: Mapping[str, Any],
        gens: Sequence[Generation],
        temperature: float,
        constraints: Sequence[Any] | None,
    ) -> dict[str, Any]:
        """The exploration / inference forward's outputs for ``batch`` sampled as ``gens``."""
        obs = batch[Columns.OBS]
        width = self.spaces.max_new_tokens
        gens = self.stopped(batch, gens)
        actions = np.stack([self.spaces.encode_action(g.token_ids) for g in gens])
        token_lp = np.zeros((len(gens), width), dtype=np.float32)
        for r, g in enumerate(gens):
            # behaviour logprobs: under softmax(logits / T) (and the nucleus), what drew them
            if g.sampling_logprobs is None:
                raise RuntimeError("the HF backend returned no sampling_logprobs")
            token_lp[r, : len(g.sampling_logprobs)] = g.sampling_logprobs
        device = obs.device if isinstance(obs, torch.Tensor) else None
        out = {
            Columns.ACTIONS: torch.as_tensor(actions, device=device),
            Columns.ACTION_LOGP: torch.as_tensor(token_lp.sum(-1), device=device),
            TOKEN_LOGP: torch.as_tensor(token_lp, device=device),
            SAMPLING_TEMPERATURE: torch.full(
                (len(gens),), float(temperature), dtype=torch.float32, device=device
            ),
        }
        if constraints is not None:
            out[TOKEN_MASK] = torch.as_tensor(self._token_masks(gens), device=device)
        return out

    def batch_constraints(self, batch: Mapping[str, Any]) -> list[Any] | None:
        """Per row of a forward batch, the constraint its call declared (the batch's
        :data:`CONSTRAINT_KEY` column; ``None`` rows: free, as every row of a batch without
        the column); ``None`` with ``constrain: off``."""
        if self.constrain == "off":
            return None
        return [c.constraint for c in self.batch_calls(batch)]

    def batch_calls(self, batch: Mapping[str, Any]) -> list[Any]:
        """Per row of a forward batch, the decoding settings its call declared
        (:class:`~marl_agents.llm.constraints.CallSettings`, from the batch's
        :data:`CONSTRAINT_KEY` column; every row free in a batch without the column)."""
        from marl_agents.llm.constraints import FREE, keyed_call

        keys = batch.get(CONSTRAINT_KEY)
        if keys is None:
            return [FREE] * len(batch[Columns.OBS])
        keys = keys.detach().cpu().numpy() if isinstance(keys, torch.Tensor) else np.asarray(keys)
        return [keyed_call(k) for k in keys.reshape(-1).tolist()]

    def stopped(self, batch: Mapping[str, Any], gens: Sequence[Generation]) -> list[Generation]:
        """``gens`` (one per row of ``batch``) each ended at its call's first stop string
        (:func:`~marl_agents.llm.stop_strings.cut_at_stop`; rows whose call gave none: as
        they are). Whatever the constrain mode: ``stop`` is no constraint."""
        calls = self.batch_calls(batch)
        if not any(c.stop for c in calls):
            return list(gens)
        from marl_agents.llm.stop_strings import cut_at_stop

        return [
            cut_at_stop(self.tokenizer, g, c.stop) if c.stop else g
            for g, c in zip(gens, calls, strict=True)
        ]

    def row_constraints(self, observations: Sequence[Any]) -> list[Any] | None:
        """Per observation (each as the env handed it on), the constraint its call declared
        (:func:`~marl_agents.llm.constraints.constraint_of`); ``None`` with ``constrain: off``."""
        if self.constrain == "off":
            return None
        from marl_agents.llm.constraints import constraint_of

        return [constraint_of(o) for o in observations]

    def _token_masks(self, gens: Sequence[Generation]) -> np.ndarray:
        """``[B, max_new_tokens, words]`` int32: each token's sampling bitmask, ``-1`` free."""
        from marl_agents.llm.constraints import mask_words

        words = mask_words(int(self.model.config.vocab_size))
        masks = np.full((len(gens), self.spaces.max_new_tokens, words), -1, dtype=np.int32)
        for r, g in enumerate(gens):
            if g.token_masks is not None:
                m = np.asarray(g.token_masks, dtype=np.int32)
                masks[r, : len(m)] = m
        return masks

    # ----- RLlib forwards ------------------------------------------------------------------
    @override
    def _forward_exploration(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._act(batch, self.temperature)

    @override
    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._act(batch, self.inference_temperature)

    @override
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return self._act(batch, self.temperature)

    @override
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        self.check_trainable()
        lp, ent = self.score(
            batch[Columns.OBS],
            batch[Columns.ACTIONS],
            with_entropy=True,
            temperature=self.batch_temperature(batch),
            token_mask=self.batch_token_mask(batch),
        )
        return {TOKEN_LOGP: lp, TOKEN_ENTROPY: ent}

    def score(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        *,
        with_entropy: bool = False,
        model: Any = None,
        temperature: float | torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher-forced logprobs (and entropies) of ``actions`` after ``obs``, with gradients.

        Scored under ``softmax(logits / temperature)`` (no top-p truncation), masked by
        ``token_mask`` where given.

        Args:
            obs: ``[B, max_prompt_tokens]`` padded prompt ids.
            actions: ``[B, max_new_tokens]`` padded generated ids.
            with_entropy: also return the next-token entropies (of the tempered distribution).
            model: score with this LM instead of the module's (e.g. a frozen reference).
            temperature: one ``> 0`` for all rows or ``[B]`` per row; ``None``: the module's
                exploration ``temperature``. Pass ``1.0`` for the raw model's logprobs.
            token_mask: ``[B, max_new_tokens, words]`` sampling bitmasks (:data:`TOKEN_MASK`,
                :meth:`batch_token_mask`), or ``None``: no constraint.

        Returns:
            ``(logprobs, entropy)``, each ``[B, max_new_tokens]`` float32, zeros on padding
            (``entropy`` is ``None`` unless asked).
        """
        from marl_agents.llm.hf_backend import teacher_forced_logprobs

        lm = self.model if model is None else model
        lm.eval()  # no dropout: score under the distribution that sampled
        width = self.spaces.max_new_tokens
        n = len(obs)
        device = next(lm.parameters()).device
        lp = torch.zeros((n, width), dtype=torch.float32, device=device)
        ent = torch.zeros((n, width), dtype=torch.float32, device=device) if with_entropy else None
        if n == 0:
            return lp, ent
        prompts, tokens = self.prompts(obs), self.completions(actions)
        temps = torch.as_tensor(
            self.temperature if temperature is None else temperature, dtype=torch.float32
        ).reshape(-1)
        temps = temps.expand(n) if temps.numel() == 1 else temps
        if temps.numel() != n:
            raise ValueError(f"{temps.numel()} temperatures for {n} rows: give one, or one per row")
        rows = [r for r in range(n) if tokens[r]]
        if not rows:
            return lp + 0.0 * sum(p.sum() for p in lm.parameters()), ent
        out_lp, out_ent = teacher_forced_logprobs(
            lm,
            [prompts[r] for r in rows],
            [tokens[r] for r in rows],
            pad_id=self._lm_pad,
            with_entropy=with_entropy,
            temperature=temps[rows],
            token_masks=None if token_mask is None else [token_mask[r] for r in rows],
        )
        index = torch.as_tensor(rows, device=device)
        t = out_lp.shape[1]
        lp = lp.index_copy(0, index, torch.nn.functional.pad(out_lp, (0, width - t)))
        if ent is not None and out_ent is not None:
            ent = ent.index_copy(0, index, torch.nn.functional.pad(out_ent, (0, width - t)))
        return lp, ent

    def save_pretrained(self, path: str) -> None:
        """Save the LM and its tokenizer as a Hugging Face directory (a LoRA module: its
        adapter as a peft directory, loadable with ``PeftModel.from_pretrained``)."""
        if self.lora:
            from marl_agents.llm.lora import save_adapter

            save_adapter(self.model, path)
        else:
            self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)

    def save_merged(self, path: str) -> None:
        """A LoRA module: save its base with the adapter merged in (and the tokenizer)."""
        if not self.lora:
            raise ValueError("save_merged is for LoRA modules; use save_pretrained")
        from marl_agents.llm.lora import save_merged

        save_merged(self.model, path)

    @override
    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        # ``.to(device)``: a LoRA module's shared base (not a submodule) moves with it
        if getattr(self, "lora", False):
            self.model.shared.inner._apply(fn, recurse)
        return super()._apply(fn, recurse)


def spaces_from(observation_space: Any, action_space: Any) -> TextSpaces:
    """Recover :class:`TextSpaces` from a text agent's gym spaces.

    Raises:
        TypeError: the spaces are not the ``MultiDiscrete`` text spaces.
    """
    spaces = TextSpaces.of(observation_space, action_space)
    if spaces is None:
        raise TypeError(
            "CausalLMModule needs text spaces (MultiDiscrete([vocab_size + 1] * length) for both "
            f"observation and action, see TextSpaces); got {observation_space} and {action_space}"
        )
    return spaces
