"""A session job's server (kind `session`; `SessionService`, `serve`): its client's calls, forwarded by
the API's Tinker routes (api/routers/tinker.py), run on the model this process holds
(trainer/session.py), one at a time, in the order they came.

Each call is answered at once with a request id, and its result is fetched with `retrieve_future`,
held until it is ready or LONG_POLL_SECONDS passed (then `try_again`): Tinker's futures
(docs/tinker-protocol.md, section 4). A call that fails answers its future with `{"error",
"category"}`. Every request counts as the client's heartbeat. The server listens on the worker's
`session_host` and answers only requests that carry the job's token (stored with its address in the
store's `endpoints` table)."""

from __future__ import annotations

import hmac
import json
import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from evaluator.backends import BackendOptions, backend
from mathrl.modelref import SESSION_SUFFIX, ft_model_name
from runtime.errors import EngineError
from runtime.errors import SessionCallError as SessionCallError  # raised here
from runtime.sink import Sink
from trainer.session import AdamParams, TrainingSession
from trainer.session_sampling import SnapshotWeights, lora_weights, sample_call, use_weights
from trainer.session_wire import ForwardBackwardCall, decode_forward_backward, encode_forward_backward, encode_sample

log = logging.getLogger(__name__)

TOKEN_HEADER = "X-Mathrl-Session-Token"
PROTOBUF = "application/x-protobuf"
LONG_POLL_SECONDS = 20.0  # under the SDK's 45 s read timeout on retrieve_future
NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
ADAM_FIELDS = {"learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm"}


@dataclass
class Result:
    body: bytes
    content_type: str = "application/json"


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SessionCallError(f"{where}: {value!r} is not a number")
    try:
        return float(value)
    except ValueError:
        raise SessionCallError(f"{where}: {value!r} is not a number") from None


def _json(value: Any) -> Result:
    return Result(json.dumps(value).encode())


@dataclass
class Save:
    """Where a save goes and how the store records it (the job's checkpoint rows)."""

    step: int
    work: Path  # written here (the attempt's directory) ...
    out: Path  # ... and moved here by the sink, in the transaction that records it


class SessionService:
    """The calls of one session job: a training client's (forward_backward, optim_step, saves,
    loads) and its sampling clients'."""

    def __init__(
        self,
        session: TrainingSession,
        sink: Sink,
        job_id: str,
        model_id: str,
        work: Path,
        out: Path,
        train: bool,
        base_model: str = "",
        sampling: str = "hf",
        options: BackendOptions | None = None,
    ) -> None:
        self.session, self.sink, self.job_id, self.model_id = session, sink, job_id, model_id
        self.work, self.out, self.train = work, out, train
        self.base_model = base_model or session.model_path  # the spec's `model`: a save's `ft:` name starts with it
        # the backend its samplers run on (evaluator/backends): vllm, the worker's warm engine given to it
        self.sampling = sampling
        self.sampler = backend(sampling, options).token_sampler(session.model, session.tokenizer)
        self.last_seen = time.monotonic()
        self.finished: str | None = None  # why the client ended it ('finish')
        self._results: dict[str, Result] = {}
        self._cond = threading.Condition()
        self._queue: queue.Queue[tuple[str, Callable[[], Result]] | None] = queue.Queue()
        self._count = 0
        self._by_seq: dict[tuple[str, int], str] = {}  # (op, seq_id) -> request id: a resent call runs once
        self._saves = 0
        self._samplers: dict[str, SnapshotWeights] = {}
        self._add_sampler(lora_weights(session))
        self._pending: dict[str, float] = {}  # the loss and sizes since the last optim_step
        self._thread = threading.Thread(target=self._work, name="session-calls", daemon=True)
        self._thread.start()

    # --- the calls -------------------------------------------------------------------------

    def submit(self, op: str, body: bytes) -> dict[str, Any]:
        """Queue a call; its future's ids."""
        self.last_seen = time.monotonic()
        if op == "forward_backward":
            try:
                call = decode_forward_backward(body)
            except ValueError as exc:  # its future says why
                failed = _json({"error": str(exc), "category": "user"})
                return self._queued(op, None, lambda: failed)
            # a resent call (the same seq_id, which the SDK counts from 1) runs once; 0 is proto3's "unset"
            return self._queued(op, call.seq_id or None, lambda: self._forward_backward(call))
        data = json.loads(body or b"{}")
        seq = data.get("seq_id")
        if op == "optim_step":
            return self._queued(op, seq, lambda: self._optim_step(data))
        if op == "save_weights":
            return self._queued(op, seq, lambda: self._save_weights(data))
        if op == "save_weights_for_sampler":
            return self._queued(op, seq, lambda: self._save_for_sampler(data))
        if op == "load_weights":
            return self._queued(op, seq, lambda: self._load_weights(data))
        if op == "asample":
            n = sample_call(data).num_samples  # checked here: a billion ids were built before the call's check
            ids = self._queued(op, None, lambda: self._sample(data))
            return {**ids, "sample_sequence_ids": [f"{ids['request_id']}:{i}" for i in range(n)]}
        raise SessionCallError(f"{op}: not a call this session serves")

    def create_sampler(self, data: dict[str, Any]) -> dict[str, Any]:
        """A sampling client on a save of this job (`directory`, as the API resolved its path) or on
        the weights this job started from (no `directory`)."""
        self.last_seen = time.monotonic()
        directory = data.get("directory")
        if not directory:
            return {"sampling_session_id": f"{self.job_id}:sample:0"}
        # on the calls' thread, as every call that touches the model, through the same futures
        load = self._queued(
            "create_sampling_session", None, lambda: _json({"sampling_session_id": self._sampler_from(Path(directory))})
        )
        while (answer := json.loads(self.retrieve(load["request_id"]).body)).get("type") == "try_again":
            pass
        if "error" in answer:
            raise SessionCallError(answer["error"])
        return dict(answer)

    def info(self) -> dict[str, Any]:
        self.last_seen = time.monotonic()
        s = self.session
        return {
            "model_id": self.model_id,
            "model_data": {"model_name": s.model_path, "tokenizer_id": s.model_path},
            "is_lora": True,
            "lora_rank": s.lora.rank,
        }

    def retrieve(self, request_id: str, wait: float = LONG_POLL_SECONDS) -> Result:
        """The call's result, once it is ready; `try_again` after `wait` seconds."""
        self.last_seen = time.monotonic()
        deadline = time.monotonic() + wait
        with self._cond:
            while request_id not in self._results:
                if not request_id.startswith(f"{self.job_id}:") or not self._known(request_id):
                    return _json({"error": f"no request {request_id} in this session", "category": "user"})
                left = deadline - time.monotonic()
                if left <= 0:
                    return _json({"type": "try_again", "request_id": request_id, "queue_state": "active"})
                self._cond.wait(left)
            return self._results[request_id]

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)
        self.sampler.close()

    # --- the queue -------------------------------------------------------------------------

    def _known(self, request_id: str) -> bool:
        try:
            return 0 < int(request_id.rsplit(":", 1)[1]) <= self._count
        except ValueError:
            return False

    def _queued(self, op: str, seq: int | None, call: Callable[[], Result]) -> dict[str, Any]:
        with self._cond:
            if seq is not None and (op, int(seq)) in self._by_seq:
                return {"request_id": self._by_seq[(op, int(seq))]}
            self._count += 1
            request_id = f"{self.job_id}:{self._count}"
            if seq is not None:
                self._by_seq[(op, int(seq))] = request_id
        self._queue.put((request_id, call))
        return {"request_id": request_id}

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            request_id, call = item
            try:
                result = call()
            except SessionCallError as exc:
                result = _json({"error": str(exc), "category": "user"})
            except (ValueError, KeyError, TypeError, OverflowError) as exc:  # a loss or input the call named wrong
                result = _json({"error": f"{type(exc).__name__}: {exc}", "category": "user"})
            except Exception as exc:
                log.exception("session call %s failed", request_id)
                result = _json({"error": f"{type(exc).__name__}: {exc}", "category": "server"})
            if request_id:
                with self._cond:
                    self._results[request_id] = result
                    self._cond.notify_all()

    # --- what each call does -----------------------------------------------------------------

    def _training(self, what: str) -> None:
        if not self.train:
            raise SessionCallError(f"{what}: this is a sampling client; create a training client to train")

    def _forward_backward(self, call: ForwardBackwardCall) -> Result:
        if not call.forward_only:
            self._training("forward_backward")
        numbers = {k: float(v) for k, v in call.config.items() if not isinstance(v, str)}
        out = self.session.forward_backward(call.data, call.loss_fn, numbers, call.forward_only)
        if not call.forward_only:
            p = self._pending
            p["loss"] = p.get("loss", 0.0) + out.metrics["loss:sum"]
            p["datums"] = p.get("datums", 0.0) + len(call.data)
            p["tokens"] = p.get("tokens", 0.0) + sum(len(d.tokens) for d in call.data)
        return Result(encode_forward_backward(out.logprobs, out.metrics), PROTOBUF)

    def _optim_step(self, data: dict[str, Any]) -> Result:
        self._training("optim_step")
        if data.get("optimizer_params") and (data["optimizer_params"] or {}).get("type", "adamw") != "adamw":
            raise SessionCallError("optimizer_params.type: only adamw is served")
        given = data.get("adam_params") or {}
        if not isinstance(given, dict):
            raise SessionCallError("adam_params: give an object of Adam's parameters")
        adam = AdamParams(**{k: _number(v, f"adam_params.{k}") for k, v in given.items() if k in ADAM_FIELDS})
        metrics = self.session.optim_step(adam)
        pending, self._pending = self._pending, {}
        self.sink.metrics(
            self.session.steps,
            {**pending, "grad_norm": metrics["grad_norm:mean"], "learning_rate": adam.learning_rate},
        )
        return _json({"metrics": metrics})

    def _save(self, kind: str, name: str) -> Save:
        if not NAME.match(name) or name in (".", ".."):  # the dot names are the folder itself and its parent
            raise SessionCallError(
                f"path: {name!r} is not a save name; use letters, digits, '.', '_' and '-' (1-100), not '.' or '..'"
            )
        self._saves += 1
        return Save(self._saves, self.work / kind / name, self.out / kind / name)

    def _record(self, save: Save, what: str, name: str, path: str) -> None:
        model = ft_model_name(self.base_model, SESSION_SUFFIX, self.job_id, save.step)  # the OpenAI surface's name
        data = {"name": name, "what": what, "tinker_path": path, "model": model, "optim_steps": self.session.steps}
        self.sink.checkpoint(save.step, str(save.out), "checkpoint", data, source=str(save.work))

    def _save_weights(self, data: dict[str, Any]) -> Result:
        name = str(data.get("path") or "")
        save = self._save("weights", name)
        self.session.save(save.work, optimizer=self.train)
        path = f"tinker://{self.model_id}/weights/{name}"
        self._record(save, "state", name, path)
        return _json({"path": path})

    def _save_for_sampler(self, data: dict[str, Any]) -> Result:
        name = data.get("path")
        if not name:  # a sampling client on the weights now (save_weights_and_get_sampling_client)
            return _json({"sampling_session_id": self._add_sampler(lora_weights(self.session))})
        save = self._save("sampler_weights", str(name))
        self.session.save(save.work, optimizer=False)
        path = f"tinker://{self.model_id}/sampler_weights/{name}"
        self._record(save, "sampler", str(name), path)
        return _json({"path": path})

    def _load_weights(self, data: dict[str, Any]) -> Result:
        self._training("load_weights")
        directory = data.get("directory")  # the API resolved `path` to the save's directory
        if not directory:
            raise SessionCallError(f"path: {data.get('path')!r} is not a save this project can read")
        self.session.load(Path(directory), optimizer=bool(data.get("optimizer")))
        return _json({})

    def _sampler_from(self, directory: Path) -> str:
        with use_weights(self.session, None):
            now = lora_weights(self.session)
            try:
                self._adapter_into_model(directory)
                weights = lora_weights(self.session)
            finally:
                for name, p in self.session.model.named_parameters():
                    if name in now:
                        p.copy_(now[name])
        return self._add_sampler(weights, saved=directory)  # the save's adapter, as an engine loads it

    def _add_sampler(self, weights: dict[str, Any], saved: Path | None = None) -> str:
        sampler = f"{self.job_id}:sample:{len(self._samplers)}"
        spill = self.work / "engine_adapters" / sampler.replace(":", "_")
        self._samplers[sampler] = SnapshotWeights(self.session, weights, saved, spill)
        return sampler

    def _adapter_into_model(self, directory: Path) -> None:
        """A save's adapter weights into the model (not `TrainingSession.load`: that clears the
        gradients a training client has accumulated)."""
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = directory / "adapter_model.safetensors"
        if not weights.exists():
            raise SessionCallError(f"model_path: {directory.name} holds no adapter weights")
        try:
            set_peft_model_state_dict(self.session.model, load_file(str(weights), device=str(self.session.device)))
        except RuntimeError as exc:  # another rank or base model
            raise SessionCallError(f"model_path: {directory.name} does not fit this session's model: {exc}") from None

    def _sample(self, data: dict[str, Any]) -> Result:
        sampler = str(data.get("sampling_session_id") or f"{self.job_id}:sample:0")
        if sampler not in self._samplers:
            raise SessionCallError(f"sampling_session_id: no sampler {sampler} in this session")
        call = sample_call(data)
        self.session.check_tokens(call.prompt, "prompt")  # before either sampler: the engine's too
        weights = self._samplers[sampler]
        try:
            sequences, prompt_lp = self.sampler.sample(call, weights)
        except EngineError as exc:
            if self.sampling == "hf":
                raise
            self.sink.event(
                "sampling", f"the warm vLLM engine failed ({exc}): sampling with transformers from now on",
                data={"backend": "hf", "reason": str(exc)[:500]},
            )  # fmt: skip
            self.sampler.close()
            self.sampling, self.sampler = "hf", backend("hf").token_sampler(self.session.model, self.session.tokenizer)
            sequences, prompt_lp = self.sampler.sample(call, weights)
        return Result(encode_sample(sequences, prompt_lp), PROTOBUF)


def serve(service: SessionService, host: str, token: str) -> ThreadingHTTPServer:
    """The service's HTTP server on `host` (a free port), answering requests with `token` only."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out at once: no 40 ms delayed-ACK wait

        def log_message(self, format: str, *args: Any) -> None:  # the API logs its requests
            pass

        def _send(self, status: int, result: Result) -> None:
            self.send_response(status)
            self.send_header("Content-Type", result.content_type)
            self.send_header("Content-Length", str(len(result.body)))
            self.end_headers()
            self.wfile.write(result.body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not hmac.compare_digest(self.headers.get(TOKEN_HEADER, "").encode(), token.encode()):
                self._send(403, _json({"error": "wrong session token"}))
                return
            op = self.path.strip("/")
            try:
                if op == "retrieve_future":
                    self._send(200, service.retrieve(str(json.loads(body)["request_id"])))
                elif op == "get_info":
                    self._send(200, _json(service.info()))
                elif op == "create_sampling_session":
                    self._send(200, _json(service.create_sampler(json.loads(body or b"{}"))))
                elif op == "session_heartbeat":
                    service.last_seen = time.monotonic()
                    self._send(200, _json({}))
                elif op == "finish":
                    service.finished = str(json.loads(body or b"{}").get("reason") or "finished")
                    self._send(200, _json({}))
                else:
                    self._send(200, _json(service.submit(op, body)))
            # a field of the wrong type ([1] for a number), Infinity where an int goes, JSON too deep
            except (SessionCallError, ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
                self._send(400, _json({"error": str(exc), "category": "user"}))

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="session-http", daemon=True).start()
    return server
