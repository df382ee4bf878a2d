"""Loading problems: one code path through `datasets` for hub ids and local files alike."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from evaluator.benchmarks import Benchmark
from evaluator.grading import gsm8k_gold, last_boxed
from evaluator.problem import Problem as Problem  # the loaders' result type, where it was
from mathrl.errors import FieldError

log = logging.getLogger(__name__)
_LEVEL = re.compile(r"Level\s*(\S+)")


def load_args(
    source: str, split: str, config: str | None, data_file: str | Path | None
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments for `datasets.load_dataset`: a hub id with its config
    and split, or, with `data_file` (a local path, a file:// URL or an http(s) URL admitted by
    api/admission.py), the json/parquet builder on that file (whose one split is 'train')."""
    if data_file is not None:
        data_file = str(data_file)
        if data_file.startswith("file://"):
            data_file = unquote(urlsplit(data_file).path)
        fmt = "parquet" if data_file.endswith(".parquet") else "json"
        return (fmt,), {"data_files": data_file, "split": "train"}
    return (source, config), {"split": split}


def benchmark_load_args(bench: Benchmark, data_dir: str | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What `load_benchmark` loads for a registered benchmark: the offline copy when the data dir
    has it, else the hub id, config and split of the registry entry."""
    local = Path(data_dir) / bench.local_file if data_dir and bench.local_file else None
    if local is not None and not local.exists():
        if os.environ.get("HF_HUB_OFFLINE") == "1":
            raise FileNotFoundError(f"{bench.name}: no offline copy at {local} and the hub is off")
        log.info("%s: %s not found, loading %s from the hub", bench.name, local, bench.hub_id)
        local = None
    return load_args(bench.hub_id, bench.split, bench.hub_config, local)


def _load_rows(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import datasets

    datasets.disable_progress_bars()
    return datasets.load_dataset(*args, **kwargs)


FOREIGN = (
    "names data files outside its repository: a hub dataset is read from its own files only (its card's "
    "data_files and data_dir relative to the repository)"
)


def _foreign(hub: str) -> FieldError:
    return FieldError("dataset.hub", f"dataset.hub: the hub dataset {hub!r} {FOREIGN}")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


def _own_path(pattern: str) -> bool:
    """A pattern `datasets` resolves inside the repository: relative, no '..', and no colon at all
    (no scheme: 'file:/x' and 'local:/x' glob the worker's disk through fsspec; no '::' chain, no drive)."""
    p = pattern.strip()
    return bool(p) and not p.startswith(("/", "~", "\\")) and ":" not in p and ".." not in re.split(r"[/\\]", p)


def _checked_revision(hub: str) -> str | None:
    """The repository's head commit, once its card (README.md's `configs`, and the standalone
    .huggingface.yaml `datasets` merges into it) names only paths inside the repository, in every
    config, before `datasets` globs anything. None with HF_HUB_OFFLINE (`datasets` then serves only
    what it prepared before); a hub that cannot be reached otherwise fails the load, as a card that
    cannot be read is not loaded. Raises the FOREIGN refusal for a path out of the repository."""
    import yaml
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard, DatasetCardData, HfApi, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, OfflineModeIsEnabled

    try:
        sha = HfApi().dataset_info(hub).sha
    except OfflineModeIsEnabled:
        return None
    if sha is None:  # nothing to pin the check to: loading its head unchecked would be the hole again
        raise ValueError(f"the hub named no commit of {hub!r}: its card cannot be checked")
    card: dict[str, Any] = {}
    for name in ("README.md", ".huggingface.yaml"):
        try:
            path = hf_hub_download(hub, name, repo_type="dataset", revision=sha)
        except EntryNotFoundError:
            continue
        if name == "README.md":
            card.update(DatasetCard.load(path).data.to_dict())
        else:
            with open(path, encoding="utf-8") as f:
                card.update(yaml.safe_load(f) or {})
    configs = MetadataConfigs.from_dataset_card_data(DatasetCardData(**card))
    patterns = [s for params in configs.values() for k in ("data_files", "data_dir") for s in _strings(params.get(k))]
    if not all(_own_path(p) for p in patterns):
        raise _foreign(hub)
    return str(sha)


def _hub_rows(hub: str, config: str | None, split: str) -> Any:
    """`datasets.load_dataset(hub, config, split=split)` in its three steps (load_dataset_builder,
    download_and_prepare, as_dataset), its card checked before the first, its files between the
    first two.

    A hub dataset's card (README.md's `configs`) lists its data files as glob patterns, and
    `datasets` resolves an absolute one on the worker's own disk. For a hub repository it then
    refuses files outside the repository (datasets/builder.py, "Data files don't belong"), but only
    where the glob matched, and only for the config asked for: what the worker's disk holds
    (`/var/lib/mathrl/artifacts/jobs/<prefix>*`) showed in which answer a job got. So the card is
    read first, at the repository's head commit, and a pattern that could leave the repository is
    refused before anything is globbed; the builder then loads that commit. And a hub id that is
    also a directory under the worker's working directory is read as that directory, with no such
    check: every resolved file must be the repository's own (hf://datasets/<hub>@<commit>/...)."""
    import datasets

    datasets.disable_progress_bars()
    revision = _checked_revision(hub)
    try:
        builder = datasets.load_dataset_builder(hub, config, revision=revision)
    except Exception as exc:
        text = str(exc)
        if "don't belong" in text:  # a path out of the repository that the card check let by
            raise _foreign(hub) from None
        raise
    own = f"hf://datasets/{hub}@".lower()
    files = [str(f) for fs in (builder.config.data_files or {}).values() for f in fs]
    if any(not f.lower().startswith(own) for f in files):
        raise _foreign(hub)
    builder.download_and_prepare()
    return builder.as_dataset(split=split)


def _meta_value(name: str, value: Any) -> Any:
    """MATH levels as numbers whichever copy they come from ('Level 3' on the hub, 3 in MATH-500;
    the few unlabelled 'Level ?' rows become '?')."""
    if name == "level" and isinstance(value, str) and (m := _LEVEL.fullmatch(value.strip())):
        return int(m.group(1)) if m.group(1).isdigit() else m.group(1)
    return value


def load_benchmark(bench: Benchmark, data_dir: str | None, limit: int | None = None) -> list[Problem]:
    """Rows of a registered benchmark: the offline copy when the data dir has it, else the hub."""
    if bench.synthetic:
        from evaluator import synthetic

        if bench.split == "test":
            return synthetic.heldout(limit, task=bench.task)
        return synthetic.train(limit or 10_000, carry_slip=bench.carry_slip, task=bench.task, traces=bench.traces)
    rows = _load_rows(*benchmark_load_args(bench, data_dir))
    missing = [f for f in (bench.question_field, bench.answer_field) if f not in rows.column_names]
    if missing:
        raise ValueError(f"{bench.name}: the data has no field(s) {missing}; it has {rows.column_names}")
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    problems = []
    for i, row in enumerate(rows):
        raw_answer = row[bench.answer_field]
        if bench.answer_from == "boxed_solution":
            raw_answer = last_boxed(raw_answer or "")
        if raw_answer is None or not str(raw_answer).strip():
            continue  # a solution without a final answer cannot grade anything
        gold = gsm8k_gold(raw_answer) if bench.gold_format == "gsm8k" else str(raw_answer).strip()
        for source, name in bench.renames:
            if name not in row and source in row:
                row[name] = row[source]
        meta = {k: _meta_value(k, row[k]) for k in bench.meta_fields if k in row}
        problems.append(
            Problem(
                index=i,
                question=row[bench.question_field],
                gold=gold,
                meta=meta,
                solution=row.get("solution") or raw_answer,
            )
        )
    return problems


def custom_source(ref: Any) -> str:
    """How a user's set is named in events and scores: the file's name, or the hub id and split."""
    if ref.hub is not None:
        return f"{ref.hub}{':' + ref.config if ref.config else ''}/{ref.split}"
    if getattr(ref, "file", None):
        return str(ref.file)
    return str(ref.path).rsplit("/", 1)[-1]


def load_custom_set(ref: Any, limit: int | None = None) -> list[Problem]:
    """A user's questions (a DatasetRef with `path` or `hub`), through the same `datasets` call
    as the registered sets. Raises ValueError naming the spec field at fault (dataset.hub,
    dataset.split, dataset.question_field/answer_field): the worker runs this before any work."""
    name = custom_source(ref)
    if ref.hub is not None:
        try:
            rows = _hub_rows(ref.hub, ref.config, ref.split)
        except FieldError:
            raise
        except Exception as exc:  # offline, no such dataset or config, no such split
            field = "dataset.split" if "split" in str(exc).lower() and "unknown" in str(exc).lower() else "dataset.hub"
            raise ValueError(
                f"{field}: the hub dataset {ref.hub!r} (config {ref.config!r}, split {ref.split!r}) could not be "
                f"loaded: {type(exc).__name__}: {exc}"
            ) from None
    else:
        if getattr(ref, "format", "fields") == "messages":
            return _message_rows(ref, name, limit or ref.limit)
        if getattr(ref, "format", "fields") == "items":
            return _item_rows(ref, name, limit or ref.limit)
        rows = _load_rows(*load_args("", "train", None, ref.path))
    for field in ("question_field", "answer_field"):
        if getattr(ref, field) not in rows.column_names:
            raise ValueError(
                f"dataset.{field}: {name} has no field {getattr(ref, field)!r}; it has {rows.column_names}: "
                f"set {field} to one of them"
            )
    limit = limit or ref.limit
    if limit is not None:
        rows = rows.select(range(min(limit, len(rows))))
    out = []
    for i, row in enumerate(rows):
        gold = str(row[ref.answer_field])
        if "####" in gold:
            gold = gsm8k_gold(gold)
        out.append(Problem(index=i, question=str(row[ref.question_field]), gold=gold))
    return out


def _message_rows(ref: Any, name: str, limit: int | None) -> list[Problem]:
    """OpenAI's fine-tuning JSONL (mathrl/jsonl_files.py): each line's `messages` are the prompt
    (meta['messages'], its last user message the question; a last assistant message is the
    supervised target, `solution`), its other fields the grader's `item` (meta['item']), its
    `answer_field`, if it has one, the gold answer. Read as JSON lines, not
    through `datasets`: the item fields may differ in type from line to line."""
    import json

    from mathrl.jsonl_files import check_line, text_of

    out: list[Problem] = []
    with open(ref.path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            obj = json.loads(line)
            bad = check_line(obj)
            if bad:
                raise ValueError(f"dataset: {name} line {n}: {bad[0][0]}: {bad[0][1]}")
            # OpenAI's newer name for the system message: the chat templates know only `system`
            # (Qwen's drop a `developer` message), and a chat call maps it so (mathrl/specs/generate.py)
            messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in obj["messages"]]
            solution = None
            if messages[-1]["role"] == "assistant":  # a supervised line: the last message is the target
                solution, messages = text_of(messages[-1]["content"]), messages[:-1]
            if not messages or messages[-1]["role"] != "user":
                raise ValueError(
                    f"dataset: {name} line {n}: the prompt's messages end with the user's message, not "
                    f"{messages[-1]['role'] if messages else 'nothing'!r}"
                )
            item = {k: v for k, v in obj.items() if k != "messages"}
            gold = item.get(ref.answer_field)
            out.append(
                Problem(
                    index=len(out),
                    question=text_of(messages[-1]["content"]),
                    gold="" if gold is None else str(gold),
                    meta={"messages": messages, "item": item},
                    solution=solution,
                )
            )
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise ValueError(f"dataset: {name} has no lines")
    return out


def _item_rows(ref: Any, name: str, limit: int | None) -> list[Problem]:
    """OpenAI's evals JSONL: a line per item, `{"item": {...}}` (a `sample` beside it is ignored:
    this run generates its own), or the item's fields alone. The prompt is `ref.template` filled
    from the item, or the messages the item holds in `ref.messages_field` (a string there is one
    user message); the item is what graders' templates read as `item` (meta['item'])."""
    import json

    from mathrl import templates
    from mathrl.jsonl_files import check_item_line, item_of, text_of

    out: list[Problem] = []
    with open(ref.path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            obj = json.loads(line)
            if bad := check_item_line(obj):
                raise ValueError(f"dataset: {name} line {n}: {bad[0][0]}: {bad[0][1]}")
            item = item_of(obj)
            try:
                if ref.template is not None:
                    messages = [
                        {"role": m.role, "content": templates.render(m.content, {}, item)} for m in ref.template
                    ]
                else:
                    held = templates.lookup(f"item.{ref.messages_field}", {}, item)
                    messages = [{"role": "user", "content": held}] if isinstance(held, str) else held
                    messages = [{"role": m["role"], "content": text_of(m["content"])} for m in messages]
            except (templates.TemplateError, KeyError, TypeError) as e:
                raise ValueError(f"dataset: {name} line {n}: the prompt could not be made from the item: {e}") from None
            # OpenAI's newer name for the system message, as in _message_rows
            messages = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
            gold = item.get(ref.answer_field)
            out.append(
                Problem(
                    index=len(out),
                    question=messages[-1]["content"],
                    gold="" if gold is None else str(gold),
                    meta={"messages": messages, "item": item},
                )
            )
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise ValueError(f"dataset: {name} has no lines")
    return out
