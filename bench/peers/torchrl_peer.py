"""TorchRL's PrioritizedReplayBuffer on the micro workloads (variant ``peer:torchrl``).

TorchRL (https://pytorch.org/rl) keeps transitions in a TensorDict storage and priorities in
C++ sum and min segment trees (``torchrl._torchrl.SumSegmentTreeFp32`` /
``MinSegmentTreeFp32``: binary, float32). Those trees live in TorchRL's compiled extension, so
the buffer needs it: :func:`version` imports it explicitly, and a TorchRL whose extension does
not load against the installed torch is recorded as ``unavailable`` with that import error.

Status here: with torch 2.13.0+cpu (pinned), the registry releases fail to load their
extension with an undefined C++ symbol (torchrl 0.12.0, 0.13.3 and 0.14.1 with their
tensordict: ``undefined symbol: _ZN5torch8autograd10deleteNodeEPNS0_4NodeE``), and so do the
torchrl-nightly builds of 2026-08-05 and 2026-10-27 (``undefined symbol:
_ZN5torch8autograd13_wrap_outputs...``). The nightly pair ``torchrl-nightly==2026.7.1`` +
``tensordict-nightly==2026.7.1`` loads and runs with torch 2.13.0+cpu, and pip keeps torch
as it is when installing it, so that pair is what the ``peers`` extra pins. If it ever fails
to load, the run records ``peer:torchrl`` as unavailable with the import error.

The adapter builds ``PrioritizedReplayBuffer(alpha=0.6, beta=0.4,
storage=LazyTensorStorage(capacity))`` and otherwise keeps TorchRL's defaults:

- Priorities: stored as ``(priority + eps) ** alpha`` with eps = 1e-8 (ours 1e-6): alpha is
  applied inside. New transitions get ``(max_priority + eps) ** alpha``, the running maximum
  over all updates (``max_priority_within_buffer=False``, the default). ``update_priority``
  takes torch tensors and needs float32 priorities for the float32 trees, so the adapter's
  update converts indices and priorities with ``torch.as_tensor`` (inside the one wrapper).
- Weights: ``(p_j / p_min) ** -beta`` with ``p_min`` the smallest stored priority (the min
  tree), i.e. normalised by the global minimum, as ours; returned as float32 ``priority_weight`` of shape ``(batch,)`` with the indices
  ``index`` (int64) in the info dict (``return_info=True``).
- ``extend(TensorDict)`` adds a batch (torch tensors made from our NumPy arrays with
  ``torch.from_numpy``, no copy, inside the one wrapper); scalar fields keep shape ``(batch,)``.
- Sampling draws positions with torch's global generator, seeded from the benchmark's.
- ``target(..., device="cuda")`` puts the storage on the GPU (``LazyTensorStorage(capacity,
  device=...)``): the rows live and are gathered there, while the sum and min trees stay
  TorchRL's C++ ones in host memory. The gpu scenario (bench/scenarios/gpu.py) measures it
  beside the GPU tree; :data:`DEVICES` lists what ``device`` takes.
"""

from __future__ import annotations

import numpy as np

from replaybench.bench.workloads import Target

__all__ = ["NAME", "STRUCTURE", "PARAMS", "DESCRIPTION", "FORK_AFTER_USE", "DEVICES", "version", "target"]

NAME = "torchrl"
STRUCTURE = "torchrl-segment-tree"
PARAMS = {"K": 2, "dtype": "float32", "alpha": 0.6, "beta": 0.4, "eps": 1e-8}
DESCRIPTION = "torchrl.data.PrioritizedReplayBuffer over LazyTensorStorage (peer library)"
#: A process that ran torch ops must not fork (workers are forked from an importing manager).
FORK_AFTER_USE = False
#: Where :func:`target` can put the storage (its ``device``).
DEVICES = ("cpu", "cuda")


def version() -> str:
    """TorchRL's version; raises ImportError when it, or its C++ segment trees, fail to load."""
    import torchrl
    from torchrl._torchrl import MinSegmentTreeFp32, SumSegmentTreeFp32  # noqa: F401  (the extension)
    from importlib.metadata import PackageNotFoundError, version as dist_version

    for dist in ("torchrl", "torchrl-nightly"):
        try:
            return f"{dist} {dist_version(dist)}"
        except PackageNotFoundError:
            pass
    return f"torchrl {torchrl.__version__}"


def target(capacity: int, fields: dict, rng: np.random.Generator, device: str = "cpu") -> Target:
    """The buffer's entry points; ``device`` (one of :data:`DEVICES`) is the storage's."""
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    torch.manual_seed(int(rng.integers(2**31)))
    rb = PrioritizedReplayBuffer(alpha=PARAMS["alpha"], beta=PARAMS["beta"], eps=PARAMS["eps"],
                                 storage=LazyTensorStorage(capacity, device=torch.device(device)))
    extend, rb_sample, update = rb.extend, rb.sample, rb.update_priority
    from_numpy = torch.from_numpy

    def as_td(batch):
        n = len(next(iter(batch.values())))
        return TensorDict({k: from_numpy(v) for k, v in batch.items()}, batch_size=[n])

    def add(batch):
        extend(as_td(batch))

    def sample(n):
        data, info = rb_sample(n, return_info=True)
        return {"indices": info["index"], "weights": info["priority_weight"], "data": data}

    def update_priorities(indices, priorities):
        update(torch.as_tensor(indices), torch.as_tensor(priorities, dtype=torch.float32))

    def fill_add(batch, priorities):
        index = extend(as_td(batch))
        update(index, torch.as_tensor(priorities, dtype=torch.float32))

    return Target(rb, add, sample, update_priorities, "indices", fill_add)
