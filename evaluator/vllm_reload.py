"""Loading new weights into a running vLLM engine: a checkpoint into a warm eval engine
(worker/warm_engine.py, through the server's /collective_rpc: `CheckpointReload`), or the policy's
weights into GRPO's colocated engine (trainer/vllm_generation.py).

Both go through vLLM's `reload_weights` (layerwise reload), which re-runs each layer's weight
processing, so on the CPU the new weights are packed for the fast kernels again. A language-model
head tied to the input embedding (`tie_word_embeddings`: SmolLM2, Qwen2's small models) is the one
layer it cannot reload: `retie_lm_head` points the head at the reloaded embedding and packs it
again. Why: docs/vllm.md, "`worker/warm_engine.py`: warm engines"."""

from __future__ import annotations

from typing import Any


def retie_lm_head(model: Any) -> bool:
    """After a reload: make a tied LM head use the (new) input embedding again. True if it did."""
    config = getattr(model, "config", None)
    lm_head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if not getattr(config, "tie_word_embeddings", False) or lm_head is None or embed is None:
        return False
    lm_head.weight = embed.weight
    lm_head.quant_method.process_weights_after_loading(lm_head)  # on the CPU: pack the new weight
    return True


class CheckpointReload:
    """vLLM worker extension (`vllm serve --worker-extension-cls evaluator.vllm_reload.CheckpointReload`):
    `reload_checkpoint` loads a checkpoint's weights from a folder of safetensors shards into the
    running engine. Called as `POST /collective_rpc {"method": "reload_checkpoint", "args": [path]}`
    (the server's development routes: VLLM_SERVER_DEV_MODE=1)."""

    model_runner: Any  # the worker's, set by vLLM

    def reload_checkpoint(self, path: str) -> None:
        self.model_runner.reload_weights(weights_path=path, is_checkpoint_format=True)
        retie_lm_head(self.model_runner.get_model())
