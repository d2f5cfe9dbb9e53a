"""The DQN update as compiled kernels (:mod:`impl.rl.algorithms.mlp_kernels`) over flat vectors
that a learner's torch networks are views of: :class:`CompiledDQNStep`.

The torch modules stay the learner's networks: their parameters become views of the online and
target vectors (:func:`~impl.rl.algorithms.mlp_kernels.bind_module`), and the online network's
``.grad`` views of the gradient vector, so actors sharing the network, flat-weight broadcasts,
digests and a gradient hook (the L-learner all-reduce, which averages ``p.grad`` in place
between the gradients and the step) work unchanged. Adam's moments and step count live here.

The matrix products run through numpy's BLAS on one thread: the first step limits the process's
BLAS pools to one thread (threadpoolctl), since products this small lose more to the threads'
hand-offs than they gain, and a learner already owns its core.
"""

from __future__ import annotations

import numpy as np

from replaybench.impl.rl.algorithms import mlp_kernels as mk

__all__ = ["CompiledDQNStep", "BATCH_FIELDS"]

#: The batch fields an update reads, with the dtypes the kernels take.
BATCH_FIELDS = {"obs": np.float32, "action": np.int64, "reward": np.float32, "next_obs": np.float32,
                "done": np.bool_, "weights": np.float32}

_ADAM_BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which the eager step uses
_ADAM_EPS = 1e-8
_BLAS_LIMITED = []  # threadpoolctl's limiter, once set for this process


def _one_blas_thread() -> None:
    if not _BLAS_LIMITED:
        import scipy.linalg.cython_blas  # noqa: F401  the BLAS numba's np.dot calls: loaded, so the limit reaches it
        from threadpoolctl import threadpool_limits

        _BLAS_LIMITED.append(threadpool_limits(1, user_api="blas"))


def _host(x, dtype) -> np.ndarray:
    """``x`` (a numpy array or a CPU tensor) as a C-contiguous numpy array of ``dtype`` (no copy
    when it is one already)."""
    if not isinstance(x, np.ndarray):
        x = x.detach().numpy()
    return np.ascontiguousarray(x, dtype=dtype)


class CompiledDQNStep:
    """One DQN update per :meth:`learn` on ``q`` and ``target`` (ReLU MLPs of the same shape,
    on the CPU), with ``cfg``'s gamma, double_q, lr and max_grad_norm: the arithmetic of
    :meth:`impl.rl.algorithms.dqn.DQNLearner._step` followed by its Adam step.

    Cost per :meth:`learn`: three forwards (online on obs and next_obs, target on next_obs), one
    backward, one pass of clipping and Adam over the parameters; scratch arrays are reused
    across updates of the same batch size. Thread-safety: none.
    """

    def __init__(self, q, target, cfg):
        from torch import nn
        import torch

        linears = [m for m in q.modules() if isinstance(m, nn.Linear)]
        self.layout = mk.MLPLayout((linears[0].in_features, *(m.out_features for m in linears)))
        self.cfg = cfg
        size = self.layout.size
        self.online = np.zeros(size, np.float32)
        self.target = np.zeros(size, np.float32)
        mk.bind_module(q, self.layout, self.online)
        mk.bind_module(target, self.layout, self.target)
        self.grads = np.zeros(size, np.float32)
        for m, at in zip(linears, self.layout.offsets):
            o, i = m.out_features, m.in_features
            m.weight.grad = torch.from_numpy(self.grads[at:at + o * i].reshape(o, i))
            m.bias.grad = torch.from_numpy(self.grads[at + o * i:at + o * i + o])
        self.params = list(q.parameters())
        self.m = np.zeros(size, np.float32)
        self.v = np.zeros(size, np.float32)
        self.step = np.zeros(1, np.float32)
        self.offsets, self.dims = self.layout.offsets, self.layout.dims
        self._scratch: dict[int, tuple] = {}

    def _buffers(self, rows: int) -> tuple:
        if rows not in self._scratch:
            def acts():
                return tuple(np.empty((rows, int(d)), np.float32) for d in self.dims[1:])

            self._scratch[rows] = (acts(), acts(), acts(), np.empty(rows, np.float32))
        return self._scratch[rows]

    def learn(self, batch: dict, grad_hook=None) -> tuple[float, np.ndarray]:
        """One update on ``batch`` (numpy arrays or CPU tensors of :data:`BATCH_FIELDS`);
        ``grad_hook(params)`` is called between the gradients and the step, as the eager
        learner calls it. Returns (loss, |TD errors| as float64)."""
        _one_blas_thread()
        cfg = self.cfg
        x = {f: _host(batch[f], dtype) for f, dtype in BATCH_FIELDS.items()}
        acts, next_acts, tacts, td = self._buffers(len(x["obs"]))
        obs = x["obs"].reshape(len(x["obs"]), -1)
        next_obs = x["next_obs"].reshape(len(x["next_obs"]), -1)
        loss = mk.dqn_gradients(self.online, self.target, self.offsets, self.dims, obs, x["action"].reshape(-1),
                                x["reward"].reshape(-1), next_obs, x["done"].reshape(-1), x["weights"].reshape(-1),
                                cfg.gamma, cfg.double_q, acts, next_acts, tacts, self.grads, td)
        if grad_hook is not None:
            grad_hook(self.params)
        max_norm = -1.0 if cfg.max_grad_norm is None else float(cfg.max_grad_norm)
        mk.clip_and_adam(self.online, self.grads, self.m, self.v, self.step, cfg.lr, *_ADAM_BETAS, _ADAM_EPS,
                         max_norm)
        return float(loss), td.astype(np.float64)

    def update_target(self, tau: float) -> None:
        """``target <- tau * online + (1 - tau) * target`` (1: a copy)."""
        mk.soft_update(self.target, self.online, tau)
