"""Replay samples to a learner's device through pinned host memory preallocated once.

A learner on a GPU (:mod:`impl.rl.common.device`) reads its batch from device memory. A copy
from pageable host memory is synchronous (the CPU waits for the bus); from page-locked
("pinned") memory it is a DMA the CPU only enqueues (``non_blocking=True``). So
:class:`PinnedBatchFeed` keeps, per output slot of the sampler (the process engine's learner
has one slot, or two with ``learner_prefetch``), ONE pinned host buffer and ONE device buffer,
both allocated once, each field a view into them at a 64-byte-aligned offset:

    sample n into the sampler's slot s  ->  copy the fields the learner reads into pinned slot s
    -> enqueue ONE copy pinned slot s -> device slot s (non_blocking) on the current stream,
       record an event
    -> hand the learner device slot s's field views (the sampler's other fields, indices,
       stamps, actor ids, stay host arrays for the priority update)

One copy per batch instead of one per field: each enqueued copy costs the CPU a launch, which
is what a GPU learner's loop is bound by; and no device allocation per batch.

Before pinned slot ``s`` is written again (sample n + slots) the feed waits for the event of
its last copy: the DMA must have read it. Device slot ``s`` is overwritten by that next copy,
which is enqueued on the stream the learner's kernels run on (the default stream: the
prefetching thread and the learner share it), so it runs after every kernel enqueued before it
that reads the slot, with no further synchronisation; with prefetch the sample and the host copy
of update n + 1 run on the helper thread while update n runs. A batch handed over is valid until
its slot is staged again (as the sampler's own outputs are).

On the CPU a feed is not used (the learner reads the sampler's arrays, as it always has); the
tests run one with ``pin=False`` on the CPU to check that it hands over the same batches in the
same order.

Thread-safety: one feed per sampler; :meth:`stage` for a slot is called by one thread at a
time (the sampler's slots are used in turn). Cost per :meth:`stage`: one host memcpy of the
batch's learner fields (O(batch bytes)) plus one enqueued copy.
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
        layout, nbytes = [], 0
        for f in self.fields:
            arr = np.asarray(template[f])
            nbytes = -(-nbytes // _ALIGN) * _ALIGN  # each field starts on its own cache line
            layout.append((f, nbytes, arr.shape, arr.dtype))
            nbytes += arr.nbytes
        self._host = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin) for _ in range(slots)]
        self._dev = [torch.empty(nbytes, dtype=torch.uint8, device=self.device) for _ in range(slots)]
        self.staging = [_views(buf, layout) for buf in self._host]  # pinned host tensors, per slot and field
        self._targets = [_views(buf, layout) for buf in self._dev]  # what the learner gets, per slot and field
        self._np = [{f: t.numpy() for f, t in slot.items()} for slot in self.staging]
        self._copied: list = [None] * slots  # per slot: the event after its last copy to the device

    def stage(self, batch: dict, slot: int) -> dict:
        """``batch`` with its learner fields as tensors on the device (the copy enqueued, not
        finished: use them on the current stream; the same tensors each time ``slot`` is
        staged); the other fields are ``batch``'s own. Waits first for the previous copy out of
        ``slot`` to finish."""
        event = self._copied[slot]
        if event is not None:
            event.synchronize()  # the DMA out of this pinned slot has read it: it may be overwritten
        views = self._np[slot]
        for f in self.fields:
            np.copyto(views[f], batch[f])
        self._dev[slot].copy_(self._host[slot], non_blocking=self.pin)
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self._copied[slot] = event
        return {**batch, **self._targets[slot]}


_ALIGN = 64  # bytes: each field's offset in a slot's buffer (a cache line; CUDA needs 16 at most)


def _views(buf: torch.Tensor, layout) -> dict:
    """Each field of ``layout`` ((name, byte offset, shape, numpy dtype) each) as a tensor view
    into the uint8 tensor ``buf``."""
    out = {}
    for f, offset, shape, dtype in layout:
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        out[f] = buf[offset: offset + size].view(torch.from_numpy(np.empty(0, dtype)).dtype).view(shape)
    return out
