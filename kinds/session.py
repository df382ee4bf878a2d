"""A client-driven training session (`kind: session`, spec: mathrl/specs/session.py): the Tinker
API's training and sampling clients. The job holds its model, LoRA adapter and optimizer in its
process and serves the client's calls (trainer/session_server.py) until the client finishes it,
sends nothing for `heartbeat_timeout_seconds`, or the job is cancelled."""

from __future__ import annotations

import gc
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

from config.settings import Settings
from kinds.base import Data, JobRun, Kind, Limit, Needs
from mathrl.specs import SessionSpec
from mathrl.specs.resolved import ResolvedConfig
from runtime.errors import Refused, StopRequested

if TYPE_CHECKING:
    from trainer.memory_plan import Training

POLL_SECONDS = 0.5  # how often the job looks at its heartbeat, the finish call and a cancel


class SessionKind(Kind[SessionSpec, ResolvedConfig]):
    spec = SessionSpec
    saves_models = True
    config = ResolvedConfig

    def resolve(self, spec: SessionSpec) -> ResolvedConfig:
        return self.resolved(spec, {})

    def admit(self, spec: SessionSpec, config: ResolvedConfig, settings: Settings) -> None:
        if spec.resources.nodes > 1 or (spec.resources.processes or 1) > 1:
            raise Refused("resources", "a session runs as one process on one node: drop resources.nodes/processes")

    def limits(self, spec: SessionSpec, config: ResolvedConfig) -> list[Limit]:
        return []  # its steps are the client's calls; the heartbeat timeout ends an abandoned one

    def memory(self, config: ResolvedConfig) -> Training | None:
        return None

    def needs(self, spec: SessionSpec) -> Needs:
        # With `warm_engine`, sampling goes to the worker's warm vLLM engine of the base model where
        # there is one idle (never started for a session), its samplers loaded as LoRA adapters. Not
        # with an adapter on lm_head (train_unembed): vLLM refuses it. On a GPU an idle engine is
        # stopped instead, as for any GPU training job: both would not fit its memory.
        warm = spec.model if spec.warm_engine and spec.resources.gpus == 0 and not spec.train_unembed else None
        return Needs(spec.model, engine_model=warm, engine_if_warm=True, engine_lora_rank=spec.lora_rank)

    def data(self, spec: SessionSpec) -> Data:
        return Data()

    def run(self, run: JobRun[SessionSpec, ResolvedConfig]) -> None:
        from evaluator.backends import BackendOptions
        from trainer.session import LoraOptions, TrainingSession
        from trainer.session_server import SessionService, serve

        spec, sink = run.spec, run.sink
        lora = LoraOptions(spec.lora_rank, spec.seed, spec.train_attn, spec.train_mlp, spec.train_unembed)
        session = TrainingSession(run.model_path, lora, spec.dtype)
        if spec.load is not None:
            directory, label = run.resolve(spec.load)
            session.load(Path(directory), optimizer=spec.load_optimizer and spec.train)
            sink.event("loaded", f"started from {label or spec.load}", data={"from": spec.load})
        gc.collect()  # the model's objects never become garbage: out of the collector's way (as the API's)
        gc.freeze()
        model_id = run.spec.name or run.job_id
        # the backend its samplers run on: vllm where the supervisor gave it the worker's idle engine of
        # its base model, else hf (no addresses in events: a tenant reads them, and the worker's hosts
        # and ports are the operator's)
        sampling = "vllm" if run.warm is not None else "hf"
        where = "the worker's warm vLLM engine" if run.warm else "transformers in this process"
        if run.warm is None and spec.warm_engine and spec.train_unembed:
            where += " (vLLM's LoRA cannot adapt lm_head: train_unembed=False samples on a warm engine)"
        sink.event("sampling", f"samplers run on {where}", data={"backend": sampling})
        service = SessionService(
            session, sink, run.job_id, model_id, run.work, run.out, spec.train, spec.model,
            sampling, BackendOptions(warm=run.warm),
        )  # fmt: skip
        token = secrets.token_urlsafe(24)
        server = serve(service, run.settings.worker.session_host, token)
        host, port = server.server_address[:2]
        url = f"http://{host!s}:{port}"
        sink.endpoint(url, token)
        sink.event("serving", f"serving {'training' if spec.train else 'sampling'} calls")  # its address: endpoints
        why, stopped = "", False
        try:
            while not why:
                time.sleep(POLL_SECONDS)
                idle = time.monotonic() - service.last_seen
                if service.finished is not None:
                    why = f"the client finished the session ({service.finished})"
                elif idle > spec.heartbeat_timeout_seconds:
                    limit = spec.heartbeat_timeout_seconds
                    why = f"no call or heartbeat for {idle:.0f} s (heartbeat_timeout_seconds {limit})"
                elif sink.should_stop():
                    stopped = True  # cancelled, drained or lost: the worker reports which
                    break
        finally:
            server.shutdown()
            service.close()
            sink.endpoint(None)
        if stopped and sink.draining():  # its state is this process's memory: it cannot move to another worker
            raise RuntimeError(
                "the worker shut down (drained) while this session was open: a session's model lives in its "
                "job's memory and cannot move; start a new client from your last save_state"
            )
        if stopped:
            raise StopRequested("stop requested")
        sink.event("session_ended", why)
