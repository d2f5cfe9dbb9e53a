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
"""

from __future__ import annotations

import numpy as np
import torch
from replaybench.impl.machine import cpu_model
from replaybench.impl.rl.common.errors import ConfigError

__all__ = ["DEVICES", "check_device", "unavailable_reason", "resolve_device", "device_name", "on_device",
           "host_arrays"]

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
