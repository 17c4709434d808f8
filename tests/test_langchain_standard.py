"""LangChain's own standard test suites (``langchain-tests``) as the contract of our chat models.

* :class:`TestServedEndpoint`: ``ChatModelIntegrationTests`` on LangChain's ``ChatOpenAI``
  pointed at ``marl serve`` of a trained tiny run (the ``openai``-SDK router app trained one
  GRPO iteration, as ``tests/test_serve.py`` trains it; greedy replies of the trained pool).
* :class:`TestEnvChatModelIntegration` / :class:`TestEnvChatModelUnit`:
  ``ChatModelIntegrationTests`` and ``ChatModelUnitTests`` on
  :class:`~marl_agents.llm.env_chat_model.EnvChatModel` — the class ``ChatAppScenario`` hands to
  apps — with a backend (the tiny model), so that outside an episode it answers by itself, on
  the rendering, tool-call, constrained-decoding, streaming and ``stop`` paths its episodes use.

Every test of the suites runs and passes except those listed in :data:`NEEDS_JUDGEMENT` (and
``test_json_mode`` on the endpoint), each xfail with its reason: they check what a capable
model chooses to say, which a random tiny model cannot; and the inputs the suites skip
themselves (images, audio, PDFs: text-only models; a model override, VCR cassettes). The
structured-output tests pass with the random model: constrained replies close within
``max_new_tokens`` (:mod:`marl_agents.llm.closing`).

The async tests share one event loop per session (``pytest.mark.asyncio(loop_scope=
"session")`` on these classes only, :func:`contract`; nothing in pytest's configuration
changes): ``langchain-openai`` caches its async HTTP client across tests, and a
client made on one test's loop fails on the next one's ("Event loop is closed").
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("langchain_tests")
pytest.importorskip("langchain_openai")

from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

#: test name → why it is not expected to pass with a random tiny model
NEEDS_JUDGEMENT = {
    "test_tool_calling": "asks for the tool's argument {'input': 3}: the value is the model's "
    "judgement (a constrained reply is a valid call, with whatever integer the model picks)",
    "test_tool_calling_async": "the async twin of test_tool_calling (the argument 3)",
    "test_unicode_tool_call_integration": "expects the model to copy a CJK argument from the "
    "prompt into the call",
    "test_agent_loop": "expects the model to call the weather tool for 'sf' and then answer",
    "test_bind_runnables_as_tools": "expects the model to call the tool with sensible "
    "arguments chosen from the question",
}


def _xfail_copy(test: Any, reason: str) -> Any:
    """A subclass's copy of the suite's ``test`` marked xfail with ``reason`` (the suite's
    function and its own marks are left alone: every subclass in the process shares them)."""
    if inspect.iscoroutinefunction(test):

        @functools.wraps(test)
        async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await test(self, *args, **kwargs)

    else:

        @functools.wraps(test)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            return test(self, *args, **kwargs)

    return pytest.mark.xfail(reason=reason, strict=False)(run)


def contract(**more: str) -> Any:
    """A class decorator: the class's async tests on the session's event loop (module
    docstring; the mark on the class reaches its sync tests too, where pytest-asyncio only
    warns, silenced here) and the tests of :data:`NEEDS_JUDGEMENT` (and ``more``: test name →
    reason) marked xfail with their reasons."""

    def mark(cls: type) -> type:
        for name, reason in {**NEEDS_JUDGEMENT, **more}.items():
            if hasattr(cls, name):  # integration tests (the unit suite has none of them)
                setattr(cls, name, _xfail_copy(getattr(cls, name), reason))
        session_loop = pytest.mark.asyncio(loop_scope="session")
        quiet = pytest.mark.filterwarnings(
            "ignore:The test .* is marked with '@pytest.mark.asyncio':pytest.PytestWarning"
        )
        return quiet(session_loop(cls))

    return mark


# ----- ChatOpenAI → marl serve -----------------------------------------------------------------
_SERVED: dict[str, Any] = {}


@pytest.fixture(scope="module")
def served_run(ray_session: Any, tmp_path_factory: Any) -> Any:
    """``marl serve`` (greedy) of the router app trained one GRPO iteration (its ``router``
    pool learning, ``worker`` frozen)."""
    from configs import tiny_config

    from trainers.run.loop import train
    from trainers.serve import serve

    cfg = tiny_config(
        tmp_path_factory.mktemp("standard"),
        scenario="tests.apps.openai_router:scenario",
        scenario_kwargs={"max_prompt_tokens": 320, "max_new_tokens": 48},
        sharing="explicit",
        train=["router"],
        pools={
            "router": {"agents": ["router"], "model": {"type": "llm", "path": "tiny"}},
            "worker": {
                "agents": ["worker"],
                "model": {"type": "llm", "path": "tiny", "tiny_seed": 1},
            },
        },
        algorithm={
            "name": "GRPO",
            "num_epochs": 1,
            "grpo": {"group_size": 2, "groups_per_iteration": 2},
        },
        budget={"iterations": 1},
        seed=0,
    )
    result = train(cfg)
    assert result.status == "completed", result.status
    served = serve(Path(result.run_dir), greedy=True)
    _SERVED["served"] = served
    yield served
    served.stop()


@contract(
    test_json_mode="response_format json_object carries no schema: the keys 'setup' and "
    "'punchline' are the model's judgement from the prompt (any JSON object is a valid reply; "
    "the tiny model answers {})"
)
@pytest.mark.slow  # trains a run first (~35 s here); the in-process suites below run by default
@pytest.mark.usefixtures("served_run")
class TestServedEndpoint(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type:
        from langchain_openai import ChatOpenAI

        return ChatOpenAI

    @property
    def chat_model_params(self) -> dict[str, Any]:
        served = _SERVED["served"]
        return {
            "base_url": served.base_url,
            "api_key": served.key,
            "model": "router",  # the trained pool's agent
            "max_retries": 0,
            "stream_usage": True,  # the usage chunk (stream_options.include_usage)
        }

    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True

    @property
    def supports_image_inputs(self) -> bool:
        return False  # text only


# ----- EnvChatModel (ChatAppScenario's) ---------------------------------------------------------
def env_chat_model_params() -> dict[str, Any]:
    from marl_agents.llm.backend import SamplingParams
    from marl_agents.llm.hf_backend import HFBackend
    from marl_agents.llm.tiny import make_tiny_model
    from scenarios.text_space import TextSpaces

    if "tiny" not in _SERVED:
        _SERVED["tiny"] = make_tiny_model(seed=0)
    tok, model = _SERVED["tiny"]
    spaces = TextSpaces.for_tokenizer(tok, 512, 48, model)
    return {
        "tokenizer": tok,
        "spaces": spaces,
        "backend": HFBackend(model, tok),
        "params": SamplingParams(temperature=0.0, max_new_tokens=48),
    }


class EnvChatModelSpec:
    """What both standard suites are told about ``EnvChatModel`` (mixed in before each)."""

    @property
    def chat_model_class(self) -> type:
        from marl_agents.llm.env_chat_model import EnvChatModel

        return EnvChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return env_chat_model_params()

    @property
    def has_tool_choice(self) -> bool:
        return True


@contract()
class TestEnvChatModelIntegration(EnvChatModelSpec, ChatModelIntegrationTests):
    @property
    def supports_json_mode(self) -> bool:
        return True

    @property
    def returns_usage_metadata(self) -> bool:
        return False


@contract()
class TestEnvChatModelUnit(EnvChatModelSpec, ChatModelUnitTests):
    pass
