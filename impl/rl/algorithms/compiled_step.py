"""The DQN and TD3 updates as compiled kernels (:mod:`impl.rl.algorithms.mlp_kernels`,
:mod:`impl.rl.algorithms.td3_kernels`) over flat vectors that a learner's torch networks are
views of: :class:`CompiledDQNStep`, :class:`CompiledTD3Step`.

The torch modules stay the learner's networks: their parameters become views of the online and
target vectors (:func:`~impl.rl.algorithms.mlp_kernels.bind_module`), and the trained networks'
``.grad`` views of the gradient vector, so actors sharing the network, flat-weight broadcasts,
digests and a gradient hook (the L-learner all-reduce, which averages ``p.grad`` in place
between the gradients and the step) work unchanged. Adam's moments and step counts live here.

The matrix products run through numpy's BLAS on one thread: the first step limits the process's
BLAS pools to one thread (threadpoolctl), since products this small lose more to the threads'
hand-offs than they gain, and a learner already owns its core.
"""

from __future__ import annotations

import numpy as np

from replaybench.impl.rl.algorithms import mlp_kernels as mk
from replaybench.impl.rl.algorithms import td3_kernels as td3k

__all__ = ["CompiledDQNStep", "CompiledTD3Step", "BATCH_FIELDS"]

#: The batch fields a DQN update reads, with the dtypes the kernels take (a TD3 update's are the
#: same but for its float32 actions).
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


def _layout(module) -> mk.MLPLayout:
    """The layout of ``module``'s Linear layers (an :func:`impl.rl.algorithms.nets.mlp`)."""
    from torch import nn

    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    return mk.MLPLayout((linears[0].in_features, *(m.out_features for m in linears)))


def _bind_grads(module, layout: mk.MLPLayout, grads: np.ndarray) -> None:
    """Make the ``.grad`` of ``module``'s parameters views of ``grads`` (``layout``), so that a
    gradient hook reads and writes the vector the kernels fill and Adam reads."""
    import torch
    from torch import nn

    for m, at in zip([m for m in module.modules() if isinstance(m, nn.Linear)], layout.offsets):
        o, i = m.out_features, m.in_features
        m.weight.grad = torch.from_numpy(grads[at:at + o * i].reshape(o, i))
        m.bias.grad = torch.from_numpy(grads[at + o * i:at + o * i + o])


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

    Cost per :meth:`learn`: two forwards (online on obs and next_obs stacked, target on
    next_obs), one backward, one pass of clipping and Adam over the parameters; scratch arrays are reused
    across updates of the same batch size. Thread-safety: none.
    """

    def __init__(self, q, target, cfg):
        self.layout = _layout(q)
        self.cfg = cfg
        size = self.layout.size
        self.online = np.zeros(size, np.float32)
        self.target = np.zeros(size, np.float32)
        mk.bind_module(q, self.layout, self.online)
        mk.bind_module(target, self.layout, self.target)
        self.grads = np.zeros(size, np.float32)
        _bind_grads(q, self.layout, self.grads)
        self.params = list(q.parameters())
        self.m = np.zeros(size, np.float32)
        self.v = np.zeros(size, np.float32)
        self.step = np.zeros(1, np.float32)
        self.offsets, self.dims = self.layout.offsets, self.layout.dims
        self._scratch: dict[int, tuple] = {}

    def _buffers(self, rows: int) -> tuple:
        if rows not in self._scratch:
            def acts(n):
                return tuple(np.empty((n, int(d)), np.float32) for d in self.dims[1:])

            self._scratch[rows] = (np.empty((2 * rows, int(self.dims[0])), np.float32), acts(2 * rows), acts(rows),
                                   acts(rows), np.empty((rows, int(self.dims[-1])), np.float32),
                                   np.empty(rows, np.float32))
        return self._scratch[rows]

    def learn(self, batch: dict, grad_hook=None) -> tuple[float, np.ndarray]:
        """One update on ``batch`` (numpy arrays or CPU tensors of :data:`BATCH_FIELDS`);
        ``grad_hook(params)`` is called between the gradients and the step, as the eager
        learner calls it. Returns (loss, |TD errors| as float64)."""
        _one_blas_thread()
        cfg = self.cfg
        x = {f: _host(batch[f], dtype) for f, dtype in BATCH_FIELDS.items()}
        both, acts, tacts, dacts, dz, td = self._buffers(len(x["obs"]))
        obs = x["obs"].reshape(len(x["obs"]), -1)
        next_obs = x["next_obs"].reshape(len(x["next_obs"]), -1)
        loss = mk.dqn_gradients(self.online, self.target, self.offsets, self.dims, obs, x["action"].reshape(-1),
                                x["reward"].reshape(-1), next_obs, x["done"].reshape(-1), x["weights"].reshape(-1),
                                cfg.gamma, cfg.double_q, both, acts, tacts, dacts, dz, self.grads, td)
        if grad_hook is not None:
            grad_hook(self.params)
        max_norm = -1.0 if cfg.max_grad_norm is None else float(cfg.max_grad_norm)
        mk.clip_and_adam(self.online, self.grads, self.m, self.v, self.step, cfg.lr, *_ADAM_BETAS, _ADAM_EPS,
                         max_norm)
        return float(loss), td.astype(np.float64)

    def update_target(self, tau: float) -> None:
        """``target <- tau * online + (1 - tau) * target`` (1: a copy)."""
        mk.soft_update(self.target, self.online, tau)


class CompiledTD3Step:
    """One TD3 update per :meth:`learn` on the policy ``pi``, the critics ``q1``, ``q2`` and
    their targets (ReLU MLPs, the policy's output through tanh, on the CPU), with ``cfg``'s
    gamma, policy_noise, noise_clip, lr_critic, lr_actor, tau and max_grad_norm: the arithmetic
    of :meth:`impl.rl.algorithms.td3.TD3Learner.learn`, its two Adams and its Polyak updates.

    Vectors: ``online`` = q1, q2, pi (each in its layout, one after the other), ``target`` their
    targets in the same order, ``grads``, ``m``, ``v`` the same layout; the critics' part is one
    Adam (one step count, one clipping norm) as torch's critic optimizer over q1 and q2, the
    policy's another. The modules are bound to views of them, the trained networks' ``.grad`` to
    views of ``grads``.

    Cost per :meth:`learn`: five forwards and two backwards (the critics'), one clipping and
    Adam pass over the critics; on a policy update a policy and a critic forward, a critic
    backward to its action input, a policy backward, an Adam pass over the policy and one
    Polyak pass over all three targets. The matrix products are nearly all of it: the rest
    (elementwise passes, small products, the smoothing noise's draw, a few microseconds of
    Python) is fixed per update. Scratch arrays are reused across updates of
    the same batch size. Thread-safety: none.
    """

    def __init__(self, pi, q1, q2, pi_target, q1_target, q2_target, cfg):
        self.cfg = cfg
        self.pi_layout, self.q_layout = _layout(pi), _layout(q1)
        qs, ps = self.q_layout.size, self.pi_layout.size
        self.online, self.target, self.grads, self.m, self.v = (np.zeros(2 * qs + ps, np.float32) for _ in range(5))
        parts = ((q1, q1_target, self.q_layout, slice(0, qs)), (q2, q2_target, self.q_layout, slice(qs, 2 * qs)),
                 (pi, pi_target, self.pi_layout, slice(2 * qs, 2 * qs + ps)))
        for net, target, layout, part in parts:
            mk.bind_module(net, layout, self.online[part])
            mk.bind_module(target, layout, self.target[part])
            _bind_grads(net, layout, self.grads[part])
        # each optimizer's views, made once: (parameters, gradients, m, v) of the critics, of the policy
        critics, policy = slice(0, 2 * qs), slice(2 * qs, 2 * qs + ps)
        self._critic_adam = tuple(a[critics] for a in (self.online, self.grads, self.m, self.v))
        self._policy_adam = tuple(a[policy] for a in (self.online, self.grads, self.m, self.v))
        self._critic_targets, self._policy_target = self.target[critics], self.target[policy]
        self.critic_params = [*q1.parameters(), *q2.parameters()]
        self.policy_params = list(pi.parameters())
        self.critic_step = np.zeros(1, np.float32)
        self.policy_step = np.zeros(1, np.float32)
        self._scratch: dict[int, dict] = {}
        self._loaded = False

    def _buffers(self, rows: int) -> dict:
        if rows not in self._scratch:
            import torch

            def acts(layout):
                return tuple(np.empty((rows, int(d)), np.float32) for d in layout.dims[1:])

            q_in, a_dim = int(self.q_layout.dims[0]), int(self.pi_layout.dims[-1])
            noise = torch.empty((rows, a_dim), dtype=torch.float32)
            self._scratch[rows] = dict(
                x=np.empty((rows, q_in), np.float32), next_x=np.empty((rows, q_in), np.float32),
                pi_t=acts(self.pi_layout), q1_t=acts(self.q_layout), q2_t=acts(self.q_layout),
                q1=acts(self.q_layout), q2=acts(self.q_layout), q_d=acts(self.q_layout), pi=acts(self.pi_layout),
                pi_d=acts(self.pi_layout), dz1=np.empty((rows, 1), np.float32), dz2=np.empty((rows, 1), np.float32),
                dz_pi=np.empty((rows, a_dim), np.float32), dx=np.empty((rows, q_in), np.float32),
                td=np.empty(rows, np.float32), noise=noise, noise_np=noise.numpy())
        return self._scratch[rows]

    def learn(self, batch: dict, policy_update: bool, grad_hook=None) -> tuple[float, np.ndarray]:
        """One critic step on ``batch`` (numpy arrays or CPU tensors of :data:`BATCH_FIELDS`,
        ``action`` float32: rows x action columns), and with ``policy_update`` a policy step and
        the targets' Polyak update. ``grad_hook(params)`` is called where the eager learner
        calls it: with the critics' parameters between their gradients and their clipping, and
        on a policy update with the policy's. The smoothing noise is drawn as the eager step's
        ``randn_like`` of the actions draws it (standard normal, float32, one per action value,
        from torch's CPU generator): the same values. Returns (critic loss, mean |TD error| of
        the two critics as float64). ValueError, before any work, for a field whose shape does
        not fit the networks (the kernels do not check their bounds)."""
        _one_blas_thread()
        cfg = self.cfg
        obs, action, next_obs = (_host(batch[f], np.float32) for f in ("obs", "action", "next_obs"))
        rows = len(obs)
        obs, action, next_obs = (x.reshape(len(x), -1) for x in (obs, action, next_obs))
        reward, weights, done = (_host(batch[f], dtype).reshape(-1) for f, dtype in
                                 (("reward", np.float32), ("weights", np.float32), ("done", np.bool_)))
        a_dim = int(self.pi_layout.dims[-1])
        if (obs.shape[1] + a_dim != self.q_layout.dims[0] or action.shape != (rows, a_dim)
                or next_obs.shape != obs.shape or not len(reward) == len(weights) == len(done) == rows):
            raise ValueError(f"batch shapes {[(f, np.shape(batch[f])) for f in BATCH_FIELDS]} do not fit networks of "
                             f"{int(self.pi_layout.dims[0])}-wide observations and {a_dim} action columns")
        s = self._scratch.get(rows) or self._buffers(rows)
        s["noise"].normal_()  # randn_like(actions) is empty_like + normal_: the same draws, without the allocation
        if not self._loaded:
            self._load_kernels()
        q, p = self.q_layout, self.pi_layout
        params, grads, m, v = self._critic_adam
        loss = td3k.critic_gradients(
            params, self._critic_targets, self._policy_target, q.offsets, q.dims, p.offsets, p.dims, obs, action,
            reward, next_obs, done, weights, s["noise_np"], cfg.gamma, cfg.policy_noise, cfg.noise_clip, s["x"],
            s["next_x"], s["pi_t"], s["q1_t"], s["q2_t"], s["q1"], s["q2"], s["q_d"], s["dz1"], s["dz2"], s["dx"],
            grads, s["td"])
        td = s["td"].astype(np.float64)
        max_norm = -1.0 if cfg.max_grad_norm is None else float(cfg.max_grad_norm)
        if grad_hook is not None:
            grad_hook(self.critic_params)
        mk.clip_and_adam(params, grads, m, v, self.critic_step, cfg.lr_critic, *_ADAM_BETAS, _ADAM_EPS, max_norm)
        if policy_update:
            params, grads, m, v = self._policy_adam
            self._policy_gradients(obs, s, grads)
            if grad_hook is not None:
                grad_hook(self.policy_params)
            mk.clip_and_adam(params, grads, m, v, self.policy_step, cfg.lr_actor, *_ADAM_BETAS, _ADAM_EPS, max_norm)
            mk.soft_update(self.target, self.online, float(cfg.tau))  # all three targets: one pass
        return float(loss), td

    def _policy_gradients(self, obs: np.ndarray, s: dict, out: np.ndarray) -> float:
        q, p = self.q_layout, self.pi_layout
        return td3k.policy_gradients(self._policy_adam[0], self._critic_adam[0], p.offsets, p.dims, q.offsets,
                                     q.dims, obs, s["x"], s["pi"], s["q1"], s["q_d"], s["pi_d"], s["dz1"],
                                     s["dz_pi"], s["dx"], out)

    def _load_kernels(self) -> None:
        """Load (or compile) the policy step's kernels now, on one row of zeros into throwaway
        vectors: the first update pays for every kernel whether or not it is a policy update, so
        a warm-up of a few updates (:func:`~impl.rl.common.device.warm_up_learner`) covers any
        ``policy_delay``. The critic step's kernels load on the update's own first call."""
        spare = np.zeros_like(self.grads)
        obs = np.zeros((1, int(self.pi_layout.dims[0])), np.float32)
        self._policy_gradients(obs, self._buffers(1), spare[:self._policy_adam[1].size])
        mk.soft_update(spare, spare, float(self.cfg.tau))
        self._loaded = True
