"""The :class:`Schedule` container: who runs what, in which order, on which rank."""

from __future__ import annotations

from dataclasses import dataclass

from .actions import Action, add_communication


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered action lists of one pipelined training step.

    ``stages`` is the number of pipeline ranks p; each holds ``chunks`` = v model chunks,
    so the model is cut into ``n_stages`` = p * v stages and stage s lives on rank s % p
    (Megatron's interleaved layout; with v = 1 stage s is rank s). ``actions[r]`` is rank
    r's list, compute and communication (see :mod:`.actions`).
    """

    name: str
    stages: int
    microbatches: int
    chunks: int
    actions: tuple[tuple[Action, ...], ...]

    @classmethod
    def from_compute(cls, name, compute, microbatches: int, chunks: int = 1) -> "Schedule":
        """Build a schedule from per-rank compute-only lists (F/B/I/W) by adding the sends/receives."""
        p = len(compute)
        lowered = add_communication([list(a) for a in compute], lambda s: s % p)
        return cls(name, p, microbatches, chunks, tuple(tuple(a) for a in lowered))

    @property
    def n_stages(self) -> int:
        return self.stages * self.chunks

    def rank_of(self, stage: int) -> int:
        """The rank that holds model stage ``stage``."""
        return stage % self.stages

    def compute(self, rank: int) -> list[Action]:
        """Rank ``rank``'s compute actions (F/B/I/W) in order."""
        return [a for a in self.actions[rank] if a.is_compute]

    def __str__(self) -> str:
        head = f"{self.name}: {self.stages} ranks x {self.chunks} chunk(s), {self.microbatches} micro-batches"
        rows = [f"rank {r}: " + " ".join(map(str, self.compute(r))) for r in range(self.stages)]
        return "\n".join([head, *rows])
