"""A capture-safe function replayed as one CUDA graph: a learner's update, a GPU buffer's sample.

Small tensor work on a GPU is bound by the CPU, not the GPU: each kernel of a small network's
update (three forwards, a backward, the gradient clip, Adam: ~60) or of a sum tree's sample (the
draws, the descent, the weights, the gather: ~75) costs the Python dispatcher and a launch,
about 10-20 us of CPU each, while the kernel itself runs in a few. A CUDA graph records the
kernels once and replays them with one launch, so a call costs one replay plus the copies of
its inputs into the graph's fixed input tensors.

:class:`GraphedStep` wraps ``fn(inputs) -> outputs`` (dicts/tuples of CUDA tensors):

- the first ``warmup`` calls run ``fn`` eagerly on a side stream (CUDA's capture rules: the
  allocator and libraries such as cuBLAS must have made their workspaces before a capture);
  each is a real call, with its effects (an optimizer step is taken);
- the next call copies its inputs into tensors of its own, captures ``fn`` into a graph over
  them (capture runs no kernel) and replays it: again one real call;
- every later call copies each input into the graph's input of that name (device-to-device,
  enqueued) and replays. The graph's inputs are its own, not the caller's buffers: a caller
  that refills its buffers from another thread (the learner's prefetch) cannot race a replay.
  The outputs are the same tensors every call, overwritten by the next replay: copy out what
  you keep (the learners copy them to the host at once).

Contract on ``fn``: capture-safe, i.e. no synchronisation with the host (no ``.item()``, no
``.cpu()``, no data-dependent Python branching), the same shapes and dtypes every call, and its
optimizer built with ``capturable=True`` (Adam keeps its step count on the device). What runs
is then the same arithmetic as the eager call, kernel for kernel; the results may differ from
an eager run in the last bits only where a library picks another algorithm under capture.

Thread-safety: one thread; the caller's current stream must be the one the inputs were made
on (the learners' default stream).
"""

from __future__ import annotations

import torch

__all__ = ["GraphedStep"]


class GraphedStep:
    """``fn`` eagerly for ``warmup`` calls, then captured once and replayed (see the module).

    Parameters
    ----------
    fn : callable
        ``fn(inputs: dict[str, Tensor]) -> tuple[Tensor, ...]``, capture-safe (module docstring).
    warmup : int
        Eager calls before the capture (>= 1: the libraries' workspaces are made by the first).
    """

    def __init__(self, fn, warmup: int = 3):
        if not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"warmup must be an int >= 1, got {warmup!r}")
        self.fn = fn
        self.warmup = warmup
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self._inputs: dict | None = None
        self._outputs = None

    @property
    def captured(self) -> bool:
        """Whether the graph exists (every call from now on is a replay)."""
        return self.graph is not None

    def __call__(self, inputs: dict):
        """``fn(inputs)``'s outputs (for a replay: the graph's own output tensors)."""
        self.calls += 1
        if self.graph is not None:
            if inputs.keys() != self._inputs.keys():
                raise ValueError(f"inputs {sorted(inputs)} differ from the captured ones {sorted(self._inputs)}")
            for name, value in inputs.items():
                static = self._inputs[name]
                if value.shape != static.shape or value.dtype != static.dtype:
                    raise ValueError(f"input {name!r} is {value.dtype} {tuple(value.shape)}, the graph was captured "
                                     f"for {static.dtype} {tuple(static.shape)}")
                static.copy_(value, non_blocking=True)
            self.graph.replay()
            return self._outputs
        if self.calls <= self.warmup:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())  # the inputs' copies were enqueued there
            with torch.cuda.stream(side):
                out = self.fn(inputs)
            torch.cuda.current_stream().wait_stream(side)
            return out
        self._inputs = {name: value.clone() for name, value in inputs.items()}  # torch.cuda.graph syncs first
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._outputs = self.fn(self._inputs)
        self.graph = graph
        graph.replay()
        return self._outputs
