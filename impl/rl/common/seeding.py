"""One integer seeds a whole run: every random stream is a child of ``SeedSequence(seed)``.

    SeedSequence(seed).spawn(4) -> networks, buffer, actors, learners
        networks   torch.manual_seed of every learner (equal initial weights on every rank;
                   TD3's smoothing noise)
        buffer     sampling of the sequential loop's buffer / of the parallel loop's owner handle
        actors     .spawn(i + 1)[i] for actor i -> its envs' resets, its exploration, its buffer handle
        learners   .spawn(r + 1)[r] for learner r -> its buffer handle (which rows it samples)

The sequential loop is actor 0 and learner 0. A child's stream depends only on its position
(``SeedSequence.spawn`` numbers children 0, 1, ...), never on how many siblings a run has, so
actor 0 explores the same way with one actor or eight; and the streams are statistically
independent, which seeds like ``seed + 1000 * rank`` do not promise. The same holds for the
environments of an actor that steps several (``TrainConfig.envs_per_actor``): env ``j``'s seed
depends only on the run's seed, the actor's rank and ``j`` (:meth:`ActorSeeds.env_seed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ActorSeeds", "RunSeeds"]


def _int(seq: np.random.SeedSequence) -> int:
    """A 32-bit integer drawn from ``seq`` (for APIs that take an int: torch, gymnasium)."""
    return int(seq.generate_state(1, np.uint32)[0])


@dataclass(frozen=True)
class ActorSeeds:
    """An actor's three streams: ``envs`` (the parent of its environments' reset seeds, see
    :meth:`env_seed`), ``explore`` and ``buffer`` (SeedSequences for
    ``numpy.random.default_rng``)."""

    envs: np.random.SeedSequence
    explore: np.random.SeedSequence
    buffer: np.random.SeedSequence

    @property
    def env(self) -> int:
        """Seed of the actor's first environment (``env_seed(0)``)."""
        return self.env_seed(0)

    def env_seed(self, j: int) -> int:
        """The first-``reset`` seed of the actor's environment ``j`` (a non-negative int).

        Env 0 draws from the ``envs`` stream itself (so a one-env actor is seeded as it always
        was); env ``j >= 1`` from that stream's child ``j - 1``, built from its spawn key, so
        the seed depends on ``j`` alone, not on how many envs the actor has. Cost: microseconds.
        """
        if j < 0:
            raise ValueError(f"env index must be >= 0, got {j}")
        if j == 0:
            return _int(self.envs)
        child = np.random.SeedSequence(self.envs.entropy, spawn_key=(*self.envs.spawn_key, j - 1))
        return _int(child)


@dataclass(frozen=True)
class RunSeeds:
    """The streams of a run seeded with ``seed`` (a non-negative integer). Cost: microseconds."""

    seed: int

    def _children(self) -> list[np.random.SeedSequence]:
        return np.random.SeedSequence(self.seed).spawn(4)

    @property
    def networks(self) -> int:
        """torch seed of every learner."""
        return _int(self._children()[0])

    @property
    def buffer(self) -> np.random.SeedSequence:
        """Sampling stream of the run's own buffer handle."""
        return self._children()[1]

    def actor(self, rank: int) -> ActorSeeds:
        envs, explore, buffer = self._children()[2].spawn(rank + 1)[rank].spawn(3)
        return ActorSeeds(envs, explore, buffer)

    def learner(self, rank: int) -> np.random.SeedSequence:
        """Sampling stream of learner ``rank``'s buffer handle."""
        return self._children()[3].spawn(rank + 1)[rank]
