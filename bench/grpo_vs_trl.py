"""Our GRPO fine-tuning path against TRL's ``GRPOTrainer`` on the same task, model and batch.

The task is ``text-delegate`` (level ``easy``, ``star:8``, scripted subagents): one prompt per
episode, the orchestrator's completion is scored by the real environment
(:class:`~scenarios.graph_env.GraphEnv`, the same reward both sides). The model is the tiny
in-code Qwen2 (:func:`marl_agents.llm.tiny.make_tiny_model`, same seed), sampled at
temperature 1, top-p 1. Both sides use the same group size ``G``, prompts per update ``B``,
generation length, learning rate, clip range (0.2 / 0.28), no KL, token-mean loss, one
epoch over each batch:

* ``ours``: :func:`trainers.finetune.run_finetune` (what ``marl finetune`` runs): RLlib
  sampling through the LangGraph env, token-level GRPO learner (the built-in path);
* ``endpoint``: the same job with the same task as an app talking to our OpenAI-compatible
  gateway (:func:`endpoint_scenario`, an ``AppScenario``): per episode the app (a plain
  function on its thread, one ``openai`` client per process, used with the episode's base URL
  and key) sends the orchestrator's prompt and returns the sampled ids (``return_token_ids``);
  the verifier scores them with the env's reward. ``--api chat`` (default):
  ``chat.completions`` with text-delegate's system and user messages, the gateway renders its
  chat template and the scenario's ``prefill`` (the opened ``assign`` call, read off the user
  message) ends the prompt; ``--api completions``: ``completions`` with the built-in env's
  prompt token ids (the gateway's token-id prompts). **The prompts are identical token for
  token** either way (chat: checked on 2000 seeds; the tasks come from the same seeds, and
  each run's generated tokens per update equal the built-in run's: same prompts, same
  samples). ``--path builtin|endpoint|both`` picks our sides (default both);
* ``trl``: ``trl.GRPOTrainer`` (``loss_type="dapo"``, ``beta=0``), prompts rendered from the
  same env seeds, reward = the env's reward for the completion's token ids.

Each side runs in a fresh subprocess with one torch thread (TRL: ``--trl-threads``); ``--rounds
N`` runs every side ``N`` times, alternating, and prints medians. Our side runs once per
``--in-flight`` value (``algorithm.grpo.groups_in_flight``: ``1``, one group of ``G`` sub-envs
at a time, ``G`` rows per ``generate``, as before issue #29; ``all``, the default, all ``B``
groups side by side, ``G·B`` rows per ``generate`` as TRL). Printed per side (the first update
left out as warm-up): generated tokens/s (completion tokens sampled per update / wall time of
the update), median wall time per update (sampling + learning), generated tokens per CPU second
of the process (what load on a shared machine changes least), and the ratios ours / TRL. The
``sampler`` column is ``transformers`` for both; ``--sampler vllm`` also runs our side with the
vLLM sampler where the pool model has one (``sampler: vllm``), else it prints ``n/a``.

**Through the endpoint** (2026-11-27 17:33–18:01 UTC, the 2-core CPU box, other jobs
running: ``uptime`` load averages below; TRL 1.16, G=8, B=8, ``--in-flight all --rounds 3
--updates 5``; wall times swing ±40% under load, tokens per CPU second much less):

    tokens  api          load   tokens/s: ours endpoint  TRL   endpoint/TRL    endpoint/ours
                                                               tok/s  tok/CPU  tok/s  tok/CPU
    16      chat         3–5              2389      973  1352  ×0.72  ×0.85    ×0.41  ×0.48
    4       chat         4–5              1193      350   416  ×0.84  ×0.91    ×0.29  ×0.31
    16      chat         7–9              2159      873   842  ×1.04  ×0.89    ×0.40  ×0.44
    16      chat         9–11             1488      826   538  ×1.54  ×0.93    ×0.56  ×0.48
    4       chat         6–7              1138      254   400  ×0.63  ×0.88    ×0.22  ×0.29
    16      completions  5–6                 –      469  1301  ×0.36  ×0.75        –      –

(the built-in path / TRL in the same runs, top down: ×1.77, ×2.87, ×2.56, ×2.77, ×2.84
tokens/s; ×1.78, ×2.90, ×2.03, ×1.93, ×3.00 tokens per CPU second.) The goal (≥ 1.5× TRL
through the endpoint) is **not met**: in CPU terms the endpoint is 0.75–0.93× TRL (×1.54 in
wall time only in the run where TRL's wall time suffered most from the load). The endpoint
update spends 0.49–0.77 s in ``env`` against the built-in path's 0.03–0.04 s; generation and
learning are the same (``forward`` and ``learn`` within noise, 64 rows per ``generate`` both).
Where it goes, per 64 episodes of a scripted reply (``GraphEnv`` reset + step, CPU seconds of
the process, load ~4): built-in on the fast path 0.036; built-in on LangGraph's runtime 0.124
(an app episode needs LangGraph's run config: ``needs_langgraph``); endpoint with an app of
``http.client`` 0.27–0.32, of a shared ``httpx`` client 0.33, of the ``openai`` client
0.43–0.45 (``chat``) and 0.47 (``completions``: the client's request typing walks each of the
~128 ids). Per episode with the ``openai`` chat app (CPU ms by thread, ``time.thread_time``):
7.2 in all, of which the app's thread (the client) 2.1, the gateway's HTTP thread 0.3, this
bench's verifier (it replays the text-delegate episode to score the ids) 0.8, and ~4 in the
env's thread, against 0.56 for a whole built-in episode: an in-process ``ChatAppScenario`` twin
of the app (one LangGraph node calling the agent's chat model) costs 2.1 in all (LangGraph's
runtime, LangChain's call), the rest is the gateway's side (the app's thread start, the
episode's queue and hand-offs, the reply's id bookkeeping). On top, each reset waits for its
app's request (thread hand-offs), ~10 ms wall per episode under this load, as the runner resets
its envs one after another. A client made per episode (``OpenAI(...)`` in ``run``) costs ~47 ms
more (its TLS context). ``episodes.env_threads`` (tried) overlaps those waits but splits the
batch (21–32 rows per ``generate`` instead of 64) and gained nothing. Leads (``py-spy record
--gil`` of that loop, share of the process's Python time): the app's thread started per episode
(``Thread.start`` 7%), LangChain's per-call callback set-up (``CallbackManager.configure``, its
environment-variable checks, 7%; the twin pays it too), the recording copy of the chat model
made per episode (``Episode._model``: LangChain re-serialises each copy, 4%), the fidelity
render of the prompt (``TurnIds.prompt`` 6%), and LangGraph's runtime around the app's one
node.

**Built-in path, now** (2026-11-27 18:17–18:22 UTC, 2-core box, load 3–8 from other jobs,
``--path builtin --in-flight 1,all --rounds 3 --updates 5``; medians, per-update phases):

    max_new_tokens  ours/TRL tokens/s    ours/TRL tokens per CPU s   ours s/update (k=all):
                     k=1     k=all        k=1     k=all               generate  learn   TRL
    16               ×1.42   ×2.17        ×1.40   ×2.17                0.106    0.172   0.724
    4 (the task's)   ×2.51   ×3.03        ×2.37   ×2.75                0.050    0.137   0.878

What changed since the runs below: rows sharing a prompt (a GRPO group's ``G`` rows) run it
once — the sampler's prefill and the learner's teacher-forced forward/backward
(:mod:`marl_agents.llm.prefix`; the task's prompts are 128 tokens, the replies 4–16, so the
learner's work fell ~4×: 0.53 → 0.16 s a step at 16 tokens) — and each decoding step draws
every row's token in a few batched ops (:mod:`marl_agents.llm.row_sampling`; 0.215 → 0.106 s a
generate at 16 tokens with both). So the goal (≥ 1.5× TRL) is met on the built-in path in
wall time and in CPU time with all groups in flight, the default of GRPO experiments and
(since this run) of ``marl finetune`` (one group at a time: ×1.40–2.51). TRL runs the prompt
once per row (a forward over prompt + completion per row); vLLM's prefix cache would give its
sampler the prefill share, not its learner.

**Cheaper app episodes** (2026-11-27 18:35–18:39 UTC, the same box at load 8.5–12: the code
before and after, alternating, two runs each, ``--rounds 1 --updates 4 --max-new-tokens 16``,
chat): app threads reused (``_Workers``), recording copies of the chat models reused
(``RecordingCopies``), the model called without LangChain's ``invoke``, rendered prompts kept
(a GRPO group sends one prompt 8 times), live episodes on LangGraph without the fast path's
attempt (a ``Scenario.live_langgraph`` flag, removed since: app episodes now run on the
fast path, below):

    code     env s/update   endpoint/TRL tok/s  tok/CPU s   endpoint/ours tok/s  tok/CPU s
    before   1.020, 0.735   ×0.43, ×0.68        ×0.77, ×0.93  ×0.17, ×0.30       ×0.34, ×0.42
    after    0.582, 0.374   ×0.53, ×1.10        ×0.94, ×1.16  ×0.27, ×0.54       ×0.48, ×0.56

Per 64 episodes of a scripted reply (``GraphEnv`` reset + step, no model, process CPU): 0.45–0.52
s before, 0.33–0.36 s after (the env's thread 0.28–0.34 → 0.16–0.17 s); wall under load
0.7–2.9 s before (a thread started per episode waits to be scheduled), 0.49–0.74 s after.
Still short of ×1.5 TRL: what is left is the ``openai`` client's own ~2 ms a request (the app's
thread), LangGraph's runtime around the node (~40% of the env thread's time now), the
verifier's replay, and ~6 thread hand-offs per episode, one episode after another (resets
and steps are sequential in the runner's thread; under load each hand-off waits for the
scheduler). Overlapping them needs the runner to start every sub-env's app before waiting for
any first request (a reset split into start and finish); not done.

**App episodes on the fast path** (2026-11-27 20:45–21:10 UTC, the same box with 2–4
simple_spread trainings running niced at 19 beside it): an app episode's node now runs on the
fast path (the gateway's decisions name their agent, so the fast bridge answers them without
LangGraph's run config; an app that fails ends its episode, never replayed), and a prefill is
tokenised once per text. Per 64 episodes of a scripted reply (no model, process CPU): 0.26–0.34
→ 0.20–0.21 s. ``--path both|endpoint --in-flight all --rounds 3 --updates 5``, chat, medians:

    tokens  run   endpoint tok/s  TRL tok/s   endpoint/TRL tok/s  tok/CPU s   endpoint env s/update
    16      1     1162            734         ×1.58               ×1.37       0.358
    4       1      385            252         ×1.53               ×1.24       0.357
    16      2      992            464         ×2.14               ×1.32       0.356
    4       2      295            129         ×2.29               ×1.51       0.446
    16      quiet 1615           1350        ×1.20               ×1.22       0.330
    4       quiet  483            399        ×1.21               ×1.22       0.350

(run 1: the fast path, its later children with the prefill change too; run 2: both; quiet:
the final code alone on the box, 22:15–22:18 UTC, load < 1.) Under load TRL's wall time
suffers more than ours (its wall/CPU 1.8–2.8, ours 1.5–1.8), which made runs 1–2 pass the
goal in tokens/s; on the quiet box both measures agree at **×1.20–1.22: the goal (≥ 1.5×)
is not met through the endpoint** (it is on the built-in path). The endpoint's update is
0.63 s at 16 tokens, 0.33 s of it the 64 app episodes (~5 ms each, CPU-bound): 1.5× TRL needs
~0.19 s. What is left per episode (CPU, ``py-spy --gil``): the app's ``openai`` client ~1 ms
(31%: the app's own cost, which TRL does not have), the gateway's answer ~0.75 ms, the reset and
step around it, the verifier's replay ~0.3 ms (TRL's reward pays it too).

**Why the endpoint stops short of ×1.5 here** (2026-11-28 07:55–08:55 UTC, a fresh quiet
box, load < 0.5; ``--path endpoint --in-flight all --rounds 3 --updates 5
--max-new-tokens 16``): endpoint 1357 tokens/s, TRL 1207, **×1.12** (×1.13 per CPU second);
the endpoint's update 0.739 s = env 0.380 + generate 0.142 + learn 0.230; TRL's 0.832 s.
×1.5 needs ≤ 0.555 s, i.e. env ≤ ~0.19 s for the 64 app episodes. The process is CPU-bound
on one core (tokens per CPU second = tokens/s), so waiting is not the cost: CPU is. Per 64
episodes of a scripted reply (no model; ``GraphEnv`` reset + step on the runner's path,
process CPU = wall, 0.25–0.30 s): the ``openai`` client alone takes **2.5–2.9 ms CPU a
request** (``chat.completions.create`` with these messages against a trivial HTTP server in
another process: the SDK's request building and ``_transform_recursive``, httpx, response
parsing), i.e. 0.16–0.19 s an update, a fifth of TRL's whole update, and our side (HTTP
server, gateway answer, env, the bench's verifier) ~1.9 ms. Parsing is not it (stdlib
header parsing 38 µs, ``parse_chat`` 13 µs a request; ``py-spy --gil`` blames frames where
threads wake, e.g. ``Condition.__init__``). Prototypes (``/tmp`` scripts, not landed),
per 64 scripted episodes: the app's client run in **another process** (a spawned host
taking jobs over a queue) 0.30 → 0.244 s (our process's CPU 0.12 s); with every sub-env
on its own thread as well, 0.214–0.225 s (thread hand-offs add CPU: 0.12 → 0.147 s); the
next sample's resets started during the learner's update (64 env threads beside a 0.5 s
forward/backward of the tiny model) hide about half of the resets' 0.22 s. Together those
would save ~0.1–0.15 s an update, ×1.3–1.4 TRL on this box, still short of ×1.5, at the
cost of an app host process, a batching window for threaded sub-envs and taking the next
sample's first observations before the weight sync; not built. The goal stays **not met
through the endpoint** on this 2-core CPU; the built-in path meets it (×2.17–3.03).

**With asynchronous sampling** (2026-11-28 11:03–11:14 UTC, a quiet box, load < 1.5;
``--path endpoint --runner async --in-flight all --rounds 2 --updates 6 --max-new-tokens
16``; tokens per CPU second then count the driver alone, so no ratio of them is printed): one
remote env runner (the gateway, the app's threads, ``generate``) samples update ``k+1`` while
the driver learns from ``k`` (``algorithm.grpo.async_sampling``, staleness 1):
endpoint 1793 tokens/s, 0.559 s an update (runner: env 0.40, generate 0.13; driver: learn
0.20) against TRL on one thread 1120 tokens/s, 0.923 s: **×1.60**. But that is two processes
on two cores, and samples one update stale, against TRL's one thread and on-policy samples.
Given the same two cores (``--trl-threads 2``, the next run) TRL takes 0.488 s an update
(2081 tokens/s: the model's matmuls use both cores) and the asynchronous endpoint 0.568 s:
**×0.87**. So ×1.5 through the endpoint comes only from a core TRL does not use; at equal
cores it is not met here. What the endpoint pays and TRL does not is the app's Python HTTP
path: ~4.6 ms of CPU a request (the app's ``openai`` client ~2.7, our server, gateway and
env ~1.9), 0.3 s per 64 episodes, 60% of TRL's whole update on two threads.
The built-in path at equal cores (12:34–12:40 UTC, ``--path builtin --runner async
--trl-threads 2``, same settings): ours 4275 tokens/s, 0.230 s an update (runner: env 0.04,
generate 0.14; driver: learn 0.18) against TRL on two threads 1709 tokens/s, 0.595 s:
**×2.50**, the goal held with both sides on the same two cores.

**Built-in path, earlier** (2026-11-27, TRL 1.16, G=8, B=8, 5 timed updates, float32
both, ``--rounds 3``, load average 7–12 from other jobs: wall times swing ±40% between runs,
so compare within a run), two runs per setting:

    max_new_tokens  run  ours/TRL tokens/s    ours/TRL tokens per CPU s
                          k=1     k=all (8)    k=1     k=all
    4 (the task's)   1   ×0.94   ×1.23        ×0.93   ×0.99
    4                2   ×1.76   ×2.34        ×0.92   ×0.99
    16               1   ×1.08   ×1.10        ×0.72   ×0.88
    16               2   ×1.26   ×1.77        ×0.79   ×0.98

All groups in flight take 1.06–1.07× less CPU per generated token than one group at a time
at 4 tokens and 1.22–1.24× less at 16 (``sample()`` alone, 64 episodes: 0.214 → 0.203 CPU s
at 4 tokens, 0.416 → 0.324 at 16, nearly all of it ``generate``), and our wall time per update
falls by 1.03–1.41×; in CPU terms we are now level with TRL (×0.88–0.99). The goal (≥ 1.5×
TRL's tokens/s) is met in wall time in one run of each setting but not in CPU time: on this
CPU the tiny model's ``generate`` is compute-bound (the prefill of ``G·B`` prompts costs the
same in one call as in eight), so batching saves only the per-call and per-decode-step
overhead, and our learner makes one more forward than TRL's (the ``kl_to_start`` monitor's
no-grad forward; TRL computes no reference at ``beta=0``). Where a call costs latency rather
than compute (a GPU), one call of ``G·B`` rows instead of ``B`` calls of ``G`` should gain
more; not measured here. (Earlier, on a quiet machine, k=1 gave ×0.96 at 4 tokens and ×0.78
at 16 in wall time; a later rename of our ``GRPOConfig`` to ``GRPOLoss`` had also renamed
TRL's here and broken the TRL side until this run.) TRL's defaults (``bf16=True`` autocast,
gradient checkpointing) made it ~4× slower on this CPU (32.9 s/update busy), so they are
turned off here.

On a GPU (``--device cuda --model qwen2-0.5b``: Qwen2-0.5B's 24-layer body built in code,
358M parameters with the 384-token vocabulary, float32 both sides; ours: a GPU env runner and a
GPU learner, 0.5 GPU each, TRL in one process), one NVIDIA H200, 2026-11-27, G=8, B=8,
``--max-new-tokens 32``, one round:

    side        updates timed  s/update  tokens/s
    ours k=1          5          14.31      128.5
    ours k=all        2           5.24      378.4
    TRL               2           1.81     1118.5     ours k=all / TRL: ×0.34

(k=all and TRL in a second call on the same warm machine, 3 updates each, the first left out;
k=1 in the first call, where k=all and TRL ran out of the call's time.) One ``generate`` of all
64 rows instead of 8 of 8 made our update 2.7× faster, as expected where a decoding step costs
latency rather than compute, but the goal (≥ 1.5× TRL) is far off: ours is 2.9× slower. The
phases were not recorded in that run (this script prints them now, ``timers/…``); see
docs/how-to/gpu.md for the GPU measurements and docs/internals.md ("LLM pools and GRPO") for
what we measured of the weight sync since.

TRL is a bench-only dependency, kept out of the shared venv: the bench makes its own venv
``.venv-trl`` (gitignored) on first use, which sees the shared venv's packages (a ``.pth``
file) and adds ``trl`` (the ``bench`` extra's pin); ``--trl-python`` names another
interpreter with TRL instead::

    PYTHONPATH=$PWD .venv/bin/python bench/grpo_vs_trl.py
    # options: --group-size 8 --prompts 8 --max-new-tokens 4 --updates 6 --in-flight 1,all
    #          --rounds 3 --path builtin|endpoint|both --api chat|completions [--sampler vllm]
    #          --runner local|remote|async (ours: sampling in the driver, in one remote env
    #          runner, or there overlapped with learning) --trl-threads N (TRL's torch threads)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = "star:8"
LEVEL = "easy"
#: ``--model qwen2-0.5b``: Qwen2-0.5B's transformer body (24 layers, hidden 896, 14 query / 2
#: KV heads of dim 64, MLP 4864, its init range) on the tiny tokenizer's 384-token vocabulary
#: (sampled ids must be the env's token ids): 0.36B parameters, built in code from the seed
QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    head_dim=64,
    initializer_range=0.02,
)


def build_model_dir(name: str, seed: int, out: Path) -> str:
    """``"tiny"`` (built in each side's process), or a directory holding the named model built
    in code (both sides load the same weights from it)."""
    if name == "tiny":
        return "tiny"
    from marl_agents.llm.tiny import make_tiny_model

    path = out / f"{name}-seed{seed}"
    _, model = make_tiny_model(path, seed=seed, **QWEN2_05B)
    n = sum(p.numel() for p in model.parameters())
    print(f"{name}: {n / 1e6:.0f}M parameters (built in code, seed {seed}) in {path}")
    return str(path)


def gpu_resources() -> Any:
    """Ours on one GPU: the env runner samples and the learner learns on it, half each."""
    from trainers.configs.experiment import ResourcesConfig

    return ResourcesConfig(
        num_env_runners=1, num_gpus_per_env_runner=0.5, num_learners=1, num_gpus_per_learner=0.5
    )


# ----- the task (both sides) ------------------------------------------------------------------
def make_env(max_new_tokens: int) -> Any:
    """The text-delegate env both sides are scored by."""
    from scenarios.graph_env import GraphEnv
    from scenarios.text_delegate import TextDelegate

    return GraphEnv(TextDelegate(TOPOLOGY, level=LEVEL, max_new_tokens=max_new_tokens))


def env_reward(env: Any, seed: int, completion_ids: list[int]) -> float:
    """The env's reward for answering the prompt of ``seed`` with ``completion_ids``."""
    env.reset(seed=seed)
    spaces = env.scenario.spaces
    action = spaces.encode_action(list(completion_ids)[: spaces.max_new_tokens])
    total = 0.0
    while env.agents:
        _, rewards, *_ = env.step({a: action for a in env.agents})
        total += float(sum(rewards.values()))
    return total


# ----- the endpoint side's app ------------------------------------------------------------------
#: the scenario reference of the endpoint side (env runners import it by this name)
ENDPOINT_SCENARIO = "bench.grpo_vs_trl:endpoint_scenario"
#: the one agent of both sides (the pool a fine-tuning job trains)
AGENT = "orchestrator"


@functools.cache
def openai_client() -> Any:
    """The app's one ``openai`` client, made once per process as apps make theirs (at import);
    each episode uses it with its own base URL and key (``with_options``: the same connection
    pool). A client made per episode costs ~47 ms here (its TLS context), more than the rest of
    the episode."""
    from openai import OpenAI

    return OpenAI(base_url="http://127.0.0.1/v1", api_key="per-episode", max_retries=0)


def endpoint_scenario(topology: str = TOPOLOGY, api: str = "chat", **kwargs: Any) -> Any:
    """``text-delegate`` as an app of our OpenAI-compatible gateway (an ``AppScenario``).

    Takes text-delegate's arguments (``topology``, ``level``, ``max_new_tokens``, ``tokenizer``,
    ``subagents``...). Per episode the app sends the orchestrator's prompt with the official
    ``openai`` client and returns the sampled ids (``return_token_ids``); the verifier scores
    them with the env's reward (:func:`env_reward`, from the episode's task state). The task
    is text-delegate's own: ``tasks(rng)`` draws it from the rng ``GraphEnv`` seeds with the
    episode's seed, as text-delegate's ``initial_state`` does. ``api``:

    * ``"chat"``: ``chat.completions.create`` with text-delegate's system and user messages;
      the gateway renders them with the chat template and the scenario's ``prefill`` (the
      opened call, read off the user message) ends the prompt. The ids equal the built-in
      env's prompt ids (checked for 2000 seeds of ``easy``: the template and the prefill
      tokenise at a token boundary).
    * ``"completions"``: ``completions.create`` with the prompt as the built-in env's token ids
      (no chat template at the gateway): the same ids by construction, but the client's
      request typing walks every id (~7 ms a request here, under load).
    """
    import copy
    import re
    import threading

    from marl_agents.gateway.app_scenario import AppScenario
    from scenarios.graph_env import GraphEnv
    from scenarios.text_delegate import TextDelegate
    from scenarios.text_delegate_prompts import TYPE_NAMES

    if api not in ("chat", "completions"):
        raise ValueError(f"api must be 'chat' or 'completions', got {api!r}")
    prompts = TextDelegate(topology, **kwargs)
    scorer = TextDelegate(topology, **kwargs)
    given: dict[str, Any] = {}
    scorer.initial_state = lambda rng: copy.deepcopy(given["state"])  # type: ignore[method-assign]
    env, lock = GraphEnv(scorer), threading.Lock()
    max_new = prompts.spaces.max_new_tokens

    def tasks(rng: Any) -> dict[str, Any]:
        state = prompts.initial_state(rng)
        if api == "chat":
            return {"state": state, "messages": prompts.orchestrator_messages(state)}
        return {"state": state, "prompt_ids": prompts.prompt_ids(state)}

    def prefill(chat: list[dict[str, Any]]) -> str:
        """text-delegate's opened call for the first part not solved (in the user message)."""
        found = re.search(r"part (\d+): (\w+) (pending|failed)", chat[-1]["content"])
        if found is None:
            return ""
        part, kind = int(found.group(1)), TYPE_NAMES.index(found.group(2))
        return prompts.prefill_text(part, {"types": {part: kind}})

    def run(task: dict[str, Any], llm: Any) -> list[int]:
        client = openai_client().with_options(base_url=llm.base_url, api_key=llm.api_key)
        sampling = dict(max_tokens=max_new, temperature=1.0, top_p=1.0)
        extra = {"return_token_ids": True}  # vLLM's extension: the sampled ids
        if api == "chat":
            chat = client.chat.completions.create(
                model=llm.models[AGENT], messages=task["messages"], extra_body=extra, **sampling
            )
            return list(chat.choices[0].model_extra["token_ids"])
        done = client.completions.create(
            model=llm.models[AGENT], prompt=task["prompt_ids"], extra_body=extra, **sampling
        )
        return list(done.choices[0].model_extra["token_ids"])

    def verifier(final: dict[str, Any]) -> float:
        with lock:
            given["state"] = final["task"]["state"]
            return env_reward(env, 0, final["result"])

    return AppScenario(
        run,
        tasks=tasks,
        verifier=verifier,
        agents=[AGENT],
        prefill={AGENT: prefill} if api == "chat" and prompts.prefill else None,
        tokenizer=kwargs.get("tokenizer", "tiny"),
        max_prompt_tokens=prompts.spaces.max_prompt_tokens,
        max_new_tokens=max_new,
        name="text-delegate-app",
    )


# ----- ours (built-in path, or through the endpoint) --------------------------------------------
def run_ours(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from trainers.configs.experiment import BudgetConfig, OutputConfig
    from trainers.finetune import FinetuneJob, OrchestratorConfig, TrainingConfig, run_finetune
    from trainers.run.metrics import RETURN_KEY
    from trainers.signals.phase_timers import PHASE_KEYS

    orch = OrchestratorConfig(model=args.model_dir, tiny_seed=args.seed, temperature=1.0, top_p=1.0)
    if args.sampler != "transformers":
        if "sampler" not in {f.name for f in dataclasses.fields(OrchestratorConfig)}:
            return {"skipped": f"no '{args.sampler}' sampler for trained pools on this branch"}
        orch = dataclasses.replace(orch, sampler=args.sampler)  # type: ignore[call-arg]
    job = FinetuneJob(
        orchestrator=orch,
        scenario=ENDPOINT_SCENARIO if args.side == "endpoint" else "text-delegate",
        topology=TOPOLOGY,
        scenario_kwargs={
            "level": LEVEL,
            "max_new_tokens": args.max_new_tokens,
            **({"api": args.api} if args.side == "endpoint" else {}),
        },
        training=TrainingConfig(
            group_size=args.group_size,
            groups_per_iteration=args.prompts,
            groups_in_flight=None if args.in_flight == "all" else int(args.in_flight),
            lr=args.lr,
        ),
        budget=BudgetConfig(iterations=args.updates),
        output=OutputConfig(dir=str(out), name="ours", export_hf=False, checkpoint_every=0),
        seed=args.seed,
    )
    if args.device == "cuda":
        job.resources = gpu_resources()
    if args.runner != "local":  # one remote env runner (the driver learns); async: overlapped
        job.resources = dataclasses.replace(job.resources, num_env_runners=1)
        job.training.async_sampling.enabled = args.runner == "async"
    job.logging.progress, job.logging.wandb = False, "disabled"
    from trainers.grpo.algorithm import GRPO

    cpu: list[float] = []  # process CPU seconds of each update (sampling and learning)
    step = GRPO.training_step

    def timed(self: Any) -> Any:
        t0 = time.process_time()
        try:
            return step(self)
        finally:
            cpu.append(time.process_time() - t0)

    GRPO.training_step = timed  # type: ignore[method-assign]
    result = run_finetune(job)
    per_update = []
    for h, c in zip(result.history, cpu, strict=True):
        tokens = (
            h.get("losses/orchestrator/grpo/completion_tokens_mean", 0.0) * h["charts/episodes"]
        )
        phases = {k.split("/")[1]: h[k] for k in PHASE_KEYS if k in h}  # where the time went
        per_update.append(
            {
                "wall_s": h["charts/iteration_s"],
                "cpu_s": c,
                "tokens": tokens,
                "rows": h.get("charts/rows_per_generate", float("nan")),
                **phases,
            }
        )
    return {"updates": per_update, "reward_last": result.history[-1].get(RETURN_KEY)}


# ----- TRL ------------------------------------------------------------------------------------
def run_trl(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from marl_agents.llm.tiny import make_tiny_model

    if args.model_dir == "tiny":
        tok, model = make_tiny_model(seed=args.seed)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model_dir)
        model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tok.padding_side = "left"
    env = make_env(args.max_new_tokens)
    spaces = env.scenario.spaces
    rng = np.random.default_rng(args.seed)
    seeds = [int(s) for s in rng.integers(2**31, size=args.prompts * args.updates)]
    prompts = []
    for s in seeds:
        obs, _ = env.reset(seed=s)
        prompts.append(spaces.prompt_text(obs["orchestrator"], tok))

    def reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]],
               seed: list[int], **_: Any) -> list[float]:  # fmt: skip
        return [env_reward(env, s, ids) for s, ids in zip(seed, completion_ids, strict=True)]

    steps: list[dict[str, float]] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
            steps.append({"wall_s": wall, "cpu_s": cpu, "tokens": 0.0})

        def on_log(self, *a: Any, logs: dict[str, Any] | None = None, **k: Any) -> None:
            if logs and "completions/mean_length" in logs and steps:
                steps[-1]["tokens"] = logs["completions/mean_length"] * n

    n = args.group_size * args.prompts
    config = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=args.lr,
        lr_scheduler_type="constant",  # ours: a constant lr
        gradient_checkpointing=False,  # ours does not recompute activations
        bf16=False,  # ours trains in float32 (TRL's default bf16 autocast: ~5× slower here)
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        num_iterations=1,
        max_steps=args.updates,
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=args.device == "cpu",
        seed=args.seed,
        shuffle_dataset=False,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts, "seed": seeds}),
        callbacks=[Timer()],
    )
    torch.manual_seed(args.seed)
    trainer.train()
    return {"updates": steps}


# ----- driver ---------------------------------------------------------------------------------
def summary(res: dict[str, Any]) -> dict[str, float]:
    ups = res["updates"][1:] or res["updates"]  # the first update is warm-up
    wall = [u["wall_s"] for u in ups]
    tokens = sum(u["tokens"] for u in ups)
    out = {
        "update_s": statistics.median(wall),
        "tokens_per_s": tokens / sum(wall),
        "tokens_per_cpu_s": tokens / sum(u["cpu_s"] for u in ups),
        "tokens_per_update": tokens / len(ups),
    }
    phases = [k for k in ups[0] if k.endswith("_s") and k not in ("wall_s", "cpu_s")]
    phases += ["rows"] if "rows" in ups[0] else []  # ours: rows per generate
    return out | {k: statistics.median(u[k] for u in ups) for k in phases}  # ours: timers/…


def medians(results: list[dict[str, Any]]) -> dict[str, float]:
    """Per measure, the median over rounds of :func:`summary`."""
    rounds = [summary(r) for r in results]
    return {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}


def child(
    args: argparse.Namespace, side: str, python: str, out: Path, *extra: str
) -> dict[str, Any]:
    """Run one side in a fresh process (one torch thread), return its JSON result."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    result = out / f"{side}.json"
    cmd = [python, __file__, "--side", side, "--result", str(result), *args.passthrough, *extra]
    subprocess.run(cmd, env=env, check=True)
    return json.loads(result.read_text())


TRL_VENV = ROOT / ".venv-trl"
#: the peer's pin (the ``bench`` extra's)
TRL_PIN = "trl>=1.16,<2"


def ensure_trl_venv() -> Path:
    """The python of ``.venv-trl``: made on first use, it sees this venv's packages (torch,
    transformers, the project) through a ``.pth`` file and adds TRL."""
    import site

    py = TRL_VENV / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(TRL_VENV)], check=True)
        ours = [p for p in site.getsitepackages() if p.endswith("site-packages")]
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        pth = TRL_VENV / "lib" / version / "site-packages" / "shared-venv.pth"
        pth.write_text("\n".join(ours) + "\n")
        subprocess.run([str(py), "-m", "pip", "install", "-q", TRL_PIN], check=True)
    return py


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8, help="prompts (groups) per update")
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sampler", default="transformers", choices=["transformers", "vllm"])
    parser.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="cuda: both sides on one GPU (ours: a GPU env runner and a GPU learner, 0.5 each)",
    )
    parser.add_argument(
        "--model",
        default="tiny",
        choices=["tiny", "qwen2-0.5b"],
        help="tiny: the 2-layer model; qwen2-0.5b: Qwen2-0.5B's body built in code (0.36B)",
    )
    parser.add_argument("--model-dir", default="tiny", help=argparse.SUPPRESS)
    parser.add_argument(
        "--trl-python", help="an interpreter with trl (default: .venv-trl, made on first use)"
    )
    parser.add_argument(
        "--in-flight",
        default="1,all",
        help="ours: groups sampled side by side per env runner, comma-separated runs "
        "('all': the default, every group of the iteration; 1: one group at a time)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every side this many times, alternating (medians are printed)",
    )
    parser.add_argument(
        "--path",
        default="both",
        choices=["builtin", "endpoint", "both"],
        help="our side(s): the built-in text-delegate env, the same task as an app through "
        "the OpenAI-compatible gateway, or both",
    )
    parser.add_argument(
        "--api",
        default="chat",
        choices=["chat", "completions"],
        help="endpoint side: the app's call (chat: messages, the gateway renders the template; "
        "completions: the prompt as token ids)",
    )
    parser.add_argument(
        "--runner",
        default="local",
        choices=["local", "remote", "async"],
        help="our sides' sampling (cpu): local: in the driver, then learn (the default); "
        "remote: one remote env runner, then learn; async: one remote env runner sampling "
        "update k+1 while the driver learns from k (algorithm.grpo.async_sampling, staleness 1)",
    )
    parser.add_argument(
        "--trl-threads",
        type=int,
        default=1,
        help="torch threads of the TRL side (ours: one per process; --runner remote|async "
        "runs two processes, so 2 gives TRL the same cores)",
    )
    parser.add_argument("--side", choices=["ours", "endpoint", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        import torch

        torch.set_num_threads(args.trl_threads if args.side == "trl" else 1)
        with tempfile.TemporaryDirectory() as tmp:
            res = (run_trl if args.side == "trl" else run_ours)(args, Path(tmp))
        Path(args.result).write_text(json.dumps(res))
        return
    keep = ("--group-size", "--prompts", "--max-new-tokens", "--updates", "--lr", "--seed")
    keep += ("--device", "--api", "--runner", "--trl-threads")
    args.passthrough = [x for k in keep for x in (k, str(getattr(args, k[2:].replace("-", "_"))))]
    models = tempfile.TemporaryDirectory()
    args.passthrough += ["--model-dir", build_model_dir(args.model, args.seed, Path(models.name))]
    in_flight = args.in_flight.split(",")
    ours_sides = {"builtin": ["ours"], "endpoint": ["endpoint"]}.get(
        args.path, ["ours", "endpoint"]
    )
    sides: list[tuple[tuple[str, str], str, list[str]]] = [
        ((f"{side} k={k}", "transformers"), sys.executable, ["--in-flight", k])
        for side in ours_sides
        for k in in_flight
    ]
    sides.append((("trl", "transformers"), args.trl_python or str(ensure_trl_venv()), []))
    if args.sampler != "transformers":
        k = in_flight[-1]
        extra = ["--in-flight", k, "--sampler", args.sampler]
        sides.extend(
            ((f"{side} k={k}", args.sampler), sys.executable, extra) for side in ours_sides
        )
    results: dict[tuple[str, str], list[dict[str, Any]]] = {key: [] for key, _, _ in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):  # alternating, so that a change of load hits every side
            for key, python, extra in sides:
                side = key[0].split(" ")[0]  # ours | endpoint | trl
                res = child(args, side, python, Path(tmp), *extra)
                results[key].append(res)
                done = summary(res) if "skipped" not in res else res
                print(f"{key[0]} ({key[1]}): {done}", flush=True)  # kept if a later side fails
    models.cleanup()
    print(
        f"text-delegate {LEVEL} {TOPOLOGY}, {args.model} model on {args.device}, "
        f"G={args.group_size}, "
        f"B={args.prompts} prompts/update, max_new_tokens={args.max_new_tokens}, "
        f"{args.updates} updates (first left out), medians of {args.rounds} round(s)"
    )
    if "endpoint" in ours_sides:
        print(ENDPOINT_NOTE[args.api])
    head = f"{'trainer':14} {'sampler':13} {'tokens/update':>13} {'tokens/s':>9} {'s/update':>9}"
    print(f"{head} {'tokens/cpu-s':>12}  phases (median s/update)")
    stats = {}
    for (side, sampler), res in results.items():
        skipped = [r["skipped"] for r in res if "skipped" in r]
        if skipped:
            print(f"{side:14} {sampler:13} n/a ({skipped[0]})")
            continue
        s = stats[side, sampler] = medians(res)
        phases = " ".join(f"{k[:-2]}={v:.3f}" for k, v in s.items() if k in PHASES)
        phases += f" rows/generate={s['rows']:.1f}" if "rows" in s else ""
        print(
            f"{side:14} {sampler:13} {s['tokens_per_update']:13.1f} {s['tokens_per_s']:9.1f} "
            f"{s['update_s']:9.3f} {s['tokens_per_cpu_s']:12.1f}  {phases}"
        )
    # on cuda ours samples and learns in Ray workers: the driver's CPU time is not it
    for k in in_flight:
        for a, b in [("ours", "trl"), ("endpoint", "trl"), ("endpoint", "ours")]:
            name_a, name_b = f"{a} k={k}", "trl" if b == "trl" else f"{b} k={k}"
            x, y = stats.get((name_a, "transformers")), stats.get((name_b, "transformers"))
            if x and y:
                print(
                    ratio_line(
                        f"{name_a} / {name_b}",
                        x,
                        y,
                        args.device == "cpu" and args.runner == "local",
                    )
                )
    k = in_flight[-1]
    for side in ours_sides:
        base, vllm = (
            stats.get((f"{side} k={k}", "transformers")),
            stats.get((f"{side} k={k}", "vllm")),
        )
        if vllm and base:
            ratio = vllm["tokens_per_s"] / base["tokens_per_s"]
            print(f"{side} k={k} vllm / transformers tokens/s: ×{ratio:.2f}")


#: the phase timers printed (``timers/…`` of ours; TRL has none)
PHASES = ("env_s", "forward_s", "sample_overhead_s", "learn_s", "sync_s")
#: how the endpoint side's prompts relate to the built-in side's (printed with the table)
ENDPOINT_NOTE = {
    "chat": "endpoint: the same task as an app (AppScenario) calling chat.completions with "
    "text-delegate's system and user messages through the openai client; the gateway's chat "
    "template + the opened call as prefill give the built-in env's prompt ids token for token",
    "completions": "endpoint: the same task as an app (AppScenario) calling completions with "
    "the built-in env's prompt token ids through the openai client (same prompts token for "
    "token)",
}


def ratio_line(name: str, a: dict[str, float], b: dict[str, float], cpu: bool) -> str:
    """``a / b``: generated tokens/s, update time (> 1: ``a`` faster), tokens per CPU second."""
    ratio = a["tokens_per_s"] / b["tokens_per_s"]
    per_cpu = f", tokens per CPU second ×{a['tokens_per_cpu_s'] / b['tokens_per_cpu_s']:.2f}"
    return (
        f"{name} (transformers sampler): tokens/s ×{ratio:.2f}, "
        f"update time ×{b['update_s'] / a['update_s']:.2f} (> 1: first faster)"
        f"{per_cpu if cpu else ''}"
    )


if __name__ == "__main__":
    main()
