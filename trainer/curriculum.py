"""Difficulty-aware question selection for GRPO (`PassRateCurriculum`): each question's pass rate, kept
from the rollouts themselves, decides how often it is drawn.

Questions are drawn in proportion to the learnability p(1 - p) (Foster and Foerster 2025,
arXiv:2502.12272) plus `floor`, where p is an exponential moving average of the question's group
pass rates (`decay` per new group; 1/2 for one not yet seen). The state is saved in every checkpoint
(STATE_FILE) and restored on resume; draws are seeded by (seed, step, round, rank), so a resumed run
draws what the uninterrupted one drew. docs/grpo-loop.md, "Curriculum"."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

STATE_FILE = "curriculum.json"


class PassRateCurriculum:
    def __init__(self, size: int, seed: int, decay: float = 0.5, floor: float = 0.01) -> None:
        self.size, self.seed, self.decay, self.floor = size, seed, decay, floor
        self.pass_rate = np.full(size, 0.5)
        self.seen = np.zeros(size, dtype=np.int64)

    def weights(self) -> np.ndarray:
        w = self.pass_rate * (1.0 - self.pass_rate) + self.floor
        return np.asarray(w / w.sum())

    def draw(self, n: int, step: int, round_: int, rank: int) -> list[int]:
        """n question indices (distinct while the set has n), weighted by learnability."""
        rng = np.random.default_rng([self.seed, step, round_, rank])
        replace = n > self.size
        return [int(i) for i in rng.choice(self.size, size=n, replace=replace, p=self.weights())]

    def update(self, outcomes: list[tuple[int, float]]) -> None:
        """Fold in (question index, the pass rate of one group on it), in order."""
        for i, rate in outcomes:
            self.pass_rate[i] = rate if self.seen[i] == 0 else (1 - self.decay) * self.pass_rate[i] + self.decay * rate
            self.seen[i] += 1

    def summary(self) -> dict[str, float]:
        """What a step logs: how much of the set has been seen, and how much of it sits at the edges."""
        seen = self.seen > 0
        rates = self.pass_rate[seen]
        return {
            "curriculum/seen_fraction": float(seen.mean()),
            "curriculum/solved_fraction": float((rates >= 0.99).sum() / self.size),
            "curriculum/unsolved_fraction": float((rates <= 0.01).sum() / self.size),
        }

    def save(self, directory: str | Path) -> None:
        state = {
            "size": self.size,
            "seed": self.seed,
            "decay": self.decay,
            "floor": self.floor,
            "pass_rate": self.pass_rate.tolist(),
            "seen": self.seen.tolist(),
        }
        (Path(directory) / STATE_FILE).write_text(json.dumps(state))

    def load(self, directory: str | Path) -> bool:
        """Restore the state a checkpoint holds; False when it holds none (a run that had no
        curriculum then: the table starts fresh)."""
        path = Path(directory) / STATE_FILE
        if not path.exists():
            return False
        state = json.loads(path.read_text())
        if state["size"] != self.size:
            raise ValueError(
                f"{path} holds a curriculum over {state['size']} questions, but this run's set has {self.size}: "
                "resume with the same dataset"
            )
        self.pass_rate = np.asarray(state["pass_rate"], dtype=np.float64)
        self.seen = np.asarray(state["seen"], dtype=np.int64)
        return True
