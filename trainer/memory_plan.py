"""A training job's GPU memory, estimated before anything is loaded (no torch here).

`plan_job(training, model_config, gpu_memory_gib)` takes what a job trains (`Training`: each
training kind's memory hook makes it from the job's resolved config, kinds.training_of) and the
model's config.json values (`ModelShape`) and returns the peak memory of one GPU, itemised
(`MemoryPlan`, from `estimate`). `check_job` adds the refusal, with what would make the job fit.
The API checks a job at submit when it can read the model's config.json; the worker checks the
others before the model loads (worker/child.py). Dense decoders only: a mixture-of-experts config
is not estimated (ValueError). What the plan assumes of TRL and why: docs/gpu.md,
"`trainer/memory_plan.py`: what the plan assumes".
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

GIB = 1024**3

# Bytes per element of what TRL holds (docs/gpu.md, "`trainer/memory_plan.py`: what the plan assumes").
WEIGHT_BYTES = 4  # float32 weights: TRL loads the path in float32
GRAD_BYTES = 4  # gradients in the parameters' dtype
ADAM_BYTES = 8  # AdamW exp_avg + exp_avg_sq, float32
CAST_BYTES = 2  # autocast's bfloat16 copy of each weight, alive through the step

# Activations per token per layer, in bytes: ACT_HIDDEN x hidden_size + ACT_INTERMEDIATE x
# intermediate_size, plus ACT_LORA x in_features for each LoRA-adapted linear layer (its dropout
# mask). With gradient checkpointing each layer keeps CKPT_HIDDEN x hidden_size (its float32
# input) and one layer at a time holds the full amount. Fitted to TRL 1.16 GRPO steps on an H100
# (bench/memory_plan.py; tests/unit/mathrl/test_memory_plan.py holds the measurements): Qwen2.5-0.5B and -1.5B
# shapes in full fine-tuning, 2,304 to 6,144 tokens per micro-batch, within 5% of the measured
# peak (3-5% above it with gradient checkpointing); LoRA r=16 on all linear layers of the 1.5B and
# 7B shapes, 1,152 to 4,608 tokens, 3-6% above it.
ACT_HIDDEN = 38.0
ACT_INTERMEDIATE = 8.8
ACT_LORA = 1.0
CKPT_HIDDEN = 4.0

# TRL 1.16's chunked LM head: a [4096 x 32768] bfloat16 tile, fp32 gradient accumulators.
HEAD_TOKENS, HEAD_VOCAB = 4096, 32768

CUDA_OVERHEAD = 1 * GIB  # CUDA context, cuBLAS and NCCL workspaces
ALLOCATOR_SLACK = 0.10  # share of PyTorch's peak lost to the caching allocator's fragmentation

DEFAULT_VLLM_UTILIZATION = 0.3  # trainer/grpo.py: TRL's colocated default unless the spec says otherwise
LORA_ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a Llama/Qwen2-style decoder's config.json."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool = False
    head_dim: int | None = None
    attention_bias: bool = False  # biases on q/k/v (Qwen2 has them)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        """From config.json's values (a multimodal config's `text_config` is read when present).
        Raises ValueError naming what is missing."""
        text = config.get("text_config")
        if isinstance(text, Mapping) and "hidden_size" not in config:
            config = {**text, "model_type": text.get("model_type", config.get("model_type"))}
        needed = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        missing = [k for k in needed if not isinstance(config.get(k), int) or config[k] <= 0]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}: not a decoder this estimate knows")
        experts = next((k for k in ("num_experts", "num_local_experts", "n_routed_experts") if config.get(k)), None)
        if experts:
            raise ValueError(
                f"config.json has {experts}={config[experts]}: mixture-of-experts models are not estimated"
            )
        heads = int(config["num_attention_heads"])
        kv = config.get("num_key_value_heads")
        bias = config.get("attention_bias")
        return cls(
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_hidden_layers=int(config["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(kv) if isinstance(kv, int) and kv > 0 else heads,
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            head_dim=int(config["head_dim"]) if isinstance(config.get("head_dim"), int) else None,
            attention_bias=bool(bias) if bias is not None else config.get("model_type") == "qwen2",
        )

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear layer of one decoder layer."""
        h, i, d = self.hidden_size, self.intermediate_size, self.dim_per_head
        q, kv = self.num_attention_heads * d, self.num_key_value_heads * d
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def kv_cache_bytes_per_token(self, bytes_per_value: int) -> int:
        """A decode cache's bytes for one token of one sequence: keys and values of every layer."""
        return self.num_hidden_layers * 2 * self.num_key_value_heads * self.dim_per_head * bytes_per_value

    def layer_parameters(self) -> int:
        shapes = self.linear_shapes()
        n = sum(a * b for a, b in shapes.values()) + 2 * self.hidden_size  # + the two RMSNorms
        if self.attention_bias:
            n += shapes["q_proj"][1] + shapes["k_proj"][1] + shapes["v_proj"][1]
        return n

    def parameter_count(self) -> int:
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * self.layer_parameters() + embeddings + self.hidden_size  # + final norm

    def lora_parameters(self, r: int, target_modules: str | list[str]) -> tuple[int, int]:
        """(adapter parameters, sum of the adapted layers' in_features per decoder layer) for
        LoRA of rank r on `target_modules` ('all-linear' or module names; names this shape does
        not have, other than lm_head, adapt nothing)."""
        names = LORA_ALL_LINEAR if target_modules == "all-linear" else tuple(target_modules)
        shapes = self.linear_shapes()
        picked = [shapes[n] for n in dict.fromkeys(names) if n in shapes]
        params = self.num_hidden_layers * sum(r * (a + b) for a, b in picked)
        if "lm_head" in names:
            params += r * (self.hidden_size + self.vocab_size)
        return params, sum(a for a, _ in picked)


@dataclass(frozen=True)
class Training:
    """What a job does to memory on one training GPU (from its resolved config: `training_of`)."""

    micro_batch: int  # sequences per forward/backward (per_device_train_batch_size)
    seq_len: int  # tokens per sequence at most (GRPO: max_prompt_length + max_completion_length)
    lora_r: int | None = None  # None: full fine-tuning
    lora_targets: str | list[str] = "all-linear"
    gradient_checkpointing: bool = False
    reference_model: bool = False  # GRPO, beta > 0, no LoRA
    vllm_fraction: float = 0.0  # colocated vLLM's share of the GPU
    zero3_world: int = 1  # DeepSpeed ZeRO-3: processes the states are sharded over
    # hf decoding on a copy of the policy (`static`, or overlap): sequences its cache holds (0: no copy)
    copy_decode_batch: int = 0
    copy_decode_why: str = "static"  # what holds the copy: "static", "overlap" or "static+overlap"
    prompt_len: int = 0  # overlap: prompt tokens at most (its prefill runs beside training)


@dataclass
class MemoryPlan:
    """The estimate: `terms` in bytes (what a report shows), `peak` the bytes one GPU needs."""

    params: int
    trainable: int
    terms: dict[str, int]
    peak: int
    gpu_memory: int | None = None  # bytes; None: not known, not checked
    notes: list[str] = field(default_factory=list)

    @property
    def estimate_gib(self) -> float:
        return self.peak / GIB

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_memory is None else self.peak <= self.gpu_memory

    def record(self) -> dict[str, Any]:
        """What the job stores (resolved_config['memory_plan'])."""
        return {
            "estimate_gib": round(self.estimate_gib, 2),
            "gpu_memory_gib": None if self.gpu_memory is None else round(self.gpu_memory / GIB, 2),
            "fits": self.fits,
            "params": self.params,
            "trainable_params": self.trainable,
            "terms_gib": {k: round(v / GIB, 3) for k, v in self.terms.items()},
            "notes": self.notes,
        }


def estimate(shape: ModelShape, training: Training, gpu_memory: int | None = None) -> MemoryPlan:
    """Peak bytes on one training GPU (what it assumes: docs/gpu.md, on memory_plan)."""
    t = training
    params = shape.parameter_count()
    layers, h = shape.num_hidden_layers, shape.hidden_size
    lora_in = 0
    if t.lora_r is not None:
        trainable, lora_in = shape.lora_parameters(t.lora_r, t.lora_targets)
    else:
        trainable = params
    shard = max(1, t.zero3_world)
    tokens = t.micro_batch * t.seq_len
    per_token_layer = ACT_HIDDEN * h + ACT_INTERMEDIATE * shape.intermediate_size + ACT_LORA * lora_in
    one_layer = int(tokens * per_token_layer)
    layer_casts = CAST_BYTES * shape.layer_parameters()
    if t.gradient_checkpointing:
        activations = int(tokens * layers * CKPT_HIDDEN * h) + one_layer
        # autocast caches the copies of trainable weights through the forward; frozen ones are
        # cast layer by layer (and not kept: the layer is recomputed)
        casts = CAST_BYTES * params if t.lora_r is None else layer_casts
    else:
        activations = layers * one_layer
        casts = CAST_BYTES * params
    # TRL's chunked LM head: its bfloat16 tile, the final hidden states and their fp32 gradient
    logits = min(tokens, HEAD_TOKENS) * HEAD_VOCAB * 2 + tokens * h * 8
    terms = {
        "weights": WEIGHT_BYTES * (params if t.lora_r is None else params + trainable) // shard,
        "gradients": GRAD_BYTES * trainable // shard,
        "optimizer": ADAM_BYTES * trainable // shard,
        "reference_model": WEIGHT_BYTES * params // shard if t.reference_model else 0,
        "decode_copy": CAST_BYTES * params if t.copy_decode_batch else 0,
        "decode_cache": t.copy_decode_batch * t.seq_len * shape.kv_cache_bytes_per_token(CAST_BYTES),
        "weight_casts": casts,
        "activations": activations,
        "logits": logits,
        "overlap_working": _overlap_working(shape, t) if "overlap" in t.copy_decode_why and t.copy_decode_batch else 0,
    }
    # the step's peak: at the end of the forward pass (every activation and weight copy held), or
    # late in the backward pass (every gradient, one layer's activations; with checkpointing the
    # checkpoints too)
    forward_end = casts + activations + logits
    backward_end = terms["gradients"] + layer_casts + (activations if t.gradient_checkpointing else one_layer)
    held = sum(terms[k] for k in ("weights", "optimizer", "reference_model", "decode_copy", "decode_cache"))
    torch_peak = held + max(forward_end, backward_end) + terms["overlap_working"]
    terms["allocator_slack"] = int(ALLOCATOR_SLACK * torch_peak)
    terms["cuda_overhead"] = CUDA_OVERHEAD
    terms["vllm"] = int(t.vllm_fraction * gpu_memory) if gpu_memory is not None else 0
    peak = torch_peak + terms["allocator_slack"] + terms["cuda_overhead"] + terms["vllm"]
    notes = []
    if t.vllm_fraction and gpu_memory is None:
        notes.append(
            f"the colocated vLLM engine's share ({t.vllm_fraction:g} of the GPU) is not counted: GPU size unknown"
        )
    return MemoryPlan(params=params, trainable=trainable, terms=terms, peak=peak, gpu_memory=gpu_memory, notes=notes)


def _overlap_working(shape: ModelShape, t: Training) -> int:
    """What overlap's thread holds at most while the training step runs (docs/gpu.md, on memory_plan)."""
    per_token = CAST_BYTES * (2 * shape.hidden_size + 2 * shape.intermediate_size)
    prefill = t.copy_decode_batch * t.prompt_len * per_token + t.copy_decode_batch * shape.vocab_size * 4 * 3
    tokens = t.micro_batch * t.seq_len
    scoring = tokens * per_token + min(tokens, HEAD_TOKENS) * HEAD_VOCAB * 2
    return max(prefill, scoring)


def read_model_config(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The config.json of a local model directory (of a LoRA adapter's directory: its base model's,
    when that is a local directory too); None when there is none or it is not JSON."""
    root = Path(path)
    for _ in range(2):  # the directory, then an adapter's base
        try:
            if (root / "config.json").is_file():
                data = json.loads((root / "config.json").read_text(encoding="utf-8"))
                return data if isinstance(data, dict) else None
            adapter = json.loads((root / "adapter_config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        base = adapter.get("base_model_name_or_path") if isinstance(adapter, dict) else None
        if not isinstance(base, str) or not base.startswith("/"):
            return None
        root = Path(base)
    return None


def plan_job(training: Training, model_config: Mapping[str, Any], gpu_memory_gib: float | None) -> MemoryPlan:
    """The plan of a job whose training is `training` (a kind's memory hook makes it from the job's
    resolved config: kinds.training_of)."""
    gpu = None if gpu_memory_gib is None else int(gpu_memory_gib * GIB)
    return estimate(ModelShape.from_config(model_config), training, gpu)


@dataclass
class Refusal:
    """Why a job does not fit, and what would: `errors` as (JSON pointer, detail)."""

    detail: str
    errors: list[tuple[str, str]]


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def check_job(
    training: Training, model_config: Mapping[str, Any], gpu_memory_gib: float | None
) -> tuple[MemoryPlan, Refusal | None]:
    """The job's plan and, when it needs more than the GPU has, the refusal: which fields would
    make it fit, with the estimate each change gives."""
    shape = ModelShape.from_config(model_config)
    gpu = None if gpu_memory_gib is None else int(gpu_memory_gib * GIB)
    plan = estimate(shape, training, gpu)
    if gpu is None or plan.peak <= gpu:
        return plan, None

    def with_(**change: Any) -> MemoryPlan:
        return estimate(shape, replace(training, **change), gpu)

    options: list[tuple[str, str]] = []
    fits_alone = False
    if training.lora_r is None:
        p = with_(lora_r=16, lora_targets="all-linear", reference_model=False)
        fits_alone |= p.peak <= gpu
        options.append(("/lora", f"LoRA r=16 ('lora: {{r: 16}}') would need ~{_gib(p.peak)}"))
    if not training.gradient_checkpointing:
        p = with_(gradient_checkpointing=True)
        fits_alone |= p.peak <= gpu
        options.append(("/gradient_checkpointing", f"gradient_checkpointing: true would need ~{_gib(p.peak)}"))
    if training.lora_r is None and not training.gradient_checkpointing and not fits_alone:
        p = with_(lora_r=16, lora_targets="all-linear", reference_model=False, gradient_checkpointing=True)
        options.append(("/lora", f"LoRA r=16 with gradient_checkpointing: true would need ~{_gib(p.peak)}"))
    if training.micro_batch > 1:
        fitting = next((b for b in range(training.micro_batch - 1, 0, -1) if with_(micro_batch=b).peak <= gpu), None)
        b = fitting or 1
        options.append(
            (
                "/per_device_train_batch_size",
                f"per_device_train_batch_size={b} would need ~{_gib(with_(micro_batch=b).peak)}"
                + (
                    " (set global_batch_size to keep the batch: gradient accumulation makes up the rest)"
                    if fitting
                    else " (still too much alone)"
                ),
            )
        )
    if training.copy_decode_batch:
        p = with_(copy_decode_batch=0)
        field, change = {
            "static": ("/generation/hf_mode", "generation.hf_mode='dynamic'"),
            "overlap": ("/generation/overlap", "generation.overlap: false"),
            "static+overlap": ("/generation/overlap", "generation.overlap: false with hf_mode='dynamic'"),
        }[training.copy_decode_why]
        options.append(
            (
                field,
                f"{change} (no bfloat16 copy of the policy and its generation cache: "
                f"{_gib(plan.terms['decode_copy'] + plan.terms['decode_cache'])} now) would need ~{_gib(p.peak)}",
            )
        )
    if training.vllm_fraction > 0:
        room = gpu - (plan.peak - plan.terms["vllm"])
        vllm_weights = shape.parameter_count() * 2  # its bfloat16 weights, and room for a KV cache
        if room > vllm_weights * 1.2:
            low = math.floor(100 * room / gpu) / 100
            options.append(
                (
                    "/generation/gpu_memory_utilization",
                    f"generation.gpu_memory_utilization={low:.2f} (now {training.vllm_fraction:g}: "
                    f"{_gib(plan.terms['vllm'])} for the colocated vLLM engine) would fit",
                )
            )
        else:
            why = (
                f", and less would not hold its weights ({_gib(vllm_weights)} in bfloat16) and a cache"
                if room > 0
                else ""
            )
            options.append(
                (
                    "/generation/gpu_memory_utilization",
                    f"the colocated vLLM engine takes {_gib(plan.terms['vllm'])} "
                    f"(gpu_memory_utilization={training.vllm_fraction:g}){why}: generation.mode='server' "
                    "gives it GPUs of its own",
                )
            )
    terms = ", ".join(f"{k} {_gib(v)}" for k, v in plan.terms.items() if v)
    detail = (
        f"the memory plan needs ~{_gib(plan.peak)} per GPU and this pool's GPUs have {_gib(gpu)} "
        f"({shape.parameter_count() / 1e9:.2f}B parameters, "
        f"{'LoRA r=' + str(training.lora_r) if training.lora_r else 'full fine-tuning'}; {terms}). "
        "To fit: " + "; ".join(text for _, text in options)
    )
    return plan, Refusal(detail=detail, errors=[(pointer, text) for pointer, text in options] or [("/", detail)])
