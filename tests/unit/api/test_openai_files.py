"""POST /v1/files and the rest of OpenAI's files API through the real `openai` package: upload,
list, retrieve, content, delete; a bad line is a 422 naming the line and the field and stores
nothing; another project sees none of it; the size and count limits (api/routers/openai_files.py)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from tests.helpers.api import admin_key, db, private_app_client

pytestmark = pytest.mark.quick

# a database of the module's own: a suite worker's reconciler (the `service` fixture's, on the session's
# database) deletes expired files each round, and took the expiry test's file before its own round did
app_client = private_app_client()


def _client(app_client: Any) -> Any:
    from openai import OpenAI

    key = admin_key(app_client)["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url=f"{app_client.base_url}/v1", api_key=key, http_client=app_client, max_retries=0)


def rft_jsonl(n: int) -> bytes:
    lines = [
        {"messages": [{"role": "user", "content": f"What is {a} + {a + 1}?"}], "reference_answer": str(2 * a + 1)}
        for a in range(n)
    ]
    return "".join(json.dumps(x) + "\n" for x in lines).encode()


def test_upload_list_retrieve_content_delete(app_client: Any) -> None:
    client = _client(app_client)
    data = rft_jsonl(5)
    f = client.files.create(file=("train.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert f.object == "file" and f.id.startswith("file-") and f.bytes == len(data) and f.filename == "train.jsonl"
    assert f.purpose == "fine-tune" and f.status == "processed"
    second = client.files.create(file=("val.jsonl", io.BytesIO(rft_jsonl(2))), purpose="fine-tune")
    listed = client.files.list()
    assert [x.id for x in listed.data] == [second.id, f.id]  # newest first
    assert [x.id for x in client.files.list(order="asc", limit=1)] == [f.id, second.id]  # the SDK pages on
    assert client.files.retrieve(f.id).bytes == len(data)
    assert client.files.content(f.id).content == data
    # another project sees none of it
    other = _client(app_client)
    assert other.files.list().data == []
    import openai

    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(f.id)
    deleted = client.files.delete(f.id)
    assert deleted.deleted and deleted.id == f.id
    assert [x.id for x in client.files.list().data] == [second.id]
    with pytest.raises(openai.NotFoundError):
        client.files.content(f.id)


def test_a_bad_line_names_the_line_and_field_and_stores_nothing(app_client: Any) -> None:
    import openai

    client = _client(app_client)
    bad = rft_jsonl(3) + b'{"messages": [{"role": "robot", "content": "hi"}]}\n' + b"not json\n"
    with pytest.raises(openai.BadRequestError) as e:
        client.files.create(file=("bad.jsonl", io.BytesIO(bad)), purpose="fine-tune")
    body = e.value.body
    assert "line 4: messages[0].role: 'robot' is not one of" in body["message"], body
    r = e.value.response.json()
    assert [x["pointer"] for x in r["errors"]] == ["/file/line/4/messages[0].role", "/file/line/5"]
    assert client.files.list().data == []
    with pytest.raises(openai.BadRequestError, match="not a purpose"):
        client.files.create(file=("x.jsonl", io.BytesIO(rft_jsonl(1))), purpose="assistants")
    with pytest.raises(openai.BadRequestError, match="no lines"):
        client.files.create(file=("empty.jsonl", io.BytesIO(b"\n")), purpose="fine-tune")


def test_line_and_paragraph_separators_inside_strings_are_text_and_deep_nesting_a_line_error(app_client: Any) -> None:
    """U+2028, U+2029 and U+0085 may stand raw in a JSON string (json.dumps(ensure_ascii=False)
    writes them); the check split lines at them and refused valid files. A line of 100,000 '['
    raised RecursionError: a 500."""
    import openai

    client = _client(app_client)
    row = {"messages": [{"role": "user", "content": "a\u2028b\u2029c\u0085d: 1 + 1?"}], "reference_answer": "2"}
    data = (json.dumps(row, ensure_ascii=False) + "\r\n").encode() * 2
    f = client.files.create(file=("seps.jsonl", io.BytesIO(data)), purpose="fine-tune")
    assert f.status == "processed" and client.files.content(f.id).content == data
    old_mac = (json.dumps(row) + "\r").encode() * 3  # bare '\r' ends a line, as the worker reads the file
    assert client.files.create(file=("cr.jsonl", io.BytesIO(old_mac)), purpose="fine-tune").bytes == len(old_mac)
    with pytest.raises(openai.BadRequestError, match="line 2: not JSON this server reads: it nests too deeply"):
        client.files.create(file=("deep.jsonl", io.BytesIO(rft_jsonl(1) + b"[" * 100_000 + b"\n")), purpose="fine-tune")


def test_checking_a_file_holds_one_line_at_a_time() -> None:
    """The check split the whole text into a list first: a 64 MB upload of short lines took about
    30 times its size in the API's memory (over a 1 GiB pod), before the line limit was reached.
    A file of newlines counts toward the limit too."""
    import tracemalloc

    from mathrl.jsonl_files import FileFormatError, check_jsonl

    line = json.dumps({"messages": [{"role": "user", "content": "1?"}]}).encode() + b"\n"
    data = line * (2 * 2**20 // len(line))
    tracemalloc.start()
    try:
        assert check_jsonl(data, 1_000_000).lines == data.count(b"\n")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * len(data), f"{peak} bytes at the peak for a file of {len(data)}"  # its text, once
    with pytest.raises(FileFormatError, match="over 1000 lines"):
        check_jsonl(b"\n" * 5000 + line, 1000)


def test_a_supervised_line_is_what_the_trainer_learns_from(app_client: Any) -> None:
    """A line counted as supervised when any message was the assistant's; the trainer learns the last
    message, the assistant's answer to a user message, so [user, assistant, user] passed the upload
    and the create, then failed on the worker."""
    import openai

    client = _client(app_client)
    turns = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]
    good = json.dumps({"messages": turns}) + "\n"
    for bad in (turns + [{"role": "user", "content": "and 2 + 2?"}], [{"role": "system", "content": "Hi."}, turns[1]]):
        data = (good + json.dumps({"messages": bad}) + "\n").encode()
        f = client.files.create(file=("mixed.jsonl", io.BytesIO(data)), purpose="fine-tune")
        with pytest.raises(openai.BadRequestError, match="1 of its 2 lines do not end with a user message") as e:
            client.fine_tuning.jobs.create(model="org/model", training_file=f.id)
        assert e.value.param == "training_file", e.value.body
    f = client.files.create(file=("multi.jsonl", io.BytesIO((good * 2).encode())), purpose="fine-tune")
    client.fine_tuning.jobs.cancel(client.fine_tuning.jobs.create(model="org/model", training_file=f.id).id)
    # OpenAI's per-message weight: 0 on the message a line teaches here (its last) taught it anyway
    unweighted = json.dumps({"messages": [turns[0], {**turns[1], "weight": 0}]}) + "\n"
    with pytest.raises(openai.BadRequestError, match=r"line 1.*messages\[1\]\.weight.*0 on the message this line"):
        client.files.create(file=("w.jsonl", io.BytesIO(unweighted.encode())), purpose="fine-tune")
    weighted = json.dumps({"messages": [turns[0], {**turns[1], "weight": 1}]}) + "\n"
    assert client.files.create(file=("w.jsonl", io.BytesIO(weighted.encode())), purpose="fine-tune").bytes


def test_a_file_a_job_still_needs_is_not_deleted(app_client: Any) -> None:
    """Its worker reads it when the job starts, is retried or resumed: deleted under a queued job,
    the job failed later with 'not a file of this project any more'."""
    import openai

    from tests.helpers.jobs import parked_grpo

    client = _client(app_client)
    f = client.files.create(file=("train.jsonl", io.BytesIO(rft_jsonl(4))), purpose="fine-tune")
    headers = {"Authorization": f"Bearer {client.api_key}"}
    job = app_client.post("/v1/jobs", json=parked_grpo(dataset={"file": f.id}), headers=headers)
    assert job.status_code == 201, job.text
    with pytest.raises(openai.ConflictError, match="read by 1 job"):
        client.files.delete(f.id)
    assert client.files.content(f.id).content == rft_jsonl(4)  # nothing lost
    app_client.post(f"/v1/jobs/{job.json()['id']}/cancel", headers=headers)
    # a running job whose cancel was asked is never retried or resumed: it reads the file no more. Before,
    # a script that cancelled (OpenAI's cancel answers 'cancelled' at once) and then deleted got a 409
    running = app_client.post("/v1/jobs", json=parked_grpo(dataset={"file": f.id}), headers=headers).json()["id"]
    with db(app_client).begin() as c:
        c.execute(text("UPDATE jobs SET status = 'running' WHERE id = :i"), {"i": running})
    with pytest.raises(openai.ConflictError, match="read by 1 job"):
        client.files.delete(f.id)
    cancelled = app_client.post(f"/v1/jobs/{running}/cancel", headers=headers).json()
    assert cancelled["status"] == "running" and cancelled["cancel_requested"], cancelled
    assert client.files.delete(f.id).deleted


def test_file_limits(app_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import openai

    from config.settings import get_settings

    client = _client(app_client)
    files = get_settings().files
    monkeypatch.setattr(files, "max_project_files", 1)
    client.files.create(file=("a.jsonl", io.BytesIO(rft_jsonl(1))), purpose="fine-tune")
    with pytest.raises(openai.RateLimitError, match="stores 1 files"):
        client.files.create(file=("b.jsonl", io.BytesIO(rft_jsonl(1))), purpose="fine-tune")
    monkeypatch.setattr(files, "max_project_files", 10)
    monkeypatch.setattr(files, "max_project_bytes", 2000)
    with pytest.raises(openai.APIStatusError, match="over its 2000") as e:
        client.files.create(file=("c.jsonl", io.BytesIO(rft_jsonl(40))), purpose="fine-tune")
    assert e.value.status_code == 413
    monkeypatch.setattr(files, "max_file_bytes", 1024)
    with pytest.raises(openai.APIStatusError, match="limit per file") as e:
        client.files.create(file=("d.jsonl", io.BytesIO(rft_jsonl(30))), purpose="fine-tune")
    assert e.value.status_code == 413
    assert len(client.files.list().data) == 1


def test_a_file_with_expires_after_goes_then_and_is_deleted_once_no_job_reads_it(app_client: Any) -> None:
    """OpenAI's `expires_after` was ignored: a script that set it to clean up after itself kept every
    upload until the project's file quota refused the next one."""
    import openai

    from config.settings import get_settings
    from store.db import session_scope
    from store.files import delete_expired
    from tests.helpers.jobs import parked_grpo

    client = _client(app_client)
    hour = {"anchor": "created_at", "seconds": 3600}
    f = client.files.create(file=("t.jsonl", io.BytesIO(rft_jsonl(3))), purpose="fine-tune", expires_after=hour)
    assert f.expires_at is not None and 3599 <= f.expires_at - f.created_at <= 3601, f
    assert client.files.create(file=("k.jsonl", io.BytesIO(rft_jsonl(3))), purpose="fine-tune").expires_at is None
    for bad, field in (
        ({"anchor": "created_at", "seconds": 60}, "seconds"),
        ({"anchor": "now", "seconds": 3600}, "anchor"),
    ):
        with pytest.raises(openai.BadRequestError, match=f"/expires_after/{field}"):
            client.files.create(file=("b.jsonl", io.BytesIO(rft_jsonl(1))), purpose="fine-tune", expires_after=bad)
    read = client.files.create(file=("r.jsonl", io.BytesIO(rft_jsonl(3))), purpose="fine-tune", expires_after=hour)
    headers = {"Authorization": f"Bearer {client.api_key}"}
    job = app_client.post("/v1/jobs", json=parked_grpo(dataset={"file": read.id}), headers=headers)
    assert job.status_code == 201, job.text
    with db(app_client).begin() as c:  # an hour on; the file the job reads expired first
        now = datetime.now(UTC)
        for file_id, ago in ((f.id, 60), (read.id, 120)):
            c.execute(
                text("UPDATE files SET expires_at = :t WHERE id = :i"),
                {"t": now - timedelta(minutes=ago), "i": file_id},
            )
    for gone in (f.id, read.id):  # gone to the API at once
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(gone)
        with pytest.raises(openai.NotFoundError):
            client.files.content(gone)
    assert f.id not in [x.id for x in client.files.list()] and read.id not in [x.id for x in client.files.list()]
    again = app_client.post("/v1/jobs", json=parked_grpo(dataset={"file": f.id}), headers=headers)
    assert again.status_code == 422 and "/dataset/file" in again.text, again.text
    url = get_settings().database.url
    with session_scope(url) as s:  # the reconciler's round: the file a queued job reads stays, and a
        assert delete_expired(s, limit=1) == [f.id]  # round's worth of them does not hold back the rest
    with db(app_client).connect() as c:  # closed: a connection left to the garbage collector logs an error
        # when it is collected after the database has gone, inside whatever runs then
        kept = dict(c.execute(text("SELECT id, path FROM files WHERE id IN (:a, :b)"), {"a": f.id, "b": read.id}).all())
    assert list(kept) == [read.id] and Path(kept[read.id]).exists()
    app_client.post(f"/v1/jobs/{job.json()['id']}/cancel", headers=headers)
    with session_scope(url) as s:
        assert delete_expired(s) == [read.id]
    assert not Path(kept[read.id]).exists()


def test_a_nul_character_in_a_line_is_refused_at_upload_naming_the_line_and_field(app_client: Any) -> None:
    """Issue 66.3: an upload holding "2+2?\\u0000" was accepted; every eval, eval run or batch over it
    did all its work and then failed writing its results, its error showing the SQL and its parameters."""
    import openai

    client = _client(app_client)
    evals = b'{"item": {"question": "1+1?"}}\n{"item": {"question": "2+2?\\u0000", "answer": "4"}}\n'
    chats = rft_jsonl(1) + b'{"messages": [{"role": "user", "content": "hi\\u0000"}], "reference_answer": "x"}\n'
    for purpose, data, pointer in (
        ("evals", evals, "/file/line/2/item.question"),
        ("fine-tune", chats, "/file/line/2/messages[0].content"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            client.files.create(file=("nul.jsonl", io.BytesIO(data)), purpose=purpose)
        r = e.value.response.json()
        assert r["errors"][0]["pointer"] == pointer and "NUL" in r["errors"][0]["detail"], r
    assert client.files.list().data == []
