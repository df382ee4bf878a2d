"""Template strings of OpenAI's grader JSON: `{{sample.output_text}}`, `{{sample.output_json.a.b}}`
and `{{item.<field>.<field>}}`, where `sample` is the model's completion and `item` the dataset row
(the training file's line, or the `item` of a graders run).

`check` validates a template when a grader is parsed (an unknown namespace or sample field is a
422); `render` fills it per completion and raises TemplateError (invalid_variable_error) for a
field the item or the output JSON lacks."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from mathrl.errors import TemplateError as TemplateError  # raised here; its callers import it from here

# no lazy group between \s* runs: on '{{' and spaces with no '}}' that backtracked in cubic time (4,000
# characters: 34 s, in request validation); the name is stripped where it is read
VARIABLE = re.compile(r"\{\{([^{}]*)\}\}")
_PATH = re.compile(r"^(sample|item)((?:\.[A-Za-z0-9_\-]+)*)$")
SAMPLE_FIELDS = ("output_text", "output_json")


def variables(template: str) -> list[str]:
    return [name.strip() for name in VARIABLE.findall(template)]


def check(template: str) -> None:
    """Raise TemplateError for a variable outside `sample.output_text`, `sample.output_json...`
    and `item...`."""
    for var in variables(template):
        m = _PATH.match(var)
        if m is None:
            raise TemplateError(
                f"{{{{{var}}}}}: a variable is sample.output_text, sample.output_json.<path> or item.<path>"
            )
        parts = [p for p in m.group(2).split(".") if p]
        if m.group(1) == "sample" and (not parts or parts[0] not in SAMPLE_FIELDS):
            raise TemplateError(f"{{{{{var}}}}}: the sample has {', '.join(SAMPLE_FIELDS)}")
        if m.group(1) == "sample" and parts[0] == "output_text" and len(parts) > 1:
            raise TemplateError(f"{{{{{var}}}}}: output_text is a string, with no fields")


def sample_namespace(output_text: str) -> dict[str, Any]:
    """`sample` for a completion: its text, and its JSON when it parses as JSON (else None)."""
    try:
        output_json = json.loads(output_text)
    except (ValueError, RecursionError):
        output_json = None
    return {"output_text": output_text, "output_json": output_json}


def lookup(var: str, sample: Mapping[str, Any], item: Mapping[str, Any]) -> Any:
    m = _PATH.match(var)
    if m is None:
        raise TemplateError(f"{{{{{var}}}}} is not a variable")
    value: Any = sample if m.group(1) == "sample" else item
    for part in (p for p in m.group(2).split(".") if p):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise TemplateError(f"{{{{{var}}}}}: {m.group(1)} has no {part!r}")
    return value


def render(template: str, sample: Mapping[str, Any], item: Mapping[str, Any]) -> str:
    """The template with every variable replaced: strings as they are, other values as JSON."""

    def one(m: re.Match[str]) -> str:
        value = lookup(m.group(1).strip(), sample, item)
        return value if isinstance(value, str) else json.dumps(value)

    return VARIABLE.sub(one, template)
