"""``marl serve runs/<run>``: a trained run's agents on an OpenAI-compatible endpoint.

The run's config and modules load as for ``marl eval`` (:func:`trainers.evaluate.load_team`);
each agent answers with its pool's module (trained, frozen or scripted, as the run mapped it)
through the gateway's protocol (:mod:`marl_agents.gateway`): ``POST /v1/chat/completions``
(streaming, ``tools``/tool calls, ``response_format``), ``POST /v1/completions`` and
``GET /v1/models`` (the agents' model names). A request is rendered and parsed exactly as in
an episode (:mod:`marl_agents.gateway.standalone`): the agent's chat model, the chat template,
the prompt ids, the pool's module sampling at its exploration ``temperature`` (or greedily
with ``greedy``), the sampled ids decoded and parsed for tool calls.

The scenario must be a chat app (a ``ChatAppScenario`` or an ``AppScenario``): its agents'
chat models are what render the requests. Model names are the agent ids (an ``AppScenario``'s
``model_names`` where it sets them).

**Safe by default**, as the gateway: the loopback address only (``host`` another address
exposes every agent of the run to whoever reaches the port with the key, over plain HTTP),
one key for the server (random unless given, printed at start), bounded bodies (4 MiB) and
prompts (bounded in characters before they are tokenised, :mod:`marl_agents.gateway.
prompt_bound`), an unknown model a 404 listing the agents. A request names a model only,
never a file.

**Prompts as the run trained on them.** A prompt longer than the agent's ``max_prompt_tokens``
is cut by default exactly as the agent's chat model cut it in training (its system message and
newest tokens, :mod:`marl_agents.llm.prompt_fit`): the served policy sees what it learned on.
``truncate_prompts=False`` (``--no-truncate-prompts``) refuses it instead, as OpenAI does (a
400 ``context_length_exceeded`` naming the flag).

**Stop strings** (``stop``) end a free reply before the first one, as OpenAI and vLLM do
(:mod:`marl_agents.llm.stop_strings`); the returned ``token_ids`` end with the token that
completed it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from trainers.configs.typed import ConfigError

#: the environment variable ``marl serve`` reads its key from (when ``--key`` is not given)
KEY_VARIABLE = "MARL_SERVE_KEY"


@dataclasses.dataclass
class Served:
    """A running ``marl serve``.

    Attributes:
        gateway: the HTTP server (:class:`~marl_agents.gateway.server.Gateway`).
        team: the agents answering (:class:`~marl_agents.gateway.standalone.ServedTeam`).
        config: the run's experiment config.
        greedy: replies are greedy (else sampled at each pool's temperature).
    """

    gateway: Any
    team: Any
    config: Any
    greedy: bool

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``http://host:port/v1``)."""
        return str(self.gateway.base_url)

    @property
    def key(self) -> str:
        """The API key clients send."""
        return str(self.team.key)

    @property
    def models(self) -> list[str]:
        """The model names served (one per agent)."""
        return sorted(self.team.models)

    def stop(self) -> None:
        """Stop serving."""
        self.gateway.stop()


def serve(
    checkpoint: str | Path,
    *,
    host: str | None = None,
    port: int = 0,
    key: str | None = None,
    greedy: bool = False,
    truncate_prompts: bool = True,
) -> Served:
    """Serve the agents of the run (or checkpoint) ``checkpoint`` until :meth:`Served.stop`.

    Args:
        checkpoint: a run directory or a checkpoint inside one.
        host: the address to listen on (default: loopback only; see the module docstring).
        port: the port (0: a free one).
        key: the API key (default: a random one: :attr:`Served.key`).
        greedy: greedy replies (temperature 0) instead of sampling at the pools' temperatures.
        truncate_prompts: cut a prompt longer than the agent's ``max_prompt_tokens`` as the
            run trained on it (the default: the chat model's own rule, the system message and
            the newest tokens, :mod:`marl_agents.llm.prompt_fit`); ``False``: refuse it (a 400
            ``context_length_exceeded`` naming this setting), as OpenAI does.

    Raises:
        ConfigError: no checkpoint or config, a scenario that is not a chat app, a bad key.
    """
    from marl_agents.gateway.episodes import Registry
    from marl_agents.gateway.server import LOOPBACK, Gateway
    from marl_agents.gateway.standalone import ServedTeam
    from trainers.evaluate import load_team
    from trainers.run.process import setup_process

    if key is not None and (not key.strip() or key != key.strip()):
        raise ConfigError(f"the key {key!r} must be a non-empty string without surrounding spaces")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"port must be 0 (a free one) to 65535, got {port!r}")
    setup_process(hash_seed_matters=False)
    cfg, plan, policy = load_team(checkpoint)
    scenario = plan.env.build_scenario()
    chat_models = getattr(scenario, "models", None)
    if chat_models is None or not getattr(scenario, "has_text_agents", False):
        raise ConfigError(
            f"marl serve serves chat apps (ChatAppScenario, AppScenario): the run's scenario "
            f"{getattr(scenario, 'name', type(scenario).__name__)!r} has no chat models "
            "rendering requests for its agents; evaluate it with marl eval"
        )
    agents = [a for a in chat_models if a in policy.agent_to_pool]
    team = ServedTeam(
        {a: chat_models[a] for a in agents},
        module_policy(policy, greedy),
        model_names=getattr(scenario, "model_names", None),
        key=key,
        truncate_prompts=truncate_prompts,
    )
    registry = Registry(key_hint="the key marl serve printed at start (or gave with --key)")
    registry.add(team)
    gateway = Gateway(LOOPBACK if host is None else host, port, registry=registry)
    return Served(gateway, team, cfg, greedy)


#: most requests of one pool sampled in one ``generate`` by ``marl serve``
SERVE_BATCH = 32
#: how long the first of them waits for others (seconds)
SERVE_WAIT_S = 0.005


class _ModuleSampler:
    """An LLM module as the backend a :class:`~marl_agents.llm.batching.BatchingBackend`
    wraps: ``generate(prompts, params)`` with the module's own sampler."""

    def __init__(self, module: Any) -> None:
        self.module, self.tokenizer = module, module.tokenizer

    def generate(self, prompts: Any, params: Any = None) -> Any:
        import torch

        with torch.no_grad():
            return self.module.sample(list(prompts), params)


def module_policy(policy: Any, greedy: bool) -> Any:
    """``(agent, observation) → action`` with the agent's pool's module, safe to call from
    many threads: an LLM module generates (at its exploration temperature, or 0 with
    ``greedy``) under the constraint the call declared, the calls waiting at once for one
    pool sampled in one ``generate`` (up to :data:`SERVE_BATCH`; the first waits
    :data:`SERVE_WAIT_S` for others); another module acts as in evaluation
    (:class:`TeamPolicy`), one call at a time."""
    import threading

    from marl_agents.llm.batching import BatchingBackend
    from marl_agents.llm.rl_module import CausalLMModule

    batchers = {
        pool: BatchingBackend(
            _ModuleSampler(module), max_batch_size=SERVE_BATCH, max_wait_s=SERVE_WAIT_S
        )
        for pool, module in policy.modules.items()
        if isinstance(module, CausalLMModule)
    }
    small = threading.Lock()

    def act(agent: str, observation: Any) -> Any:
        pool = policy.agent_to_pool[agent]
        module = policy.modules[pool]
        if pool not in batchers:
            with small:
                return policy.act({agent: observation}, explore=not greedy)[agent]
        rows = np.asarray(observation)[None]
        temperature = 0.0 if greedy else module.temperature
        params = module.sampling_params(1, temperature, None, module.row_constraints([observation]))
        [gen] = batchers[pool].generate(module.prompts(rows), params)
        return module.spaces.encode_action(gen.token_ids)

    act.batchers = batchers  # type: ignore[attr-defined]  (batch sizes, for tests and benches)
    return act


__all__ = ["KEY_VARIABLE", "Served", "module_policy", "serve"]
