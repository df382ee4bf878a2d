"""What jobs read and how they sample: datasets (registered, user files, hub) and sampling settings."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from mathrl import templates
from mathrl.errors import FieldError
from mathrl.fileref import FileRef
from mathrl.modelref import is_hub_id
from mathrl.specs.base import MAX_SEED, StrictModel
from mathrl.specs.refs import HoldsAFile

DEFAULT_MAX_NEW_TOKENS = 512


class Sampling(StrictModel):
    temperature: float = Field(0.0, ge=0.0, le=5.0, description="0 means greedy decoding.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        le=32768,
        description="Completion length limit in tokens; unset: an eval recipe's default, "
        f"else {DEFAULT_MAX_NEW_TOKENS}.",
    )
    n: int = Field(1, ge=1, le=1024, description="Samples per problem (pass@k and maj@k need n >= k).")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="Sampling seed (0 to 2**32 - 1).")

    @model_validator(mode="after")
    def _greedy_single(self) -> Sampling:
        if self.temperature == 0.0 and self.n > 1:
            raise FieldError("n", "n > 1 needs temperature > 0: greedy decoding gives n identical samples")
        return self


class PromptMessage(StrictModel):
    """A chat message of a prompt template (format 'items'); `content` may hold '{{item.<field>}}'."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str = Field(..., max_length=100_000)
    type: Literal["message"] | None = Field(None, description="OpenAI's message type: accepted, always 'message'.")

    @model_validator(mode="after")
    def _template(self) -> PromptMessage:
        try:
            templates.check(self.content)
        except templates.TemplateError as e:
            raise FieldError("content", str(e)) from None
        if any(v.strip().startswith("sample") for v in templates.variables(self.content)):
            raise FieldError("content", "a prompt is written before the sample: use only '{{item.<field>}}' here")
        return self


class DatasetRef(HoldsAFile):
    """Training or evaluation questions: a registered benchmark/split, a user file or URL, or a
    dataset on the Hugging Face hub."""

    name: str | None = Field(None, max_length=128, description="Registered dataset, e.g. 'gsm8k' or 'math'.")
    split: str = Field("train", max_length=32, description="Split of the registered dataset or of the hub dataset.")
    path: str | None = Field(
        None, max_length=1024, description="A jsonl/parquet file under a configured data root, or an allowed URL."
    )
    hub: str | None = Field(
        None,
        max_length=256,
        description="A hub dataset id ('org/name'), loaded by the worker with datasets.load_dataset(hub, config, "
        "split=split); the API does not fetch it (the worker checks it, and its fields, before any work).",
        examples=["openai/gsm8k"],
    )
    config: str | None = Field(None, max_length=64, description="The hub dataset's configuration, e.g. 'main'.")
    file: FileRef | None = Field(
        None, description="A file uploaded to this project (POST /v1/files), by its id: resolved by the worker."
    )
    format: Literal["fields", "messages", "items"] = Field(
        "fields",
        description="'fields': a question and an answer field per row; 'messages': OpenAI's fine-tuning JSONL, the "
        "chat `messages` as the prompt (rendered with the model's chat template) and every other field kept for "
        "graders' templates ('{{item.<field>}}'); answer_field, if a row has it, is the gold answer. 'items': "
        "OpenAI's evals JSONL, a line per item ({\"item\": {...}}, or the item's fields alone), its prompt the "
        "`template` filled from the item, or the messages in its `messages_field`.",
    )
    template: list[PromptMessage] | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="format 'items': the prompt's chat messages, each content a template over the item "
        "('{{item.<field>}}'), as an OpenAI eval run's input_messages.",
    )
    messages_field: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[A-Za-z0-9_\-]+$",
        description="format 'items': the item's field that holds the prompt (its messages, or a string: one user "
        "message), as an OpenAI eval run's item_reference.",
    )
    question_field: str = Field(
        "question", max_length=64, description="Field holding the question (user files, hub datasets)."
    )
    answer_field: str = Field(
        "answer", max_length=64, description="Field holding the gold answer (user files, hub datasets)."
    )
    limit: int | None = Field(None, ge=1, le=100_000_000, description="Use only the first N rows (at most 10^8).")

    def at_local_path(self, path: str) -> Self:
        """An uploaded file is read as a file under `path` is: the loaders read `path`."""
        return self.model_copy(update={"path": path})

    @model_validator(mode="after")
    def _one_source(self) -> DatasetRef:
        if sum(x is not None for x in (self.name, self.path, self.hub, self.file)) != 1:
            raise FieldError(
                "name",
                "give exactly one of 'name' (a registered dataset), 'path' (a user file or URL), 'hub' (a hub id) "
                "or 'file' (an uploaded file's id)",
            )
        if self.format in ("messages", "items") and self.name is not None:
            raise FieldError("format", f"{self.format!r} is for a user's file (path or file), not a registered dataset")
        if self.format == "items" and (self.template is None) == (self.messages_field is None):
            raise FieldError("template", "format 'items' needs the prompt: give 'template' or 'messages_field', one")
        if self.format != "items" and (self.template is not None or self.messages_field is not None):
            raise FieldError("template", "'template' and 'messages_field' are for format 'items': remove them")
        if self.hub is not None and (self.hub.startswith(("/", ".", "~")) or not is_hub_id(self.hub)):
            raise FieldError("hub", f"{self.hub!r} is not a hub dataset id: write 'org/name' (a file goes in 'path')")
        if self.config is not None and self.hub is None:
            raise FieldError("config", "'config' is for a hub dataset: remove it or give 'hub'")
        return self
