"""Per-project semaphores of this API process: how many of one project's calls of a kind run at once
(Tinker forwards, stream reads, large forward_backward bodies), so that one project's load waits its
own turn instead of taking the process's connections and threads from the others.

An asyncio semaphore is bound to the event loop it first waits on, so there is a set per loop, keyed
by the loop itself (weakly: a loop's set goes with it), not by id(loop), which a later loop may reuse."""

from __future__ import annotations

import asyncio
import weakref


class ProjectGates:
    def __init__(self, size: int) -> None:
        self.size = size
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Semaphore]] = (
            weakref.WeakKeyDictionary()
        )

    def of(self, project_id: str) -> asyncio.Semaphore:
        """The project's semaphore on the running loop, of `size` permits."""
        gates = self._by_loop.setdefault(asyncio.get_running_loop(), {})
        return gates.setdefault(project_id, asyncio.Semaphore(self.size))
