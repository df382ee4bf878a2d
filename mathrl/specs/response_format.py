"""Structured outputs: OpenAI's `response_format` (a chat, a batch's chat lines; the Responses API's
`text.format` is the same, flattened) as a generate job holds it, and the JSON Schema features served.
A job held to one decodes only text the schema admits (evaluator/structured.py on transformers, the
warm vLLM engine's own guided decoding). A schema that uses a feature not served is refused here, at
submit, as OpenAI refuses it ("Invalid schema for response_format ..."), naming where it stands."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from mathrl.errors import FieldError
from mathrl.specs.base import StrictModel

# OpenAI's bounds on a strict schema (its "Supported schemas" guide)
MAX_DEPTH = 10  # nested objects
MAX_PROPERTIES = 5000
MAX_ENUM_VALUES = 1000
SCHEMA_BYTES = 100_000  # a schema's JSON text, at most

# what every schema may say: its types, and what does not constrain the text (titles, descriptions)
_NOTES = {"title", "description", "default", "examples", "$comment", "$schema", "$id"}
_STRICT = {
    "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "$ref", "$defs",
    "definitions", "pattern", "format", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "minItems", "maxItems",
} | _NOTES  # fmt: skip
# without strict, OpenAI's best effort: these also hold (the constrained decoders serve them)
_LOOSE = _STRICT | {"minLength", "maxLength", "prefixItems", "oneOf"}
# the string formats OpenAI's strict schemas take
FORMATS = ("date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid")
TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")
_SUBSCHEMAS = ("properties", "$defs", "definitions")  # keyword -> {name: schema}


class JsonSchema(StrictModel):
    model_config = ConfigDict(**StrictModel.model_config, serialize_by_alias=True)

    name: str = Field(..., pattern=r"^[a-zA-Z0-9_-]{1,64}$", description="The format's name (letters, digits, _ -).")
    description: str | None = Field(None, max_length=10_000, description="What the format is for.")
    # `schema` is a name BaseModel keeps: the field is `schema_`, read and written as 'schema'
    schema_: dict[str, Any] = Field(
        ..., alias="schema", max_length=64, description="A JSON Schema the answer must satisfy (its keywords)."
    )
    strict: bool | None = Field(
        False, description="OpenAI's strict mode: every object closed and every property required, as it checks."
    )


class ResponseFormat(StrictModel):
    """`{"type": "text"}`, `{"type": "json_object"}` (any JSON object) or
    `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`."""

    type: Literal["text", "json_object", "json_schema"] = Field(..., description="What the answer must be.")
    json_schema: JsonSchema | None = Field(None, description="With type json_schema: the schema.")

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise FieldError("json_schema", "give json_schema with type 'json_schema' (and only then)")
        if self.json_schema is not None:
            check_schema(self.json_schema.name, self.json_schema.schema_, bool(self.json_schema.strict))
        return self

    def constrains(self) -> bool:
        return self.type != "text"

    def target(self) -> dict[str, Any]:
        """The JSON Schema the answer is held to (json_object: any object)."""
        return self.json_schema.schema_ if self.json_schema is not None else {"type": "object"}


def check_schema(name: str, schema: dict[str, Any], strict: bool) -> None:
    """Raise FieldError (at json_schema/schema/...) where `schema` uses what is not served: a keyword
    outside OpenAI's supported list, an external $ref, or, with `strict`, what OpenAI's strict mode
    refuses (an object not closed, a property not required, a root that is not an object)."""
    import json

    if len(json.dumps(schema)) > SCHEMA_BYTES:
        raise FieldError("json_schema/schema", f"the schema is over {SCHEMA_BYTES:,} bytes of JSON: make it smaller")
    counts = {"properties": 0, "enum": 0}

    def refuse(path: tuple[str, ...], why: str) -> None:
        where = "/".join(("json_schema", "schema", *path))
        raise FieldError(where, f"Invalid schema for response_format '{name}': In context={path!r}, {why}")

    def walk(node: Any, path: tuple[str, ...], depth: int) -> None:
        if not isinstance(node, dict):
            if isinstance(node, bool) and not strict:
                return  # true / false: any value, no value
            refuse(path, "a schema is a JSON object")
        allowed = _STRICT if strict else _LOOSE
        for key in node:
            if key not in allowed:
                refuse(path, f"'{key}' is not permitted. Supported keywords: {', '.join(sorted(allowed - _NOTES))}.")
        kinds = node.get("type")
        for t in kinds if isinstance(kinds, list) else [kinds] if kinds is not None else []:
            if t not in TYPES:
                refuse(path, f"type {t!r} is not a JSON Schema type: use one of {', '.join(TYPES)}")
        if "format" in node and node["format"] not in FORMATS:
            refuse(path, f"format {node['format']!r} is not supported: use one of {', '.join(FORMATS)}")
        if "pattern" in node:
            _check_pattern(node["pattern"], lambda why: refuse((*path, "pattern"), why))
        ref = node.get("$ref")
        if ref is not None and not (
            isinstance(ref, str) and (ref == "#" or ref.startswith(("#/$defs/", "#/definitions/")))
        ):
            refuse(path, f"$ref {ref!r} is not permitted: only references inside the schema (#/$defs/...)")
        if "enum" in node:
            if not isinstance(node["enum"], list) or not node["enum"]:
                refuse(path, "'enum' is a list of at least one value")
            counts["enum"] += len(node["enum"])
            if counts["enum"] > MAX_ENUM_VALUES:
                refuse(path, f"more than {MAX_ENUM_VALUES} enum values in all")
        is_object = kinds == "object" or (isinstance(kinds, list) and "object" in kinds) or "properties" in node
        if is_object:
            depth += 1
            if depth > MAX_DEPTH:
                refuse(path, f"objects nest at most {MAX_DEPTH} deep")
            props = node.get("properties") or {}
            if not isinstance(props, dict):
                refuse(path, "'properties' is an object of schemas")
            counts["properties"] += len(props)
            if counts["properties"] > MAX_PROPERTIES:
                refuse(path, f"more than {MAX_PROPERTIES} properties in all")
            if strict:
                if node.get("additionalProperties") is not False:
                    refuse(path, "'additionalProperties' is required to be supplied and to be false")
                missing = [k for k in props if k not in (node.get("required") or [])]
                if missing or not isinstance(node.get("required", []), list):
                    refuse(
                        path,
                        "'required' is required to be supplied and to be an array including every key in "
                        f"properties. Missing {', '.join(repr(k) for k in missing)}",
                    )
        if not path and strict and (kinds != "object" or "anyOf" in node):
            refuse(path, "the root schema must be an object ('type': 'object'), not anyOf")
        for key in _SUBSCHEMAS:
            for sub, child in (node.get(key) or {}).items():
                walk(child, (*path, key, sub), depth)
        for key in ("items", "additionalProperties"):
            if key in node and not isinstance(node[key], bool):
                walk(node[key], (*path, key), depth)
        for key in ("anyOf", "oneOf", "prefixItems"):
            if key in node:
                if not isinstance(node[key], list) or not node[key]:
                    refuse(path, f"'{key}' is a list of at least one schema")
                for i, child in enumerate(node[key]):
                    walk(child, (*path, key, str(i)), depth)

    walk(schema, (), 0)


def _check_pattern(pattern: Any, refuse: Any) -> None:
    """A pattern a constrained decoder runs: a string of at most 1,000 characters that compiles."""
    import re

    if not isinstance(pattern, str) or len(pattern) > 1000:
        refuse("'pattern' is a regular expression of at most 1000 characters")
    try:
        re.compile(pattern)
    except re.error as exc:
        refuse(f"'pattern' does not compile: {exc}")
