"""A K-ary sum tree and the rows in a torch device's memory: the GPU tree (issue 40, item 3).

Built by :class:`impl.device_buffer.DeviceReplayBuffer` over
:class:`impl.trees.torch_tree.TorchSumTree`; ``device="auto"`` takes CUDA where torch sees a
GPU and the CPU otherwise, so the conformance suite runs the same code on either.
``output="host"`` (the default here) returns NumPy arrays, as every variant does, so the
variant drops into the suites, benchmarks and learners unchanged; ``output="device"`` returns
the tensors on the device (a GPU learner's batch then never crosses the bus), and on a CUDA
device its samples into a ``sample_out`` object are replayed as one CUDA graph
(``cuda_graph=True``; False keeps them eager, to measure the graph against). torch is
imported when a buffer is first built, not when the registry is listed.
"""

from replaybench.impl import registry

#: A process that ran torch ops must not fork (torch's thread pools do not survive it): the micro
#: scenario's pyperf manager, which forks its workers, only runs :func:`preload` for this variant
#: (bench/pyperf_worker.py), as for the torch-based peers (bench/peers/).
FORK_AFTER_USE = False


def preload() -> None:
    """Import what a buffer of this variant needs (torch: seconds), running no torch op."""
    import replaybench.impl.device_buffer  # noqa: F401


def torch_kary_buffer(capacity, fields, *, K=32, dtype="float32", device="auto", output="host", cuda_graph=True,
                      alpha=0.6, beta=0.4, eps=1e-6, stratified=False, seed=None, storage="auto", hugepages=False,
                      prefetch="auto"):
    """A :class:`~impl.device_buffer.DeviceReplayBuffer` (its docstring: parameters, costs,
    what crosses the bus)."""
    from replaybench.impl.device_buffer import DeviceReplayBuffer

    return DeviceReplayBuffer(capacity, fields, K=K, dtype=dtype, device=device, output=output,
                              cuda_graph=cuda_graph, alpha=alpha, beta=beta, eps=eps, stratified=stratified,
                              seed=seed, storage=storage, hugepages=hugepages, prefetch=prefetch)


registry.register(
    "torch-kary", torch_kary_buffer, structure="torch-kary",
    params={"K": 32, "dtype": "float32", "device": "auto", "output": "host", "cuda_graph": True},
    description="K-ary sum tree and rows as torch tensors on a device (a GPU where torch sees one)",
)
