"""What an uploaded file must hold (POST /v1/files): JSONL checked line by line at upload
(`check_jsonl`), with errors that name the line and the field.

A 'fine-tune' file is in OpenAI's fine-tuning formats (`check_line`): every line a JSON object with
`messages`, a non-empty list of {role, content} (ROLES; content a string or text parts); other
fields are kept for its grader. What it can train is recorded (`FileStats`): supervised (every line
ends with an assistant message answering a user message) or reinforcement (every line's messages end
with a user message). An evals file's lines are items (`check_item_line`), a batch's requests
(`check_batch_line`). docs/openai-rft.md, "What each route is here"."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from mathrl.errors import UNSTORABLE, nul_pointer
from mathrl.errors import FileFormatError as FileFormatError  # raised here; its callers import it from here

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_ERRORS = 10  # errors reported per upload


@dataclass
class FileStats:
    lines: int = 0
    supervised: int = 0  # lines whose messages end with a user message and the assistant's answer
    reinforcement: int = 0  # lines whose messages end with a user message
    fields: list[str] = field(default_factory=list)  # item fields besides messages, in the first line

    def record(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "supervised_lines": self.supervised,
            "reinforcement_lines": self.reinforcement,
            "fields": self.fields,
        }


def _content_ok(content: Any) -> bool:
    if isinstance(content, str):
        return True
    return (
        isinstance(content, list)
        and bool(content)
        and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content)
    )


def check_line(obj: Any) -> list[tuple[str, str]]:
    """(field, what is wrong) for one line's object; empty when it is valid."""
    if not isinstance(obj, dict):
        return [("", f"a line is a JSON object, not {type(obj).__name__}")]
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        return [("messages", "a non-empty list of {role, content} is required")]
    errors = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            errors.append((f"messages[{i}]", "a message is an object {role, content}"))
            continue
        if m.get("role") not in ROLES:
            errors.append((f"messages[{i}].role", f"{m.get('role')!r} is not one of {', '.join(ROLES)}"))
        if m.get("role") != "tool" and not _content_ok(m.get("content")):
            errors.append((f"messages[{i}].content", "a string, or a list of {type: text, text} parts"))
        if "weight" in m and m["weight"] not in (0, 1):
            errors.append((f"messages[{i}].weight", "0 or 1 (OpenAI's: whether the message is learned)"))
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") == "assistant" and last.get("weight") == 0:
        # the last assistant message is the one a supervised line teaches here: weight 0 would teach nothing
        errors.append((f"messages[{len(messages) - 1}].weight", "0 on the message this line teaches: drop the line"))
    return errors


def item_of(obj: Any) -> Any:
    """An evals line's item: `{"item": {...}}` (with a `sample` beside it or not), or the line itself."""
    if isinstance(obj, dict) and isinstance(obj.get("item"), dict) and set(obj) <= {"item", "sample"}:
        return obj["item"]
    return obj


def check_item_line(obj: Any) -> list[tuple[str, str]]:
    """An evals file's line (OpenAI's purpose 'evals'): an object, its item an object."""
    if not isinstance(obj, dict):
        return [("", f'a line is a JSON object, {{"item": {{...}}}}, not {type(obj).__name__}')]
    if "item" in obj and not isinstance(obj["item"], dict):
        return [("item", "the item is a JSON object of its fields")]
    if "sample" in obj and not isinstance(obj["sample"], dict):
        return [("sample", "the sample is a JSON object, {output_text, ...}")]
    return []


BATCH_PURPOSE = "batch"  # OpenAI's Batch API input: a request per line
BATCH_URLS = ("/v1/chat/completions", "/v1/completions")  # what a batch's lines may ask here


def check_batch_line(obj: Any) -> list[tuple[str, str]]:
    """A batch file's line (OpenAI's purpose 'batch'): {custom_id, method: POST, url, body}, the
    url one this server answers in a batch and the body an object naming its model. The body's
    other fields are checked against its route's when the batch is created (api/routers/openai_batches.py)."""
    if not isinstance(obj, dict):
        return [("", f"a line is a JSON object, not {type(obj).__name__}")]
    errors: list[tuple[str, str]] = []
    custom = obj.get("custom_id")
    if not isinstance(custom, str) or not custom or len(custom) > 512:
        errors.append(("custom_id", "a string of 1 to 512 characters, unique in the file, is required"))
    if obj.get("method") != "POST":
        errors.append(("method", "must be 'POST'"))
    if obj.get("url") not in BATCH_URLS:
        served = ", ".join(BATCH_URLS)
        errors.append(("url", f"{obj.get('url')!r} is not answered in a batch here: use one of {served}"))
    body = obj.get("body")
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        errors.append(("body", "an object with the request's fields, its model among them, is required"))
    unknown = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if unknown:
        errors.append((unknown[0], "unknown field: a line holds custom_id, method, url and body"))
    return errors


def text_of(content: Any) -> str:
    """A message's content as one string (text parts joined)."""
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content)


def _lines(text: str) -> Iterator[str]:
    """The text's lines, one at a time: a list of them all (re.split) took 21 times the file's size for
    a file of '{}' lines (tracemalloc), before the line limit was reached."""
    start = 0
    for end in _LINE_END.finditer(text):
        yield text[start : end.start()]
        start = end.end()
    yield text[start:]


def _dotted(pointer: str) -> str:
    """A JSON pointer as this module names fields: /messages/0/content is messages[0].content."""
    out = ""
    for part in pointer.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        out += f"[{part}]" if part.isdigit() else f".{part}" if out else part
    return out


_LINE_END = re.compile(r"\r\n|\r|\n")


def check_jsonl(data: bytes, max_lines: int, items: bool = False, batch: bool = False) -> FileStats:
    """The file's stats, or FileFormatError naming each bad line (the first MAX_ERRORS). `items`: an
    evals file (check_item_line); `batch`: a batch's requests (check_batch_line, custom_ids unique);
    else fine-tuning chats (check_line)."""
    seen: set[str] = set()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileFormatError([(1, "", f"the file is not UTF-8 (byte {e.start})")]) from None
    stats = FileStats()
    errors: list[tuple[int, str, str]] = []
    # lines end at '\r\n', '\r' or '\n' (as the worker reads the file: Python's text mode), which JSON
    # strings hold only escaped; not at U+2028, U+2029 or U+0085, where str.splitlines also splits and
    # which JSON strings may hold raw (json.dumps(..., ensure_ascii=False) writes them)
    for n, line in enumerate(_lines(text), start=1):
        if n > max_lines:  # blank lines too: a file of newlines is as many lines to read
            raise FileFormatError([(n, "", f"the file has over {max_lines} lines (the limit per file)")])
        if not line.strip():
            continue
        stats.lines += 1
        if stats.lines > max_lines:
            raise FileFormatError([(n, "", f"the file has over {max_lines} lines (the limit per file)")])
        try:
            obj = json.loads(line)
        except ValueError as e:
            errors.append((n, "", f"not JSON: {e}"))
        except RecursionError:
            errors.append((n, "", "not JSON this server reads: it nests too deeply"))
        else:
            bad = check_item_line(obj) if items else check_batch_line(obj) if batch else check_line(obj)
            if (nul := nul_pointer(obj)) is not None:  # the store refuses it where a job writes what it read
                bad = [(_dotted(nul), UNSTORABLE), *bad]
            if not bad and batch and obj["custom_id"] in seen:
                bad = [("custom_id", f"{obj['custom_id']!r} is another line's: each request's is its own")]
            errors.extend((n, f, what) for f, what in bad)
            if batch:
                if not bad:
                    seen.add(obj["custom_id"])
            elif not bad and items:
                if stats.lines == 1:
                    stats.fields = sorted(item_of(obj))
            elif not bad:
                roles = [m["role"] for m in obj["messages"]]
                stats.supervised += roles[-2:] == ["user", "assistant"]
                stats.reinforcement += roles[-1] == "user"
                if stats.lines == 1:
                    stats.fields = sorted(k for k in obj if k != "messages")
        if len(errors) >= MAX_ERRORS:
            break
    if errors:
        raise FileFormatError(errors[:MAX_ERRORS])
    if stats.lines == 0:
        raise FileFormatError([(1, "", "the file has no lines")])
    return stats
