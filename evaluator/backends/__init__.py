"""Generation backends, one module each, all registered in `BACKENDS` by name:

- `hf` (evaluator/backends/hf.py): Hugging Face transformers (decoding: hf_generate.py; calls: hf_chat.py);
- `vllm` (evaluator/backends/vllm.py): vLLM's offline engine, or the worker's warm server (warm.py).

Each loads a model as a `Generator` of an eval's completions (`Backend.load`; decoded as `Decoding`
says, the same knobs on every backend) and holds a model for calls as a `Chat`
(`Backend.chat`, chat_base.py): a generate job's calls, a batch's lines, graders' models.

A new backend is a `Backend` subclass (evaluator/backends/base.py) in a module here, added below.
Each is declared once, by name, in the SDK's registry (mathrl/backends.py: what the specs accept and
what it generates on); a quick test holds that registry to this one."""

from __future__ import annotations

from evaluator.backends.base import (
    Backend,
    BackendOptions,
    Decoding,
    EngineSettings,
    Generation,
    Generator,
    WarmEngineAddress,
)
from evaluator.backends.hf import HF
from evaluator.backends.vllm import VLLM
from mathrl.registry import Registry

BACKENDS: Registry[type[Backend]] = Registry("generation backend")
for _cls in (HF, VLLM):
    BACKENDS.add(_cls.name, _cls)


def backend(name: str, options: BackendOptions | None = None) -> Backend:
    """The backend registered as `name` (an unknown name raises, naming the known ones)."""
    return BACKENDS[name](options)


__all__ = [
    "BACKENDS",
    "HF",
    "VLLM",
    "Backend",
    "BackendOptions",
    "Decoding",
    "EngineSettings",
    "Generation",
    "Generator",
    "WarmEngineAddress",
    "backend",
]
