"""Run by tests/system/test_vllm.py in a process of its own (vLLM's engine wants a __main__): a few
GRPO steps generating with vLLM (MathrlGRPOTrainer, as GRPO jobs run it), then greedy completions
for fixed prompts from vLLM, after the trainer's own weight sync, and from the trainer's updated
HF model, and vLLM's greedy completions before training. In colocate mode also the importance
ratio of one sampled batch computed both ways: TRL's (a no-grad pass after generation) and
mathrl's (from the training forward, trainer/grpo_loop.py). Prints JSON.

    python tests/helpers/vllm_sync_check.py colocate MODEL_DIR OUT_DIR   # full weights into the colocated engine
    python tests/helpers/vllm_sync_check.py server MODEL_DIR OUT_DIR     # LoRA adapters to the worker's vLLM server
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PROMPTS = ["12+34=", "56+78=", "90+12=", "34+56=", "7+8=", "11+22="]
NEW_TOKENS = 8


def reward_digit_sevens(completions: list[str], **_: object) -> list[float]:
    """A dense reward that moves a random model's greedy text fast: how many '7's it writes."""
    return [float(c.count("7")) for c in completions]


def main(mode: str, model: str, out: str) -> None:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig

    from config.settings import get_settings
    from evaluator.backends.vllm import engine_options
    from evaluator.models import load_tokenizer
    from trainer.grpo_config import lora_config
    from trainer.grpo_loop import LoopOptions, MathrlGRPOTrainer

    tok = load_tokenizer(model)
    server = None
    if mode == "server":  # started as the worker starts it for a job in server mode
        from kinds import resolve_config
        from mathrl.specs import parse_spec
        from worker.vllm_server import start_server

        spec = parse_spec(
            {
                "kind": "grpo",
                "model": model,
                "dataset": {"name": "arith-train"},
                "lora": {"r": 8},
                "generation": {"backend": "vllm", "mode": "server"},
                "max_prompt_length": 32,
                "max_completion_length": NEW_TOKENS,
                "num_generations": 4,
                "per_device_train_batch_size": 16,
            }
        )
        server, env = start_server(
            spec, resolve_config(spec), model, Path(out) / "server.log", None, [], get_settings().vllm.engine()
        )
    try:
        args = GRPOConfig(
            output_dir=out,
            learning_rate=3e-3 if mode == "colocate" else 2e-2,
            beta=0.0,
            num_generations=4,
            per_device_train_batch_size=16,
            max_completion_length=NEW_TOKENS,
            max_steps=3,
            use_cpu=True,
            bf16=False,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            disable_tqdm=True,
            seed=0,
            use_vllm=True,
            vllm_mode=mode,
            vllm_max_model_length=64,
            vllm_server_base_url=server.url if server else None,
            vllm_server_timeout=600,
        )
        trainer = MathrlGRPOTrainer(
            loop=LoopOptions(skip_zero_advantage=True),
            model=model,
            reward_funcs=[reward_digit_sevens],
            args=args,
            processing_class=tok,
            train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * 8]),
            engine_options=engine_options("auto", settings=get_settings().vllm.engine()),
            peft_config=lora_config_for(mode, lora_config),
        )
        gen = trainer.vllm_generation
        prompt_ids = [tok(p, add_special_tokens=False).input_ids for p in PROMPTS]

        def from_vllm() -> list[list[int]]:
            if mode == "server":
                return gen.vllm_client.generate(
                    prompt_ids, n=1, temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, max_tokens=NEW_TOKENS
                )["completion_ids"]
            from vllm import SamplingParams

            greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, logprobs=0)
            outs = [o.outputs[0] for o in gen.llm.generate(PROMPTS, greedy, use_tqdm=False)]
            vllm_logprobs[:] = [[lp[t].logprob for lp, t in zip(o.logprobs, o.token_ids, strict=True)] for o in outs]
            return [list(o.token_ids) for o in outs]

        vllm_logprobs: list[list[float]] = []  # of the greedy tokens, colocate mode
        before = from_vllm()
        trainer.train()
        gen.sync_weights()  # what the trainer runs before each generation round
        after = from_vllm()
        reuse = ratio_both_ways(trainer) if mode == "colocate" else {}
    finally:
        if server is not None:
            server.stop()
    model_ = trainer.model.eval()
    hf, hf_logprobs = [], []
    with torch.no_grad():
        for p, vllm_tokens in zip(PROMPTS, after, strict=True):
            ids = tok(p, return_tensors="pt", add_special_tokens=False).input_ids
            gen = model_.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
            hf.append(gen[0, ids.shape[1] :].tolist())
            # the updated model's log-probabilities of the tokens vLLM chose: a stale layer in the
            # engine moves them even where the greedy choice stays the same
            seq = torch.tensor([ids[0].tolist() + vllm_tokens])
            logp = torch.log_softmax(model_(seq).logits[0, ids.shape[1] - 1 : -1].float(), dim=-1)
            hf_logprobs.append([float(logp[i, t]) for i, t in enumerate(vllm_tokens)])
    timings = trainer.timings
    result = {"before": before, "after": after, "hf": hf, "timings": timings}
    result |= {"vllm_logprobs": vllm_logprobs, "hf_logprobs": hf_logprobs, "reuse": reuse}
    print("RESULT " + json.dumps(result), flush=True)


def ratio_both_ways(trainer: object) -> dict[str, object]:
    """One sampled batch scored by TRL's path (its no-grad pass computes the trainer's
    log-probabilities and the importance ratio after generation) and, on the same batch, the
    training forward with mathrl's ratio from it: how far apart the two are."""
    import torch

    t: Any = trainer
    assert t.reuse_logprobs, "the run should reuse the training forward's log-probabilities"
    t.reuse_logprobs = False  # TRL's own pass, for the comparison
    t.model.train()
    batch = [{"prompt": p} for p in PROMPTS[:4] for _ in range(4)]
    out, _, _ = t._one_round(batch)
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    width = out["completion_ids"].size(1)
    logps, _, _ = t._get_per_token_logps_and_entropies(t.model, ids, mask, width, compute_entropy=True)
    ours = t.importance_ratio(logps.detach(), out["sampling_per_token_logps"], out["completion_mask"])
    keep = out["completion_mask"].bool()
    return {
        "logp_diff": float((logps.detach() - out["old_per_token_logps"])[keep].abs().max()),
        "ratio_diff": float((ours - out["importance_sampling_ratio"]).abs().max()),
        "ratio_mean": float(out["importance_sampling_ratio"].mean()),
        "sampler_vs_trainer": float((out["old_per_token_logps"] - out["sampling_per_token_logps"])[keep].abs().mean()),
        "mode": t.vllm_importance_sampling_mode,
    }


def lora_config_for(mode: str, make: object) -> object:
    if mode != "server":
        return None
    from mathrl.specs import LoRA

    return make(LoRA(r=8, alpha=16, dropout=0.0))  # type: ignore[operator]


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
