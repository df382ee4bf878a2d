"""The Tinker API (`/api/v1/...`), as the `tinker` SDK calls it: a view over mathrl's jobs, not a
second system.

A training client is a `session` job named `<session id>:train:<n>`; a sampling client on a base
model, or on a save whose job has ended, a `session` job named `<session id>:sample:<n>`. Every call
on a model or sampler, `retrieve_future` too, is forwarded to its job's process (its address and
token in the store's `endpoints` table). Saves are the job's checkpoints, their `tinker://` paths
looked up in the caller's project only. The SDK's key is `tml-` + a mathrl key (the prefix is
dropped here). docs/tinker.md; the wire protocol: docs/tinker-protocol.md."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from typing import Any

import httpx
from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError
from sqlalchemy import select

from api.deps import Caller, SettingsDep
from api.problems import Problem
from api.project_gates import ProjectGates
from api.submit import admit, check_job_refs, commit_and_dispatch, job_row
from api.tinker_common import (
    RESPONSES,
    Located,
    TinkerCaller,
    find_save,
    json_body,
    located,
    sessions_of,
)
from config.settings import Settings
from mathrl.protobuf import read_varint
from mathrl.specs import SessionSpec, model_refs
from mathrl.status import TERMINAL, WAIT_ENDS
from store.db import get_sessionmaker
from store.jobs import request_cancel
from store.models import Endpoint, Job

router = APIRouter(prefix="/api/v1", tags=["tinker"], responses=RESPONSES)
TOKEN_HEADER = "X-Mathrl-Session-Token"  # trainer/session_server.py checks it
CREATE_WAIT_SECONDS = 20.0  # a create_model future's long poll (the SDK's read timeout is 45 s)
FORWARD_TIMEOUT = httpx.Timeout(40.0, connect=5.0)
TAG = "tinker"
# Calls one project has in flight to its session processes (a retrieve_future long-polls for up to
# 20 s): past it a call waits up to FORWARD_WAIT_SECONDS for one of them to end, then is a 429 (the
# SDK retries). Before, every project's calls shared one pool of httpx's default 100 connections, and
# one tenant holding 100 long polls made every other project's calls wait 40 s and fail with 503.
FORWARDS_PER_PROJECT = 64
FORWARD_WAIT_SECONDS = 10.0
_forwards = ProjectGates(FORWARDS_PER_PROJECT)
_client: httpx.AsyncClient | None = None


def _http() -> httpx.AsyncClient:
    global _client
    if _client is None:
        # no total cap: each project's share is capped (FORWARDS_PER_PROJECT) instead
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
        _client = httpx.AsyncClient(timeout=FORWARD_TIMEOUT, trust_env=False, limits=limits)
    return _client


@asynccontextmanager
async def _in_flight(project_id: str) -> AsyncIterator[None]:
    """One of the project's FORWARDS_PER_PROJECT calls in flight, held for the `async with` block."""
    gate = _forwards.of(project_id)
    try:
        await asyncio.wait_for(gate.acquire(), FORWARD_WAIT_SECONDS)
    except TimeoutError:
        detail = f"your project has {FORWARDS_PER_PROJECT} Tinker calls in flight, the most it may: retry shortly"
        raise Problem(429, "Too many calls in flight", detail, headers={"Retry-After": "1"}) from None
    try:
        yield
    finally:
        gate.release()


# --- finding jobs, in the caller's project only ----------------------------------------------


def _job_named(settings: Settings, project_id: str, name: str) -> Located | None:
    with get_sessionmaker(settings.database.url)() as s:
        q = sessions_of(project_id).where(Job.name == name).order_by(Job.created_at.desc()).limit(1)
        return next(iter(located(s, q)), None)


def _job(settings: Settings, project_id: str, job_id: str) -> Located | None:
    with get_sessionmaker(settings.database.url)() as s:
        return next(iter(located(s, sessions_of(project_id).where(Job.id == job_id))), None)


def _session_jobs(settings: Settings, project_id: str, session_id: str) -> list[Located]:
    with get_sessionmaker(settings.database.url)() as s:
        q = sessions_of(project_id).where(Job.name.like(f"{session_id}:%"))
        return [at for at in located(s, q) if (at.job.spec or {}).get("session") == session_id]


async def _model_job(settings: Settings, caller: Caller, model_id: str) -> Located:
    job = await run_in_threadpool(_job_named, settings, caller.project_id, str(model_id))
    if job is None:
        raise Problem(404, "Not found", f"model_id: no training client {model_id!r} in this project")
    return job


def _job_of_id(value: str) -> str:
    """The job id a request or sampler id starts with ('<job id>:...')."""
    return value.split(":", 1)[0]


async def _id_job(settings: Settings, caller: Caller, value: str, what: str) -> Located:
    job = await run_in_threadpool(_job, settings, caller.project_id, _job_of_id(value))
    if job is None:
        raise Problem(404, "Not found", f"{what}: no {value!r} in this project")
    return job


# --- forwarding to a session job's process -------------------------------------------------


async def _forward(
    settings: Settings, at: Located, op: str, body: bytes, content_type: str, counted: bool = True
) -> Response:
    """`op` on the job's process; a 404 once the job has ended, a 429 (the SDK retries) before it serves.
    `counted`: one of the project's calls in flight (`_in_flight`); a heartbeat is not, so a project
    busy with long polls keeps its sessions alive."""
    job, where = at
    if job.status in TERMINAL:  # its endpoint row may outlive a process that crashed
        raise Problem(404, "Session ended", f"the session job {job.id} is {job.status}: start a new client")
    if where is None:
        raise Problem(429, "Session starting", f"the session job {job.id} is {job.status}: retry shortly")
    url, token = where
    try:
        async with _in_flight(str(job.project_id)) if counted else nullcontext():
            headers = {"Content-Type": content_type, TOKEN_HEADER: token}
            r = await _http().post(f"{url}/{op}", content=body, headers=headers)
    except httpx.HTTPError as exc:
        fresh = await run_in_threadpool(_job, settings, job.project_id, job.id)
        if fresh is None or fresh.job.status in TERMINAL:
            status = fresh.job.status if fresh is not None else "gone"
            raise Problem(404, "Session ended", f"the session job {job.id} is {status}: start a new client") from None
        raise Problem(503, "Session unreachable", f"the session job {job.id} did not answer: {exc}") from None
    return Response(r.content, r.status_code, media_type=r.headers.get("content-type", "application/json"))


def _int(data: dict[str, Any], field: str) -> int:
    value = data.get(field) or 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise Problem.at(f"/{field}", f"{value!r} is not a counter: give a whole number from 0", status=400)
    return value


def _object(data: dict[str, Any], field: str) -> dict[str, Any]:
    value = data.get(field) or {}
    if not isinstance(value, dict):
        raise Problem.at(f"/{field}", "give an object", status=400)
    return value


def _proto_model_id(body: bytes) -> str:
    """Field 1 (model_id) of a ForwardBackwardRequest, read without decoding the rest."""
    try:
        return _model_id_field(body)
    except ValueError:
        raise Problem(400, "Invalid request", "forward_backward: the protobuf body is malformed or cut short") from None


def _model_id_field(body: bytes) -> str:
    at = 0
    while at < len(body):
        key, at = read_varint(body, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, at = read_varint(body, at)
        elif wire == 1:
            at += 8
        elif wire == 5:
            at += 4
        elif wire == 2:
            size, at = read_varint(body, at)
            if number == 1:
                try:
                    return body[at : at + size].decode()
                except UnicodeDecodeError:
                    break  # not a model id
            at += size
        else:
            break
    raise Problem(400, "Invalid request", "forward_backward: the protobuf body carries no model_id")


# --- submitting session jobs ------------------------------------------------------------------


SESSION_ELSEWHERE = "no session {!r} in this project: use the session_id that create_session gave this project's key"


def _held_elsewhere(s: Any, project_id: str, session_id: str | None) -> bool:
    """Whether another project's jobs carry this session id. A session is stored only as its jobs,
    so an id no job carries is anyone's to start; one another project's jobs carry is that project's:
    before, a job was made in the caller's project under the other project's session."""
    if not session_id:
        return False
    q = (
        select(Job.spec)
        .where(Job.kind == "session", Job.project_id != project_id, Job.name.like(f"{session_id}:%"))
        .limit(64)
    )
    return any((spec or {}).get("session") == session_id for spec in s.scalars(q))


def _submit(settings: Settings, project_id: str, fields: dict[str, Any], what: str) -> str:
    fields.setdefault("heartbeat_timeout_seconds", settings.sessions.heartbeat_timeout_seconds)
    fields.setdefault("warm_engine", settings.sessions.warm_engine)
    try:
        spec = SessionSpec(tags=[TAG], **fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise Problem.at("/" + "/".join(str(p) for p in err["loc"]), err["msg"], status=400) from None
    with get_sessionmaker(settings.database.url)() as session:
        if _held_elsewhere(session, project_id, spec.session):
            raise Problem.at("/session_id", SESSION_ELSEWHERE.format(spec.session), status=404)
        # another job's output ('job:', 'ft:' names): one of the project's, before admit reads its config
        check_job_refs(session, project_id, model_refs(spec))
        config = admit({"": spec}, settings)[""]
        job = job_row(project_id, spec, config, settings)
        session.add(job)
        commit_and_dispatch(session, settings, project_id, [(job, f"queued on '{job.queue}' by POST /api/v1/{what}")])
        return str(job.id)


def _lora_fields(spec: dict[str, Any]) -> dict[str, Any]:
    keys = ("lora_rank", "train_attn", "train_mlp", "train_unembed", "heartbeat_timeout_seconds", "dtype", "resources")
    return {k: spec[k] for k in keys if k in spec}


def _create_status(settings: Settings, project_id: str, job_id: str) -> dict[str, Any] | None:
    """A create future's result: the model id once its job serves, an error once it ended, else None."""
    with get_sessionmaker(settings.database.url)() as s:
        job = s.get(Job, job_id)
        if job is None or job.project_id != project_id:
            return {"error": f"no request {job_id}:create in this project", "category": "user"}
        if s.get(Endpoint, job_id) is not None:
            return {"model_id": job.name}
        if job.status in WAIT_ENDS:
            return {
                "error": f"the session job {job_id} {job.status}: {job.error or 'no error recorded'}",
                "category": "server",
            }
        return None


def _queue_state(settings: Settings, project_id: str, job_id: str) -> dict[str, str]:
    """How a create future still waits, as the SDK's try_again reads it: `active` while its job's
    process starts, `paused_capacity` with the reason while the job waits for a worker. A client
    that ends without finishing its session holds its worker until its heartbeat lapses: the
    project's own sessions that hold a worker of the same queue are named."""
    with get_sessionmaker(settings.database.url)() as s:
        job = s.get(Job, job_id)
        if job is None or job.status != "queued":
            return {"queue_state": "active"}
        q = sessions_of(project_id).where(Job.status == "running", Job.queue == job.queue, Job.id != job_id)
        holding = list(s.scalars(q.order_by(Job.created_at)))
    reason = f"the session job {job_id} waits for a worker of queue '{job.queue}'"
    if holding:
        names = ", ".join(
            f"{j.name} (heartbeat timeout {(j.spec or {}).get('heartbeat_timeout_seconds', '?')} s)"
            for j in holding[:5]
        )
        reason += (
            f"; your project's sessions hold workers there: {names}. A client that ends without finishing its "
            "session holds its worker until that timeout passes"
        )
    return {"queue_state": "paused_capacity", "queue_state_reason": reason}


# --- the routes -------------------------------------------------------------------------------


@router.post("/client/config")
async def client_config(caller: TinkerCaller) -> dict[str, Any]:
    # calls one at a time in seq order, on plain httpx, with uncompressed bodies, and the key as sent
    return {
        "pjwt_auth_enabled": False,
        "use_pyqwest_transport": False,
        "proto_compress_fwdbwd": False,
        "parallel_fwdbwd_chunks": False,
    }


@router.post("/telemetry")
async def telemetry(caller: TinkerCaller) -> dict[str, str]:
    return {"status": "accepted"}  # not kept: the job's own events and metrics are the record


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/get_server_capabilities")
async def capabilities(caller: TinkerCaller, settings: SettingsDep) -> dict[str, Any]:
    # the names an operator set up (fine_tuning.model_aliases) and what they stand for; any model a
    # job may name (a hub id, a path under a model root, 'tiny:...') can be trained too
    aliases = settings.fine_tuning.model_aliases
    return {"supported_models": [{"model_name": m} for m in sorted({*aliases, *aliases.values()})]}


@router.post("/create_session")
async def create_session(caller: TinkerCaller, request: Request) -> dict[str, str]:
    json_body(await request.body())
    return {"session_id": str(uuid.uuid4())}  # nothing to store until a client: its jobs carry the id


@router.post("/session_heartbeat", responses={410: {"description": "The session has ended."}})
async def heartbeat(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    session_id = str(json_body(await request.body()).get("session_id") or "")
    jobs = await run_in_threadpool(_session_jobs, settings, caller.project_id, session_id)
    live = [at for at in jobs if at.job.status not in TERMINAL]
    if jobs and not live:
        return Response('{"detail": "session finished"}', 410, media_type="application/json")
    await asyncio.gather(*(_forward_quietly(settings, at, "session_heartbeat") for at in live))
    return Response("{}", 200, media_type="application/json")


async def _forward_quietly(settings: Settings, at: Located, op: str) -> None:
    try:
        await _forward(settings, at, op, b"{}", "application/json", counted=False)  # a heartbeat: never held up
    except Problem:
        pass  # not serving yet, or ended


@router.post("/sessions/{session_id}/finish")
async def finish(session_id: str, caller: TinkerCaller, settings: SettingsDep, request: Request) -> dict[str, Any]:
    reason = _object(json_body(await request.body()), "reason")
    body = json.dumps({"reason": str(reason.get("type", "success"))[:40]}).encode()
    jobs = await run_in_threadpool(_session_jobs, settings, caller.project_id, session_id)
    if not jobs:
        raise Problem(404, "Not found", f"session_id: no session {session_id!r} in this project")
    for at in jobs:
        if at.job.status in TERMINAL:
            continue
        try:
            await _forward(settings, at, "finish", body, "application/json")
        except Problem:  # not serving yet: cancelled instead
            await run_in_threadpool(_cancel, settings, at.job.id)
    return {}


def _cancel(settings: Settings, job_id: str) -> None:
    with get_sessionmaker(settings.database.url)() as s:
        job = s.get(Job, job_id)
        if job is not None and job.status not in TERMINAL:
            request_cancel(s, job)


@router.post("/create_model")
async def create_model(caller: TinkerCaller, settings: SettingsDep, request: Request) -> dict[str, Any]:
    data = json_body(await request.body())
    lora = _object(data, "lora_config")
    if _object(data, "optimizer_config").get("type", "adamw") != "adamw":
        raise Problem.at("/optimizer_config/type", "only adamw is served", status=400)
    base = data.get("base_model")
    fields = {
        "model": settings.fine_tuning.model_aliases.get(str(base), base),
        "session": data.get("session_id"),
        "name": f"{data.get('session_id')}:train:{_int(data, 'model_seq_id')}",
        "lora_rank": lora.get("rank", 32),
        "train_attn": lora.get("train_attn", True),
        "train_mlp": lora.get("train_mlp", True),
        "train_unembed": lora.get("train_unembed", True),
        "seed": lora.get("seed"),
        "user_metadata": data.get("user_metadata") or {},
    }
    job_id = await run_in_threadpool(_submit, settings, caller.project_id, fields, "create_model")
    return {"request_id": f"{job_id}:create", "model_id": fields["name"]}


@router.post("/load_weights")
async def load_weights(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Any:
    data = json_body(await request.body())
    (src, _), save = await run_in_threadpool(find_save, settings, caller.project_id, str(data.get("path") or ""))
    if data.get("model_id"):  # TrainingClient.load_state: into a live model
        at = await _model_job(settings, caller, str(data["model_id"]))
        body = {**data, "directory": save.uri}
        return await _forward(settings, at, "load_weights", json.dumps(body).encode(), "application/json")
    session_id = str(data.get("session_id") or "")
    fields = {
        **_lora_fields(src.spec or {}),
        "model": (src.spec or {}).get("model"),
        "session": session_id,
        "name": f"{session_id}:train:{_int(data, 'model_seq_id')}",
        "load": f"job:{src.id}@step-{save.step}",
        "load_optimizer": bool(data.get("optimizer")),
    }
    job_id = await run_in_threadpool(_submit, settings, caller.project_id, fields, "load_weights")
    return {"request_id": f"{job_id}:create", "model_id": fields["name"]}


@router.post("/get_info")
async def get_info(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    body = await request.body()
    at = await _model_job(settings, caller, str(json_body(body).get("model_id") or ""))
    return await _forward(settings, at, "get_info", body, "application/json")


# forward_backward bodies (up to sessions.max_call_bytes, 32 MiB) one project reads and forwards at once:
# the rest wait, their bytes still in the socket. 32 at once from one tenant took ~1 GiB of the API's memory.
LARGE_CALLS_PER_PROJECT = 4
_large_calls = ProjectGates(LARGE_CALLS_PER_PROJECT)


@router.post("/forward_backward")
async def forward_backward(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    async with _large_calls.of(str(caller.project_id)):
        body = await request.body()
        at = await _model_job(settings, caller, _proto_model_id(body))
        return await _forward(settings, at, "forward_backward", body, "application/x-protobuf")


async def _model_call(op: str, caller: Caller, settings: Settings, request: Request) -> Response:
    body = await request.body()
    at = await _model_job(settings, caller, str(json_body(body).get("model_id") or ""))
    return await _forward(settings, at, op, body, "application/json")


@router.post("/optim_step")
async def optim_step(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    return await _model_call("optim_step", caller, settings, request)


@router.post("/save_weights")
async def save_weights(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    return await _model_call("save_weights", caller, settings, request)


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    return await _model_call("save_weights_for_sampler", caller, settings, request)


@router.post("/create_sampling_session")
async def create_sampling_session(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Any:
    data = json_body(await request.body())
    session_id = str(data.get("session_id") or "")
    fields: dict[str, Any] = {
        "session": session_id,
        "name": f"{session_id}:sample:{_int(data, 'sampling_session_seq_id')}",
        "train": False,
    }
    if data.get("model_path"):
        at, save = await run_in_threadpool(find_save, settings, caller.project_id, str(data["model_path"]))
        src = at.job
        if at.where is not None and src.status not in TERMINAL:  # its job serves: a sampler there
            body = json.dumps({"directory": save.uri}).encode()
            return await _forward(settings, at, "create_sampling_session", body, "application/json")
        fields.update(_lora_fields(src.spec or {}), model=(src.spec or {}).get("model"))
        fields["load"] = f"job:{src.id}@step-{save.step}"
    elif data.get("base_model"):
        base = data["base_model"]  # an operator's alias, as for create_model (get_server_capabilities lists them)
        model = settings.fine_tuning.model_aliases.get(str(base), base)
        fields.update(model=model, lora_rank=1)  # a new adapter changes nothing: the base model
    else:
        raise Problem.at("/base_model", "give base_model or model_path", status=400)
    job_id = await run_in_threadpool(_submit, settings, caller.project_id, fields, "create_sampling_session")
    return {"sampling_session_id": f"{job_id}:sample:0"}


@router.get("/samplers/{sampler_id}")
async def sampler(sampler_id: str, caller: TinkerCaller, settings: SettingsDep) -> dict[str, Any]:
    at = await _id_job(settings, caller, sampler_id, "sampler_id")
    return {"sampler_id": sampler_id, "base_model": (at.job.spec or {}).get("model")}


@router.post("/asample")
async def asample(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    body = await request.body()
    sampler_id = str(json_body(body).get("sampling_session_id") or "")
    at = await _id_job(settings, caller, sampler_id, "sampling_session_id")
    return await _forward(settings, at, "asample", body, "application/json")


@router.post("/retrieve_future")
async def retrieve_future(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    body = await request.body()
    request_id = str(json_body(body).get("request_id") or "")
    at = await _id_job(settings, caller, request_id, "request_id")
    if request_id.endswith(":create"):  # the job's process is not up yet: ask the store
        deadline = time.monotonic() + CREATE_WAIT_SECONDS
        async with _in_flight(str(caller.project_id)):  # a long poll too: counted with the project's forwards
            while (result := await run_in_threadpool(_create_status, settings, caller.project_id, at.job.id)) is None:
                if time.monotonic() > deadline:
                    state = await run_in_threadpool(_queue_state, settings, caller.project_id, at.job.id)
                    result = {"type": "try_again", "request_id": request_id, **state}
                    break
                await asyncio.sleep(0.2)
        return Response(json.dumps(result), 200, media_type="application/json")
    return await _forward(settings, at, "retrieve_future", body, "application/json")
