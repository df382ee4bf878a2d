"""GRPO presets and their resolution into one concrete config.

Every knob is declared once, on the spec (mathrl/specs/grpo.py: `Knob`, with TRL's default, its
bounds and help). A preset is an overlay of values over those declarations, naming exactly the
values it sets. Resolution order: TRL's defaults, then the preset, then every field the user set
explicitly. The result is what the run stores, and what the trainer reads (ResolvedGRPO); the GRPO
spec validates itself by resolving (so the SDK refuses what the server would).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mathrl.backends import uses_vllm
from mathrl.errors import FieldError
from mathrl.specs.base import knob_defaults
from mathrl.specs.loop import Curriculum, DynamicSampling

if TYPE_CHECKING:
    from mathrl.specs import GRPOSpec


def _err(field: str, message: str) -> ValueError:
    return FieldError(field, message)


# DeepSeekMath (Shao et al. 2024), section 4.2: policy lr 1e-6, KL coefficient 0.04,
# 64 outputs per question, max length 1024, training batch 1024, a single policy update
# per exploration stage; the original GRPO loss with per-group reward normalisation.
PRESETS: dict[str, dict[str, Any]] = {
    "trl-default": {},
    "deepseekmath": {
        "learning_rate": 1e-6,
        "beta": 0.04,
        "num_generations": 64,
        "max_completion_length": 1024,
        "global_batch_size": 1024,
        "per_device_train_batch_size": 16,
        "num_iterations": 1,
        "loss_type": "grpo",
        "scale_rewards": "group",
        "epsilon": 0.2,
    },
}

# mathrl's own loop (trainer/grpo_loop.py), per preset: what a spec that leaves these unset gets.
# `trl-default` turns on what was measured to help and leaves the update as TRL computes it: the
# skip (bench/time_to_accuracy.py: the same held-out curve as TRL's, 70% in 0.59x the time).
# Dynamic sampling is off by default: on the same bench it reached 70% in 1.29x TRL's time (its
# extra generation rounds cost more than its extra signal gave); a spec turns it on where signal
# is scarce. The curriculum, and dynamic sampling with vLLM generation, were measured on two seeds
# (docs/grpo-loop.md, 2026-11-28): neither won on both, so both stay off. `deepseekmath` stays
# the paper's loop.
LOOP_DEFAULTS: dict[str, dict[str, bool]] = {
    "trl-default": {"dynamic_sampling": False, "curriculum": False, "skip_zero_advantage": True},
    "deepseekmath": {"dynamic_sampling": False, "curriculum": False, "skip_zero_advantage": False},
}
CHECKED_REWARDS = ("accuracy", "binary")  # rewards whose value > 0 means a correct answer

# Knobs TRL 1.16's AsyncGRPOTrainer has no setting for (its loss is its own, with no KL term):
# an async job refuses them at submit and stores them as null (not applicable).
ASYNC_UNSUPPORTED: tuple[str, ...] = (
    "beta",
    "num_iterations",
    "loss_type",
    "delta",
    "importance_sampling_level",
    "scale_rewards",
    "mask_truncated_completions",
)


def resolve_grpo(spec: GRPOSpec) -> dict[str, Any]:
    """Return every knob with its concrete value; raise ValueError saying how to fix it."""
    trl = knob_defaults(type(spec))
    values: dict[str, Any] = dict(trl)
    values.update(PRESETS[spec.preset])
    for knob in trl:
        explicit = getattr(spec, knob)
        if explicit is not None:
            values[knob] = explicit

    # processes on each node x nodes, less the vLLM server's GPUs in server mode
    world = spec.training_world
    g = values["num_generations"]
    per_device = values["per_device_train_batch_size"]
    if g < 2:
        raise _err(
            "num_generations", f"num_generations={g}: GRPO normalises rewards within a group, so it needs at least 2"
        )
    if values["beta"] < 0:
        raise _err("beta", f"beta={values['beta']} is negative: the KL coefficient must be >= 0 (0 disables KL)")
    eps = values["epsilon"]
    if values["epsilon_high"] is not None and values["epsilon_high"] < eps:
        raise _err("epsilon_high", f"epsilon_high={values['epsilon_high']} is below epsilon={eps}: raise it or drop it")
    if values["delta"] is not None and values["delta"] <= 1 + eps:
        raise _err("delta", f"delta={values['delta']} must exceed 1 + epsilon = {1 + eps}: raise delta or drop it")

    micro = per_device * world
    global_batch = values["global_batch_size"] or micro
    if global_batch % micro:
        raise _err(
            "global_batch_size",
            f"global_batch_size={global_batch} is not a multiple of per_device_train_batch_size x processes "
            f"= {per_device} x {world} = {micro}: change either so it divides",
        )
    if global_batch % g:
        raise _err(
            "num_generations",
            f"the batch of {global_batch} completions is not divisible by num_generations={g}: "
            f"every question needs its whole group; use a batch that is a multiple of {g}",
        )
    values["global_batch_size"] = global_batch
    values["gradient_accumulation_steps"] = global_batch // micro
    values["questions_per_step"] = global_batch // g
    values["world_size"] = world
    values["generation_backend"] = spec.generation.resolve(spec.resources.gpus)
    values["generation_mode"] = spec.generation.mode if uses_vllm(values["generation_backend"]) else None
    values["vllm_server_gpus"] = spec.generation.resolved_server_gpus(spec.resources.gpus)
    values["preset"] = spec.preset
    values["algorithm"] = spec.algorithm
    values.update(resolve_loop(spec, values))
    if spec.algorithm == "async":
        values.update(dict.fromkeys(ASYNC_UNSUPPORTED))
    return values


def resolve_loop(spec: GRPOSpec, values: dict[str, Any]) -> dict[str, Any]:
    """dynamic_sampling and curriculum (their blocks with every setting, or None: off) and
    skip_zero_advantage (whether the run skips: only where that leaves the update exact). A part the
    spec asks for explicitly and cannot run is refused; a preset's default that cannot run here is off."""
    defaults = LOOP_DEFAULTS[spec.preset]
    checked = any(r.name in CHECKED_REWARDS for r in spec.rewards)
    world = values["world_size"]
    local = values["global_batch_size"] // world
    whole_groups = local % values["num_generations"] == 0
    out: dict[str, Any] = {}
    parts: tuple[tuple[str, type[DynamicSampling] | type[Curriculum]], ...] = (
        ("dynamic_sampling", DynamicSampling),
        ("curriculum", Curriculum),
    )
    for part, block in parts:
        asked = getattr(spec, part)
        explicit = asked is not None
        on = defaults[part] if asked is None else asked.enabled
        settings = (asked or block()).model_dump(exclude={"enabled"})  # the block's own defaults where unset
        if part == "dynamic_sampling" and settings["metric"] is None:
            # unset: the verdict where a reward gives one, else the weighted reward (zero variance: zero advantage).
            # Unset is None, not a default of 'correct' told apart by model_fields_set: the stored spec (every
            # field dumped) is parsed again by the worker, where a default would read as asked for
            settings["metric"] = "correct" if checked else "reward"
        if on and part == "dynamic_sampling" and settings["metric"] == "correct" and not checked:
            raise _err(
                "dynamic_sampling/metric",
                "metric 'correct' needs an accuracy or binary reward to read the verdict from: add one to "
                "rewards, or use metric 'reward'",
            )
        why = None
        if spec.algorithm == "async":
            why = "async GRPO samples in its own rollout worker"
        elif part == "curriculum" and not checked:
            why = "a pass rate needs an accuracy or binary reward: add one to rewards"
        elif not whole_groups:
            why = (
                f"each of the {world} training processes must hold whole groups, but it holds {local} completions "
                f"of groups of {values['num_generations']}: make global_batch_size / processes a multiple of "
                "num_generations"
            )
        if on and why:
            if explicit:
                raise _err(part, f"{part} cannot run for this job: {why}; or set {part}: false")
            on = False
        out[part] = block(**settings) if on else None
    out["skip_zero_advantage"] = resolve_skip(spec, values, defaults["skip_zero_advantage"])
    if spec.generation.overlap:
        check_overlap(spec, values, out)
    return out


def check_overlap(spec: GRPOSpec, values: dict[str, Any], loop: dict[str, Any]) -> None:
    """generation.overlap prefetches the next step's questions from the dataloader: refused where the
    loop picks them from this step's grades, or where one generation trains several updates."""
    for part in ("dynamic_sampling", "curriculum"):
        if loop[part] is not None:
            raise _err(
                "generation/overlap",
                f"overlap generates the next step's questions while this step trains, and {part} chooses them "
                f"from this step's grades: set {part}: false, or drop overlap",
            )
    if values["num_iterations"] != 1:
        raise _err(
            "generation/overlap",
            f"overlap trains each generation once, one step after it was sampled; num_iterations="
            f"{values['num_iterations']} would reuse it: set num_iterations: 1, or drop overlap",
        )


def resolve_skip(spec: GRPOSpec, values: dict[str, Any], default: bool) -> bool | None:
    """Whether the run skips zero-advantage completions: stored as what the run does. Skipping is
    exact only with no KL term (beta 0: a completion with zero advantage then adds nothing to the
    update; every loss type TRL 1.16 has agrees); asked for with beta > 0 it is refused, and a
    preset's default is off there. None: async, which has a loss of its own."""
    skip = spec.skip_zero_advantage
    if spec.algorithm == "async":
        if skip:
            raise _err("skip_zero_advantage", "async GRPO has its own loss: drop skip_zero_advantage")
        return None
    exact = values["beta"] == 0
    if skip and not exact:
        raise _err(
            "skip_zero_advantage",
            f"skipping zero-advantage completions changes the update when beta > 0 (beta={values['beta']:g}: the "
            "KL term still has a gradient for them): drop skip_zero_advantage, or set beta: 0",
        )
    return (default if skip is None else skip) and exact
