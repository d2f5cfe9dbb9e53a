"""Replay samples to a learner's device through pinned host memory preallocated once.

A learner on a GPU (:mod:`impl.rl.common.device`) reads its batch from device memory. A copy
from pageable host memory is synchronous (the CPU waits for the bus); from page-locked
("pinned") memory it is a DMA the CPU only enqueues (``non_blocking=True``). So
:class:`PinnedBatchFeed` keeps one set of pinned tensors per output slot of the sampler (the
process engine's learner has one slot, or two with ``learner_prefetch``), allocated once:

    sample n into the sampler's slot s  ->  copy the fields the learner reads into pinned slot s
    -> enqueue slot s -> device (non_blocking) on the current stream, record an event
    -> hand the learner device tensors (the sampler's other fields, indices, stamps, actor ids,
       stay host arrays for the priority update)

Before pinned slot ``s`` is written again (sample n + slots) the feed waits for the event of
its last copy: the DMA must have read it. The device tensors come from torch's caching
allocator on the stream the copy was enqueued on, which is the learner's (the default stream:
the prefetching thread and the learner share it), so the learner's kernels run after the copy
in stream order with no further synchronisation; with prefetch the sample and the host copy of
update n + 1 run on the helper thread while update n runs.

On the CPU a feed is not used (the learner reads the sampler's arrays, as it always has); the
tests run one with ``pin=False`` on the CPU, where ``.to(cpu)`` returns the staging tensor
itself, to check that it hands over the same batches in the same order.

Thread-safety: one feed per sampler; :meth:`stage` for a slot is called by one thread at a
time (the sampler's slots are used in turn). Cost per :meth:`stage`: one host memcpy of the
batch's learner fields (O(batch bytes)) plus one enqueued copy per field.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["PinnedBatchFeed"]


class PinnedBatchFeed:
    """Stage host batches into pinned slots and start their copies to ``device``.

    Parameters
    ----------
    template : dict of numpy arrays
        A batch of the shapes and dtypes to expect (a sampler's output, e.g.
        ``buf.sample_out(batch_size)``); only ``fields`` of it are staged.
    fields : sequence of str
        The fields the learner reads (:data:`~impl.rl.algorithms.base.LEARNER_FIELDS`); the
        others pass through as they are.
    device : torch.device
    slots : int
        Staging slots, one per sampler output slot (they are used as the sampler uses its own).
    pin : bool, optional
        Page-lock the staging memory (default: when ``device`` is a CUDA device).
    """

    def __init__(self, template: dict, fields, device: torch.device, slots: int, pin: bool | None = None):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots!r}")
        missing = [f for f in fields if f not in template]
        if missing:
            raise ValueError(f"fields {missing} are not in the batch (it has {sorted(template)})")
        self.device = torch.device(device)
        self.pin = self.device.type == "cuda" if pin is None else bool(pin)
        self.fields = tuple(fields)
        self.staging = [{f: torch.empty(np.shape(template[f]), dtype=torch.from_numpy(np.asarray(template[f])).dtype,
                                        pin_memory=self.pin) for f in self.fields} for _ in range(slots)]
        self._views = [{f: t.numpy() for f, t in slot.items()} for slot in self.staging]
        self._copied: list = [None] * slots  # per slot: the event after its last copy to the device

    def stage(self, batch: dict, slot: int) -> dict:
        """``batch`` with its learner fields as tensors on the device (copies enqueued, not
        finished: use them on the current stream); the other fields are ``batch``'s own.
        Waits first for the previous copy out of ``slot`` to finish."""
        event = self._copied[slot]
        if event is not None:
            event.synchronize()  # the DMA out of this pinned slot has read it: it may be overwritten
        views = self._views[slot]
        out = dict(batch)
        for f in self.fields:
            np.copyto(views[f], batch[f])
            out[f] = self.staging[slot][f].to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self._copied[slot] = event
        return out
