"""Where a learner computes: the ``device`` setting ("cpu", "cuda", "auto") and its checks.

:attr:`TrainConfig.device <impl.rl.config.TrainConfig.device>` names it; the learners of DQN,
TD3 and A2C (and PAAC's batched inference) keep their networks, optimizer state and targets
there. Actors always run CPU copies of the policy.

- ``"cpu"``: every tensor in host memory; the arithmetic is today's, bit for bit (a tensor's
  ``.to(cpu)`` and ``.cpu()`` return the tensor itself).
- ``"cuda"``: torch's current CUDA device; refused (:func:`check_device`) where torch sees
  none.
- ``"auto"``: ``"cuda"`` where ``torch.cuda.is_available()``, else ``"cpu"``.

:func:`host_arrays` brings a learner's results back to numpy with ONE device-to-host copy (a
copy synchronises with the device, so a learner pays one wait per update, not one per value).
:class:`HostCopies` starts that copy without waiting for it, so that a learner whose
priorities may arrive one update late (:attr:`TrainConfig.priority_lag
<impl.rl.config.TrainConfig.priority_lag>`) waits for update ``n`` only after it has queued
update ``n + 1``.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from replaybench.impl.machine import cpu_model
from replaybench.impl.rl.common.errors import ConfigError

__all__ = ["DEVICES", "check_device", "unavailable_reason", "resolve_device", "device_name", "on_device",
           "host_arrays", "HostCopies", "PendingHost", "warm_up_learner"]

DEVICES = ("cpu", "cuda", "auto")


def check_device(value) -> None:
    """Raise ConfigError (field "device") unless ``value`` is one of :data:`DEVICES` and can
    run here (:func:`unavailable_reason`). Cost: one ``torch.cuda.is_available()`` (it loads
    the driver, without making a CUDA context)."""
    if not isinstance(value, str) or value not in DEVICES:
        raise ConfigError("device", value, f"device must be one of {DEVICES}, got {value!r}")
    reason = unavailable_reason(value)
    if reason is not None:
        raise ConfigError("device", value, f"device {value!r} is unavailable: {reason}")


def unavailable_reason(value: str) -> str | None:
    """Why ``value`` (one of :data:`DEVICES`) cannot run here, or None ("cpu" and "auto"
    always can)."""
    if value == "cuda" and not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return None


def resolve_device(value: str) -> torch.device:
    """The torch device ``value`` (checked by :func:`check_device`) names here: "auto" becomes
    "cuda" where torch sees a GPU, else "cpu"."""
    if value == "auto":
        value = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(value)


def device_name(device: torch.device) -> str:
    """What the rows call ``device``: the GPU's name (``torch.cuda.get_device_name``, which
    makes a CUDA context in this process) or the CPU's model (:func:`~impl.machine.cpu_model`)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model() or "cpu"


def on_device(x, device: torch.device) -> torch.Tensor:
    """``x`` (a numpy array, viewed without a copy, or a tensor) as a tensor on ``device``:
    the same memory when it is there already (always so on the CPU), else a copy (from a numpy
    array, a synchronous one; :mod:`impl.rl.common.device_feed` hands learners batches already
    on the device)."""
    return (x if isinstance(x, torch.Tensor) else torch.from_numpy(x)).to(device)


def host_arrays(*tensors: torch.Tensor) -> list[np.ndarray]:
    """``tensors`` (detached) as numpy arrays of their shapes, in order.

    On the CPU each is the tensor's own memory (no copy; the arithmetic the caller did is
    untouched). On another device they are flattened into one float32 tensor there and copied
    to the host once (one synchronisation), then split; every tensor must be float32 (the
    learners' losses, priorities and statistics are), so the values are the device's bits.
    """
    if all(t.device.type == "cpu" for t in tensors):
        return [t.detach().numpy() for t in tensors]
    for t in tensors:
        if t.dtype != torch.float32:
            raise TypeError(f"host_arrays takes float32 tensors off the CPU, got {t.dtype}")
    flat = torch.cat([t.detach().reshape(-1) for t in tensors]).cpu().numpy()
    out, offset = [], 0
    for t in tensors:
        out.append(flat[offset: offset + t.numel()].reshape(t.shape))
        offset += t.numel()
    return out


class PendingHost:
    """Tensors on their way to the host (:meth:`HostCopies.start`): :meth:`result` waits for
    their copy and returns them as numpy arrays, once."""

    def __init__(self, arrays=None, *, owner=None, slot: int = -1, event=None, shapes=()):
        self._arrays, self._owner, self._slot, self._event, self._shapes = arrays, owner, slot, event, shapes

    def result(self) -> list[np.ndarray]:
        """The tensors as numpy arrays of their shapes, in order (as :func:`host_arrays` gives
        them). Off the CPU: waits for this copy only (not for later work on the device) and
        copies the values out of the pinned slot, which is then free. RuntimeError on a second
        call there."""
        if self._owner is None:
            return self._arrays
        if self._event is None:
            raise RuntimeError("this copy's result was taken already: its pinned slot has been reused")
        self._event.synchronize()
        self._event = None
        flat = self._owner._slots[self._slot].numpy()
        out, offset = [], 0
        for shape in self._shapes:
            size = int(np.prod(shape, dtype=np.int64))
            out.append(flat[offset: offset + size].reshape(shape).copy())
            offset += size
        self._owner._open[self._slot] = False
        return out


class HostCopies:
    """Device-to-host copies of a learner's float32 results that do not wait for the device.

    :meth:`start` queues ONE copy of its tensors (flattened together on the device) into a
    page-locked host slot, on the current stream behind the work that computes them, and
    returns a :class:`PendingHost` at once; its ``result()`` waits for that copy alone. So a
    learner can queue update ``n + 1`` before it waits for update ``n``'s priorities, and the
    device computes while the host samples and writes priorities. ``slots`` copies may be in
    flight; a slot is free again once its result was taken (RuntimeError when :meth:`start`
    finds every slot still owed: take results in order, at most ``slots`` behind).

    On the CPU nothing is copied: :meth:`start` returns the tensors' own memory, as
    :func:`host_arrays` does (bit for bit what the learner computed). Each slot holds
    ``capacity`` float32 values, allocated once (again, larger, for a larger call made with no
    copy owed). Thread-safety: one thread.
    """

    def __init__(self, device: torch.device, capacity: int, slots: int = 2):
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise ValueError(f"slots must be a positive int, got {slots!r}")
        self.device = torch.device(device)
        self.capacity = capacity
        on_host = self.device.type == "cpu"
        self._slots = [] if on_host else [torch.empty(capacity, dtype=torch.float32, pin_memory=True)
                                          for _ in range(slots)]
        self._open = [False] * len(self._slots)
        self._next = 0

    def start(self, *tensors: torch.Tensor) -> PendingHost:
        """Queue the copy of ``tensors`` (detached; float32 off the CPU) and return its
        :class:`PendingHost`. TypeError for a tensor that is not float32, ValueError for more than
        ``capacity`` values while a copy is owed, before anything is queued."""
        if not self._slots:  # a CPU learner's: its own memory
            return PendingHost(host_arrays(*tensors))
        for t in tensors:
            if t.dtype != torch.float32:
                raise TypeError(f"HostCopies takes float32 tensors off the CPU, got {t.dtype}")
        size = sum(t.numel() for t in tensors)
        slot = self._next
        if size > self.capacity and not any(self._open):  # a bigger batch than the config's: grow (rare)
            self.capacity = size
            self._slots = [torch.empty(size, dtype=torch.float32, pin_memory=True) for _ in self._slots]
        if size > self.capacity:
            raise ValueError(f"the tensors hold {size} values, more than this copier's {self.capacity} while copies "
                             "are owed: take their results first")
        if self._open[slot]:
            raise RuntimeError(f"every one of the {len(self._slots)} pinned slots still holds a copy whose result "
                               "was not taken: take results in order, at most that many behind")
        self._next = (slot + 1) % len(self._slots)
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        self._slots[slot][:size].copy_(flat, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._open[slot] = True
        return PendingHost(owner=self, slot=slot, event=event, shapes=[tuple(t.shape) for t in tensors])


def warm_up_learner(learner_cls, spaces, cfg, seed: int, device: torch.device, batch: dict, calls: int = 5) -> float:
    """Pay before a run the one-time work its learner's first updates would pay on ``device``, and
    return the seconds of the warm-up's updates (those costs plus ``calls`` ordinary updates; not
    the build, which the run's learner would pay before the run anyway, the first in a process
    loading torch's own parts). A learner of ``learner_cls``, built as the run's is (``spaces,
    cfg, seed``: the same networks and shapes), takes ``calls`` updates on ``batch`` (zeros of a
    sample's fields and shapes) and is dropped. What that loads is the process's, so the run's
    learner does not load it again: the device's kernels (loaded on first use), cuBLAS's handles
    and workspaces, cuDNN's algorithm choices. The run's learner still makes its own CUDA graph
    (:class:`~impl.cuda_graph.GraphedStep`: its first calls, now without those costs).

    Call it before the run's learner is built: building a learner seeds torch's generator
    (``torch.manual_seed(seed)``), so one built after it starts as it would without the warm-up,
    and a run is bit for bit the same on the CPU. ``calls`` (default 5) covers a graphed
    learner's eager calls, its capture and a replay. Cost: ``calls`` updates plus those one-time
    costs; on the CPU a few milliseconds."""
    learner = learner_cls(spaces, cfg, seed, device=device)
    t0 = time.perf_counter()
    for _ in range(calls):
        learner.learn(batch)
    del learner
    return time.perf_counter() - t0
