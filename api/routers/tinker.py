"""The Tinker API (`/api/v1/...`), as the `tinker` SDK calls it: a view over mathrl's jobs, not a
second system.

A training client is a `session` job named `<session id>:train:<n>`; a sampling client on a base
model, or on a save whose job has ended, a `session` job named `<session id>:sample:<n>`. Every call
on a model or sampler, `retrieve_future` too, is forwarded to its job's process (its address and
token in the store's `endpoints` table). Saves are the job's checkpoints, their `tinker://` paths
looked up in the caller's project only. The SDK's key is `tml-` + a mathrl key (the prefix is
dropped here). What the routes call is in api/tinker/. docs/tinker.md; the wire protocol:
docs/tinker-protocol.md."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from api.deps import SettingsDep
from api.problems import Problem
from api.project_gates import ProjectGates
from api.tinker.bodies import counter, object_field, proto_model_id
from api.tinker.common import RESPONSES, TinkerCaller, find_save, json_body
from api.tinker.forwarding import forward, forward_quietly, in_flight, model_call
from api.tinker.futures import create_status, queue_state
from api.tinker.lookups import id_job, model_job, session_jobs
from api.tinker.session_jobs import cancel_session_job, lora_fields, submit_session
from mathrl.status import TERMINAL

router = APIRouter(prefix="/api/v1", tags=["tinker"], responses=RESPONSES)
CREATE_WAIT_SECONDS = 20.0  # a create_model future's long poll (the SDK's read timeout is 45 s)


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
    jobs = await run_in_threadpool(session_jobs, settings, caller.project_id, session_id)
    live = [at for at in jobs if at.job.status not in TERMINAL]
    if jobs and not live:
        return Response('{"detail": "session finished"}', 410, media_type="application/json")
    await asyncio.gather(*(forward_quietly(settings, at, "session_heartbeat") for at in live))
    return Response("{}", 200, media_type="application/json")


@router.post("/sessions/{session_id}/finish")
async def finish(session_id: str, caller: TinkerCaller, settings: SettingsDep, request: Request) -> dict[str, Any]:
    reason = object_field(json_body(await request.body()), "reason")
    body = json.dumps({"reason": str(reason.get("type", "success"))[:40]}).encode()
    jobs = await run_in_threadpool(session_jobs, settings, caller.project_id, session_id)
    if not jobs:
        raise Problem(404, "Not found", f"session_id: no session {session_id!r} in this project")
    for at in jobs:
        if at.job.status in TERMINAL:
            continue
        try:
            await forward(settings, at, "finish", body, "application/json")
        except Problem:  # not serving yet: cancelled instead
            await run_in_threadpool(cancel_session_job, settings, at.job.id)
    return {}


@router.post("/create_model")
async def create_model(caller: TinkerCaller, settings: SettingsDep, request: Request) -> dict[str, Any]:
    data = json_body(await request.body())
    lora = object_field(data, "lora_config")
    if object_field(data, "optimizer_config").get("type", "adamw") != "adamw":
        raise Problem.at("/optimizer_config/type", "only adamw is served", status=400)
    base = data.get("base_model")
    fields = {
        "model": settings.fine_tuning.model_aliases.get(str(base), base),
        "session": data.get("session_id"),
        "name": f"{data.get('session_id')}:train:{counter(data, 'model_seq_id')}",
        "lora_rank": lora.get("rank", 32),
        "train_attn": lora.get("train_attn", True),
        "train_mlp": lora.get("train_mlp", True),
        "train_unembed": lora.get("train_unembed", True),
        "seed": lora.get("seed"),
        "user_metadata": data.get("user_metadata") or {},
    }
    job_id = await run_in_threadpool(submit_session, settings, caller.project_id, fields, "create_model")
    return {"request_id": f"{job_id}:create", "model_id": fields["name"]}


@router.post("/load_weights")
async def load_weights(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Any:
    data = json_body(await request.body())
    (src, _), save = await run_in_threadpool(find_save, settings, caller.project_id, str(data.get("path") or ""))
    if data.get("model_id"):  # TrainingClient.load_state: into a live model
        at = await model_job(settings, caller, str(data["model_id"]))
        body = {**data, "directory": save.uri}
        return await forward(settings, at, "load_weights", json.dumps(body).encode(), "application/json")
    session_id = str(data.get("session_id") or "")
    fields = {
        **lora_fields(src.spec or {}),
        "model": (src.spec or {}).get("model"),
        "session": session_id,
        "name": f"{session_id}:train:{counter(data, 'model_seq_id')}",
        "load": f"job:{src.id}@step-{save.step}",
        "load_optimizer": bool(data.get("optimizer")),
    }
    job_id = await run_in_threadpool(submit_session, settings, caller.project_id, fields, "load_weights")
    return {"request_id": f"{job_id}:create", "model_id": fields["name"]}


@router.post("/get_info")
async def get_info(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    body = await request.body()
    at = await model_job(settings, caller, str(json_body(body).get("model_id") or ""))
    return await forward(settings, at, "get_info", body, "application/json")


# forward_backward bodies (up to sessions.max_call_bytes, 32 MiB) one project reads and forwards at once:
# the rest wait, their bytes still in the socket. 32 at once from one tenant took ~1 GiB of the API's memory.
LARGE_CALLS_PER_PROJECT = 4
_large_calls = ProjectGates(LARGE_CALLS_PER_PROJECT)


@router.post("/forward_backward")
async def forward_backward(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    async with _large_calls.of(str(caller.project_id)):
        body = await request.body()
        at = await model_job(settings, caller, proto_model_id(body))
        return await forward(settings, at, "forward_backward", body, "application/x-protobuf")


@router.post("/optim_step")
async def optim_step(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    return await model_call("optim_step", caller, settings, request)


@router.post("/save_weights")
async def save_weights(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    return await model_call("save_weights", caller, settings, request)


@router.post("/save_weights_for_sampler")
async def save_weights_for_sampler(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    return await model_call("save_weights_for_sampler", caller, settings, request)


@router.post("/create_sampling_session")
async def create_sampling_session(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Any:
    data = json_body(await request.body())
    session_id = str(data.get("session_id") or "")
    fields: dict[str, Any] = {
        "session": session_id,
        "name": f"{session_id}:sample:{counter(data, 'sampling_session_seq_id')}",
        "train": False,
    }
    if data.get("model_path"):
        at, save = await run_in_threadpool(find_save, settings, caller.project_id, str(data["model_path"]))
        src = at.job
        if at.where is not None and src.status not in TERMINAL:  # its job serves: a sampler there
            body = json.dumps({"directory": save.uri}).encode()
            return await forward(settings, at, "create_sampling_session", body, "application/json")
        fields.update(lora_fields(src.spec or {}), model=(src.spec or {}).get("model"))
        fields["load"] = f"job:{src.id}@step-{save.step}"
    elif data.get("base_model"):
        base = data["base_model"]  # an operator's alias, as for create_model (get_server_capabilities lists them)
        model = settings.fine_tuning.model_aliases.get(str(base), base)
        fields.update(model=model, lora_rank=1)  # a new adapter changes nothing: the base model
    else:
        raise Problem.at("/base_model", "give base_model or model_path", status=400)
    job_id = await run_in_threadpool(submit_session, settings, caller.project_id, fields, "create_sampling_session")
    return {"sampling_session_id": f"{job_id}:sample:0"}


@router.get("/samplers/{sampler_id}")
async def sampler(sampler_id: str, caller: TinkerCaller, settings: SettingsDep) -> dict[str, Any]:
    at = await id_job(settings, caller, sampler_id, "sampler_id")
    return {"sampler_id": sampler_id, "base_model": (at.job.spec or {}).get("model")}


@router.post("/asample")
async def asample(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    body = await request.body()
    sampler_id = str(json_body(body).get("sampling_session_id") or "")
    at = await id_job(settings, caller, sampler_id, "sampling_session_id")
    return await forward(settings, at, "asample", body, "application/json")


@router.post("/retrieve_future")
async def retrieve_future(caller: TinkerCaller, settings: SettingsDep, request: Request) -> Response:
    body = await request.body()
    request_id = str(json_body(body).get("request_id") or "")
    at = await id_job(settings, caller, request_id, "request_id")
    if request_id.endswith(":create"):  # the job's process is not up yet: ask the store
        deadline = time.monotonic() + CREATE_WAIT_SECONDS
        async with in_flight(str(caller.project_id)):  # a long poll too: counted with the project's forwards
            while (result := await run_in_threadpool(create_status, settings, caller.project_id, at.job.id)) is None:
                if time.monotonic() > deadline:
                    state = await run_in_threadpool(queue_state, settings, caller.project_id, at.job.id)
                    result = {"type": "try_again", "request_id": request_id, **state}
                    break
                await asyncio.sleep(0.2)
        return Response(json.dumps(result), 200, media_type="application/json")
    return await forward(settings, at, "retrieve_future", body, "application/json")
