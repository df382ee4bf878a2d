"""A claimed job's lease, kept alive on a thread from the claim to the attempt's recorded end
(`LeaseKeeper`): one renewer for the whole attempt. It renews while the worker prepares the attempt
(waits for the GPUs another job of this worker holds, starts a warm vLLM engine or loads a model's
weights into one, up to worker/warm_engine.RELOAD_TIMEOUT, starts the job's own vLLM server, submits
the Ray job) and while the watch loop (worker.watch) watches it, acting on each renewal's answer
(`next_beat`): the lease lost, a cancel, a pause. Why the preparation needs it:
docs/how-jobs-run.md."""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from store.db import session_scope
from store.jobs import Heartbeat, renew_lease

log = logging.getLogger("mathrl.worker")


class LeaseKeeper:
    """Renews the job's lease every `every` seconds until `stop` (or the `with` block's end);
    `beat` is the last renewal's answer, `next_beat` waits for the next one."""

    def __init__(self, url: str, job_id: str, owner: str, lease_seconds: float, every: float) -> None:
        self.url, self.job_id, self.owner = url, job_id, owner
        self.lease_seconds, self.every = lease_seconds, every
        self.beat = Heartbeat(owned=True, cancel_requested=False)  # the claim just took it
        self._stopped = threading.Event()
        self._renewed = threading.Condition()
        self._renewals = 0  # successful renewals so far; `next_beat` hands each one out once
        self._read = 0
        self._thread = threading.Thread(target=self._run, name=f"mathrl-lease-{job_id}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        """No more renewals from here."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def still_ours(self) -> bool:
        """The lease was held at the last renewal and no cancel was asked."""
        return self.beat.owned and not self.beat.cancel_requested

    def next_beat(self, timeout: float) -> Heartbeat | None:
        """The answer of a renewal not read before, waiting up to `timeout` seconds for one; None
        if none came (the database briefly down keeps the job running: retried at the next beat)."""
        with self._renewed:
            if self._renewals == self._read:
                self._renewed.wait(timeout)
            if self._renewals == self._read:
                return None
            self._read = self._renewals
            return self.beat

    def _run(self) -> None:
        while not self._stopped.wait(self.every):
            try:
                with session_scope(self.url) as s:
                    beat = renew_lease(s, self.job_id, self.owner, self.lease_seconds)
            except Exception as exc:  # the database briefly down: retried at the next beat
                log.warning("heartbeat for %s failed (%s); retrying", self.job_id, type(exc).__name__)
                continue
            with self._renewed:
                self.beat = beat
                self._renewals += 1
                self._renewed.notify_all()
