"""A training session's model, held in memory between a client's calls (Tinker's primitives):
`TrainingSession`, a base model with a LoRA adapter (`LoraOptions`) and an AdamW optimizer.

- `forward_backward(data, loss_fn)` adds the gradients of one of trainer/session_losses.py's losses
  to what earlier calls left and returns each `Datum`'s log-probabilities of its target tokens and
  the summed loss; `forward_only=True` computes them without gradients (Tinker's `forward`).
- `optim_step(AdamParams)` applies the accumulated gradients (`torch.optim.AdamW`) and clears them.
- `save(dir, optimizer=True)` writes the peft adapter and the optimizer's state; `load` reads them
  back, so a resumed session takes the same next step.

Datums, losses and saves as Tinker's: docs/tinker-protocol.md, sections 7 and 8."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainer.session_losses import LOSSES, loss_named

ADAPTER_CONFIG = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.pt"
SESSION_FILE = "session.json"
LORA_ALPHA = 32  # fixed, as Tinker's: a rank change does not rescale the adapter's output
# module names by what Tinker's flags train (train_attn, train_mlp, train_unembed)
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "c_attn", "c_proj", "query", "key", "value", "dense")
MLP = ("gate_proj", "up_proj", "down_proj", "gate_up_proj", "fc1", "fc2", "c_fc", "w1", "w2", "w3")
UNEMBED = ("lm_head",)


@dataclass(frozen=True)
class LoraOptions:
    """The adapter a session trains (Tinker's `create_lora_training_client` arguments)."""

    rank: int = 32
    seed: int | None = None
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True


@dataclass(frozen=True)
class AdamParams:
    """One `optim_step`'s parameters (Tinker's `AdamParams`)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def __post_init__(self) -> None:
        """ValueError naming the field: a NaN learning rate (JSON allows NaN) or beta2 1.0 (Adam's bias
        correction divides by 1 - beta2) wrote NaN into every weight of the session's adapter."""
        for name in ("learning_rate", "eps", "weight_decay", "grad_clip_norm"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (name == "eps" and value == 0):
                floor = "> 0" if name == "eps" else ">= 0"
                raise ValueError(f"adam_params.{name}: {value} is not a finite number {floor}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"adam_params.{name}: {getattr(self, name)} is out of range; give 0 <= {name} < 1")


@dataclass(frozen=True)
class Datum:
    """Tokens and their loss inputs (`target_tokens`, `weights`, `logprobs`, `advantages`, ...),
    each a list (or nested list) aligned with `tokens`."""

    tokens: Sequence[int]
    inputs: Mapping[str, Any]


@dataclass
class ForwardResult:
    logprobs: list[list[float]]  # per datum, the model's log-probability of each target token
    metrics: dict[str, float] = field(default_factory=dict)  # Tinker's 'name:reduction' keys


def target_modules(model: Any, lora: LoraOptions) -> list[str]:
    """The linear modules' names the flags select, as the model names them; ValueError when none."""
    import torch

    wanted = {
        *(ATTENTION if lora.train_attn else ()),
        *(MLP if lora.train_mlp else ()),
        *(UNEMBED if lora.train_unembed else ()),
    }
    names = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    chosen = sorted(names & wanted)
    if not chosen:
        flags = "train_attn/train_mlp/train_unembed"
        raise ValueError(f"no linear module of this model matches {flags} (its linear modules: {sorted(names)})")
    return chosen


class TrainingSession:
    """A LoRA adapter on a base model, its optimizer and its accumulated gradients."""

    def __init__(self, model_path: str, lora: LoraOptions, dtype: str = "auto", device: str | None = None) -> None:
        import torch
        from peft import LoraConfig, get_peft_model

        from evaluator.models import load_model, load_tokenizer

        self.model_path, self.lora = model_path, lora
        base = load_model(model_path, dtype, device)
        self.tokenizer = load_tokenizer(model_path)
        if lora.seed is not None:
            torch.manual_seed(lora.seed)
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=LORA_ALPHA,
            lora_dropout=0.0,  # no randomness in a step: a resumed session takes the same step
            target_modules=target_modules(base, lora),
            task_type="CAUSAL_LM",
        )
        self.model: Any = get_peft_model(base, config)
        self.model.train()
        self.device = next(self.model.parameters()).device
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=AdamParams().learning_rate, fused=False, foreach=False)
        self.steps = 0  # optim_steps taken

    # --- the primitives -------------------------------------------------------------------

    def forward_backward(
        self,
        data: Sequence[Datum],
        loss_fn: str,
        config: Mapping[str, float] | None = None,
        forward_only: bool = False,
    ) -> ForwardResult:
        """Each datum's target log-probabilities and the summed loss; with `forward_only` false,
        the loss's gradients are added to the accumulated ones."""
        import torch

        loss_of = loss_named(loss_fn)
        config = dict(config or {})
        if not data:
            raise ValueError("data: give at least one datum")
        inputs = [self._inputs(i, d, loss_fn) for i, d in enumerate(data)]
        width = max(len(d.tokens) for d in data)
        ids = torch.zeros((len(data), width), dtype=torch.long, device=self.device)
        mask = torch.zeros((len(data), width), dtype=torch.long, device=self.device)
        for i, d in enumerate(data):
            ids[i, : len(d.tokens)] = torch.tensor(list(d.tokens), dtype=torch.long)
            mask[i, : len(d.tokens)] = 1
        with torch.set_grad_enabled(not forward_only):
            logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            total = torch.zeros((), device=self.device)
            per_datum: list[list[float]] = []
            for i, (d, given) in enumerate(zip(data, inputs, strict=True)):
                n = len(d.tokens)
                targets = given.pop("target_tokens")
                lp = logp[i, :n].gather(-1, targets.view(n, -1)).view(targets.shape)
                total = total + loss_of(lp, given, config)
                per_datum.append(lp.detach().cpu().tolist())
            if not forward_only:
                total.backward()  # type: ignore[no-untyped-call]
        return ForwardResult(per_datum, {"loss:sum": float(total.detach())})

    def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """Apply the accumulated gradients with these Adam parameters, then clear them."""
        import torch

        for group in self.optimizer.param_groups:
            group.update(
                lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps, weight_decay=adam.weight_decay
            )
        clip = adam.grad_clip_norm if adam.grad_clip_norm > 0 else math.inf  # inf: the norm, nothing clipped
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm:mean": norm, "learning_rate:mean": adam.learning_rate}

    def save(self, directory: Path, optimizer: bool = True) -> Path:
        """The adapter (and, for a state to resume from, the optimizer) in `directory`."""
        import torch

        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(directory))
        self.tokenizer.save_pretrained(str(directory))
        record = {"base_model": self.model_path, "lora": asdict(self.lora), "steps": self.steps, "optimizer": optimizer}
        (directory / SESSION_FILE).write_text(json.dumps(record, indent=2))
        if optimizer:
            torch.save(self.optimizer.state_dict(), directory / OPTIMIZER_FILE)
        return directory

    def load(self, directory: Path, optimizer: bool) -> None:
        """The adapter saved in `directory` (and its optimizer state, when asked); ValueError
        when it is not a saved session state, has another LoRA rank, or has no optimizer state
        when one is asked for."""
        import torch
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        if not (directory / SESSION_FILE).exists():
            raise ValueError(f"{directory.name}: not a saved session state (no {SESSION_FILE})")
        record = json.loads((directory / SESSION_FILE).read_text())
        if record["lora"]["rank"] != self.lora.rank:
            saved = record["lora"]["rank"]
            raise ValueError(f"{directory.name}: saved with LoRA rank {saved}, this session's is {self.lora.rank}")
        weights = load_file(str(directory / "adapter_model.safetensors"), device=str(self.device))
        set_peft_model_state_dict(self.model, weights)
        if optimizer:
            if not (directory / OPTIMIZER_FILE).exists():
                raise ValueError(f"{directory.name}: saved without its optimizer state: load it without the optimizer")
            self.optimizer.load_state_dict(torch.load(directory / OPTIMIZER_FILE, weights_only=True))
            self.steps = int(record["steps"])
        self.optimizer.zero_grad(set_to_none=True)

    # --- inputs ----------------------------------------------------------------------------

    def _inputs(self, index: int, datum: Datum, loss_fn: str) -> dict[str, Any]:
        import torch

        n = len(datum.tokens)
        if n == 0:
            raise ValueError(f"data[{index}].model_input: no tokens")
        self.check_tokens(datum.tokens, f"data[{index}].model_input")
        missing = [k for k in ("target_tokens", *LOSSES[loss_fn].reads) if k not in datum.inputs]
        if missing:
            raise ValueError(f"data[{index}].loss_fn_inputs: {loss_fn} needs {missing}")
        out: dict[str, Any] = {}
        for key, value in datum.inputs.items():
            dtype = torch.long if key == "target_tokens" else torch.float32
            tensor = torch.as_tensor(value, dtype=dtype, device=self.device)
            if tensor.shape[0] != n:
                raise ValueError(
                    f"data[{index}].loss_fn_inputs.{key}: {tensor.shape[0]} values for {n} tokens (one per token)"
                )
            if key == "target_tokens":
                self.check_tokens(tensor.flatten().tolist(), f"data[{index}].loss_fn_inputs.target_tokens")
            out[key] = tensor
        return out

    def check_tokens(self, tokens: Sequence[int], where: str) -> None:
        """ValueError naming the field for a token id outside the model's vocabulary (an IndexError on
        the CPU, and on a GPU a device-side assert that leaves the process's CUDA context unusable)."""
        vocab = int(self.model.get_input_embeddings().num_embeddings)
        bad = next((t for t in tokens if not 0 <= int(t) < vocab), None)
        if bad is not None:
            raise ValueError(f"{where}: token {bad} is not in the model's vocabulary (0 to {vocab - 1})")
