"""Our prioritized buffers inside other RL frameworks, behind each framework's own interface.

One module per framework; importing it imports the framework, and raises ImportError naming
the optional extra to install when the framework is missing (:func:`availability` says so
without raising):

=============================  ==========================================  ==================
module                         what it offers                              extra
=============================  ==========================================  ==================
``replaybench.adapters.sb3``   ``PrioritizedReplayBuffer`` for             ``[sb3]``
                               ``DQN(replay_buffer_class=...)`` and
                               ``PrioritizedDQN`` (weighted loss,
                               |TD error| written back)
``replaybench.adapters.        ``PrioritizedReplayBuffer`` with Tianshou's   ``[tianshou]``
tianshou``                     API (``add``, ``sample``, ``get_weight``,
                               ``update_weight``, ``set_beta``), and
                               ``PrioritizedVectorReplayBuffer`` (one
                               sub-buffer per vectorised environment)
``replaybench.adapters.        ``PrioritizedSampler`` with TorchRL's API,    ``[torchrl]``
torchrl``                      for a ``TensorDictReplayBuffer``
=============================  ==========================================  ==================

Every adapter keeps its priorities in a registered variant's sum tree (``variant=`` names it,
default ``"kary-aligned"``), so what is plugged in is exactly what the benchmarks measure.
"""

from __future__ import annotations

from replaybench.adapters._core import FRAMEWORKS, availability

__all__ = ["FRAMEWORKS", "availability"]
