"""GRPO generation with vLLM: TRL's colocated engine with our engine options, a weight sync that keeps
vLLM's fast CPU kernels, a server mode that syncs LoRA adapters, and per-step timing of generation
and weight sync.

TRL 1.16 builds its `VLLMGeneration` with a fixed set of engine arguments (no dtype, no KV-cache
size, no prefix caching) and an NCCL-only server sync. `TimedGRPOTrainer` swaps in
`MathrlVLLMGeneration`, which times every sync and
- colocate: builds the engine from `evaluator.backends.vllm.engine_options`, as eval jobs do;
- server with LoRA: saves the adapter and loads it by name into the worker's `vllm serve
  --enable-lora` (`AdapterServerClient`);
- server without LoRA: takes TRL's own path (NCCL; GPUs only).

docs/vllm.md, "GRPO generation"."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from typing import Any, cast

import torch
from trl import GRPOTrainer
from trl.generation.vllm_generation import VLLMGeneration

from evaluator.backends.vllm import BATCHED_TOKENS
from evaluator.models import check_loaded_from_hub
from evaluator.vllm_reload import retie_lm_head


class MathrlVLLMGeneration(VLLMGeneration):
    """TRL's vLLM generation, with our engine options in colocate mode and a CPU-safe sync."""

    vllm_client: Any  # TRL's VLLMClient, or an AdapterServerClient when it syncs LoRA adapters

    def __init__(
        self, *args: Any, engine_options: dict[str, Any], timings: dict[str, float], adapter_dir: str, **kwargs: Any
    ):
        self.engine_options = engine_options
        self.timings = timings
        self.adapter_dir = adapter_dir
        self._adapter_version = -1
        super().__init__(*args, **kwargs)

    @property
    def syncs_adapters(self) -> bool:
        from peft import PeftModel

        return self.mode == "server" and isinstance(self.model, PeftModel)

    def _init_vllm(self) -> None:
        if self.syncs_adapters:
            base_url = self.server_base_url or f"http://{self.server_host}:{self.server_port}"
            self.vllm_client = AdapterServerClient(base_url)
            if self.accelerator.is_main_process:
                self.vllm_client.wait_ready(self.server_timeout)
            self.accelerator.wait_for_everyone()
            return None
        if self.mode != "colocate":
            super()._init_vllm()
            return None
        import os

        from trl.trainer.utils import ensure_master_addr_port
        from vllm import LLM

        acc = self.accelerator
        # as TRL does: vLLM runs inside this process ("external_launcher"), one engine per rank
        os.environ["RANK"] = str(acc.process_index)
        os.environ["LOCAL_RANK"] = str(acc.local_process_index)
        os.environ["WORLD_SIZE"] = str(acc.num_processes)
        ensure_master_addr_port()
        self.llm = LLM(
            model=cast(str, self.model.name_or_path),
            tensor_parallel_size=self.tensor_parallel_size,
            max_model_len=self.max_model_length,
            max_num_seqs=self.max_num_seqs,
            distributed_executor_backend="external_launcher",
            seed=acc.process_index // self.tensor_parallel_size,
            logprobs_mode="processed_logprobs",
            trust_remote_code=self.trust_remote_code,
            **{"max_num_batched_tokens": BATCHED_TOKENS, **self.engine_options},  # the options may raise it
        )
        # the policy's id, read again by vLLM: a speculators config.json pushed since swaps the model
        check_loaded_from_hub(cast(str, self.model.name_or_path), self.llm.llm_engine.model_config.model)
        self._llm_weights_sleeping = False
        acc.wait_for_everyone()

    def sync_weights(self) -> None:
        t0 = time.perf_counter()
        if self.syncs_adapters:
            self._load_adapter()
        elif self.mode == "colocate" and not torch.cuda.is_available():
            self._reload_colocated()
        else:
            super().sync_weights()
        self.timings["weight_sync_seconds"] += time.perf_counter() - t0

    def _reload_colocated(self) -> None:
        # vLLM's CPU build prepacks each linear weight for oneDNN and drops the plain tensor, so
        # TRL's in-place `load_weights` finds nothing to load into. vLLM's own `reload_weights`
        # (layerwise reload) restores each layer, loads the new weights and re-runs its
        # `process_weights_after_loading`, i.e. packs them again: the fast kernels stay, and so
        # do the new weights. GPUs keep TRL's plain in-place load.
        # A tied LM head loads nothing and keeps its packed copy of the old embedding: pack the new
        # one (evaluator.vllm_reload), or sampling scores tokens with a head the policy no longer has.
        runner = self.llm.llm_engine.model_executor.driver_worker.model_runner
        runner.reload_weights(weights_iterator=_detached(self._iter_named_params()), is_checkpoint_format=True)
        retie_lm_head(runner.get_model())
        self.llm.reset_prefix_cache()

    def _load_adapter(self) -> None:
        """Save the current LoRA adapter and have the server load it under a new name; generation
        asks for that name from now on, and the previous adapter is unloaded."""
        import os

        self._adapter_version += 1
        if self.accelerator.is_main_process:
            path = os.path.join(self.adapter_dir, f"v{self._adapter_version}")
            self.model.save_pretrained(path)
            self.vllm_client.load_adapter(f"policy-v{self._adapter_version}", os.path.abspath(path))
        self.accelerator.wait_for_everyone()


class AdapterServerClient:
    """What TRL's server-mode generation needs from a client (`generate`, `get_server_info`), over
    a plain `vllm serve` OpenAI API, with generation going to the newest loaded LoRA adapter."""

    def __init__(self, base_url: str, timeout: float = 3600.0):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout)
        self.model: str | None = None  # the adapter generation asks for; None: the base model
        self._base_model: str | None = None

    def wait_ready(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.http.get("/health", timeout=5).status_code == 200:
                    self._base_model = self.http.get("/v1/models").json()["data"][0]["id"]
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job's vLLM server at {self.base_url} did not answer /health in {timeout:.0f}s")
            time.sleep(1.0)

    def get_server_info(self) -> dict[str, Any]:
        r = self.http.get("/server_info", params={"config_format": "json"})
        r.raise_for_status()
        info: dict[str, Any] = r.json()["vllm_config"]
        return info

    def load_adapter(self, name: str, path: str) -> None:
        r = self.http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        if r.status_code != 200:
            raise RuntimeError(f"the vLLM server refused adapter {name} ({r.status_code}): {r.text[:500]}")
        previous, self.model = self.model, name
        if previous is not None:
            self.http.post("/v1/unload_lora_adapter", json={"lora_name": previous})

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        temperature: float,
        top_p: float,
        top_k: int,
        min_p: float,
        max_tokens: int,
        repetition_penalty: float = 1.0,
        logprobs: int | None = 0,
        features: Any = None,
        structured_outputs_regex: str | None = None,
        generation_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if features is not None or structured_outputs_regex is not None:
            raise ValueError("images and structured outputs are not supported with LoRA adapters on a vLLM server")
        body: dict[str, Any] = {
            "model": self.model or self._base_model,
            "prompt": prompts,
            "n": n,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k if top_k > 0 else -1,
            "min_p": min_p,
            "max_tokens": max_tokens,
            "repetition_penalty": repetition_penalty,
            "logprobs": logprobs if logprobs is not None else 0,
            "return_token_ids": True,
            **(generation_kwargs or {}),
        }
        r = self.http.post("/v1/completions", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"vLLM server generation failed ({r.status_code}): {r.text[:500]}")
        choices = sorted(r.json()["choices"], key=lambda c: c["index"])  # prompt i, sample j at i * n + j
        return {
            "prompt_ids": prompts,
            "completion_ids": [c["token_ids"] for c in choices],
            "logprobs": [[[lp] for lp in c["logprobs"]["token_logprobs"]] for c in choices],
        }


def _detached(params: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    for name, tensor in params:
        yield name, tensor.detach()


@contextlib.contextmanager
def _generation_class(cls: Any) -> Iterator[None]:
    """GRPOTrainer.__init__ names VLLMGeneration from its module: point it at ours meanwhile."""
    from trl.trainer import grpo_trainer

    saved = grpo_trainer.VLLMGeneration
    grpo_trainer.VLLMGeneration = cls  # type: ignore[misc]  # a module global TRL's __init__ reads
    try:
        yield
    finally:
        grpo_trainer.VLLMGeneration = saved  # type: ignore[misc]


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that measures each optimizer step's generation, weight-sync and generated tokens
    (read by trainer.callbacks.SinkCallback through `pop_timings`)."""

    def __init__(self, *, args: Any, engine_options: dict[str, Any] | None = None, **kwargs: Any):
        import os

        self.timings: dict[str, float] = _zero_timings()
        cls = functools.partial(
            MathrlVLLMGeneration,
            engine_options=engine_options or {},
            timings=self.timings,
            adapter_dir=os.path.join(args.output_dir, "vllm-adapters"),
        )
        with _generation_class(cls):
            super().__init__(args=args, **kwargs)
        if isinstance(kwargs.get("model"), str):  # TRL loaded it, and its reference model, from this id
            check_loaded_from_hub(kwargs["model"], self.model, getattr(self, "ref_model", None))

    def _generate_single_turn(self, prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
        return self._timed_generation(super()._generate_single_turn, prompt_ids, *args, **kwargs)

    def _timed_generation(self, generate: Any, prompt_ids: Any, *args: Any, **kwargs: Any) -> Any:
        """`generate(prompt_ids, ...)`, its time (less any weight sync it did) and output counted."""
        t0 = time.perf_counter()
        synced_before = self.timings["weight_sync_seconds"]
        out = generate(prompt_ids, *args, **kwargs)
        elapsed = time.perf_counter() - t0
        self.timings["generation_seconds"] += elapsed - (self.timings["weight_sync_seconds"] - synced_before)
        completion_ids, _logprobs = out  # this process's completions, as token ids
        self.timings["generated_tokens"] += sum(len(c) for c in completion_ids)
        self.timings["generated_completions"] += len(completion_ids)
        return out

    def pop_timings(self) -> dict[str, float]:
        """The timings since the last call, and reset them."""
        out = dict(self.timings)
        self.timings.update(_zero_timings())
        return out


def _zero_timings() -> dict[str, float]:
    return {
        "generation_seconds": 0.0,
        "weight_sync_seconds": 0.0,
        "generated_tokens": 0.0,
        "generated_completions": 0.0,
        "trained_tokens": 0.0,  # completion tokens in the loss (trainer/grpo_loop.py)
        "forward_tokens": 0.0,  # tokens through the training forward and backward, prompts included
        "forward_rows": 0.0,
        "eval_seconds": 0.0,  # held-out evaluation at step ends (trainer/heldout_eval.py)
        # overlap (trainer/overlap.py): what the background thread spent generating; the step itself
        # counts only its wait in generation_seconds
        "background_generation_seconds": 0.0,
        "tool_seconds": 0.0,  # a tool job's calls between its turns (trainer/tool_grpo.py)
    }
