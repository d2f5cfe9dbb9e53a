"""Compiled kernels for the updates of small MLPs: forward (ReLU hidden layers, a linear or a
tanh output), backward, the DQN loss, gradient clipping, Adam and Polyak averaging, on flat
float32 parameter vectors, with no Python between the ops. The TD3 losses built on them are
:mod:`impl.rl.algorithms.td3_kernels`.

Why: a learner's update of a CartPole-sized network (4 -> 128 -> 128 -> 2, batch 64) is about
11 MFLOP, a few tens of microseconds of arithmetic, but torch's eager step issues about sixty
operator calls and an autograd graph whose dispatch dominates it. These kernels run the same
arithmetic in one compiled call per phase (the matrix products through numpy's BLAS, as numba
lowers ``np.dot``), so an update costs its arithmetic plus a few microseconds.

Layout (:class:`MLPLayout`): one flat float32 vector holds every layer's weight (``out x in``,
row-major, as ``torch.nn.Linear`` stores it) followed by its bias, layer after layer; gradients,
Adam's moments and the target network use the same layout. A torch module can keep its
parameters as views of such a vector (:func:`bind_module`), so actors, flat-weight broadcasts
and digests see every update without a copy.

The arithmetic is torch's, term by term (ReLU MLP, double-Q targets, ``smooth_l1_loss`` with
beta 1 weighted and averaged, ``clip_grad_norm_`` with its 1e-6, ``Adam`` with bias
corrections), not its summation order: results agree within float32 rounding, not bitwise
(tests/test_fast_learner.py). Thread-safety: none (each learner owns its vectors); the kernels
release the GIL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

__all__ = ["MLPLayout", "bind_module", "bound_vector", "bind_for_acting", "forward", "forward_tanh", "backward", "greedy",
           "dqn_gradients", "clip_and_adam", "soft_update"]


@dataclass(frozen=True)
class MLPLayout:
    """Where each layer lives in a flat vector: ``sizes`` = (in, hidden..., out);
    ``offsets[l]`` the start of layer ``l``'s weight, its bias right after it. ``offsets`` and
    ``dims`` (the kernels' arguments) are made once per layout: read them, do not write them."""

    sizes: tuple[int, ...]

    @cached_property
    def offsets(self) -> np.ndarray:
        out, at = [], 0
        for i, o in zip(self.sizes[:-1], self.sizes[1:]):
            out.append(at)
            at += o * i + o
        return np.array(out, dtype=np.int64)

    @property
    def size(self) -> int:
        return sum(o * i + o for i, o in zip(self.sizes[:-1], self.sizes[1:]))

    @cached_property
    def dims(self) -> np.ndarray:
        return np.array(self.sizes, dtype=np.int64)


def bind_module(module, layout: MLPLayout, flat: np.ndarray) -> None:
    """Make the Linear layers of ``module`` (an :func:`impl.rl.algorithms.nets.mlp`) keep their
    parameters in ``flat`` (``layout``), after copying their current values there: the module
    then reads and writes the vector, and ``module.flat_params`` is ``(layout, flat)``
    (:func:`bound_vector`). Raises ValueError when the module's Linear layers do not match
    ``layout``. (Replacing a parameter's ``.data`` afterwards, as
    ``torch.nn.utils.vector_to_parameters`` does, unbinds it: write into ``flat`` instead.)"""
    import torch
    from torch import nn

    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    shapes = [(m.out_features, m.in_features) for m in linears]
    wanted = [(o, i) for i, o in zip(layout.sizes[:-1], layout.sizes[1:])]
    if shapes != wanted or any(m.bias is None for m in linears):
        raise ValueError(f"module's Linear layers {shapes} do not match the layout {wanted} (with biases)")
    for m, at in zip(linears, layout.offsets):
        o, i = m.out_features, m.in_features
        w = flat[at:at + o * i].reshape(o, i)
        b = flat[at + o * i:at + o * i + o]
        w[:] = m.weight.detach().cpu().numpy()
        b[:] = m.bias.detach().cpu().numpy()
        m.weight.data = torch.from_numpy(w)
        m.bias.data = torch.from_numpy(b)
    module.flat_params = (layout, flat)  # how an actor sharing the module finds the vector


def bound_vector(module):
    """``(layout, flat)`` of a module bound by :func:`bind_module`, or None."""
    return getattr(module, "flat_params", None)


def bind_for_acting(module, sizes: tuple[int, ...], own: bool):
    """The ``(layout, flat)`` an actor's compiled forward of ``module`` runs on: the vector it is
    bound to already (a compiled learner's network the actor shares), else, when ``own`` (the
    actor's own network and a compiled update), a fresh vector of layout ``sizes`` that
    ``module`` is bound to now; None where the actor runs torch's forward."""
    flat = bound_vector(module)
    if flat is None and own:
        layout = MLPLayout(tuple(sizes))
        bind_module(module, layout, np.zeros(layout.size, np.float32))
        flat = bound_vector(module)
    return flat


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def _weight(flat, offsets, dims, l):
    at, i, o = offsets[l], dims[l], dims[l + 1]
    return flat[at:at + o * i].reshape((o, i)), flat[at + o * i:at + o * i + o]


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def forward(flat, offsets, dims, x, acts):
    """Forward of ``x`` (rows x in) through the MLP in ``flat``; ``acts[l]`` (preallocated,
    rows x dims[l+1], at least as many rows as ``x``) receives layer ``l``'s output, ReLU applied
    except on the last. Returns the last layer's output (a view of ``acts[-1]``). Cost: one
    matrix product per layer, written straight into ``acts`` (no allocation)."""
    n = x.shape[0]
    h = x
    for l in range(len(dims) - 1):
        w, b = _weight(flat, offsets, dims, l)
        z = acts[l][:n]
        np.dot(h, w.T, z)
        last = l == len(dims) - 2
        for r in range(n):
            for c in range(z.shape[1]):
                v = z[r, c] + b[c]
                z[r, c] = v if last or v > 0 else np.float32(0.0)
        h = z
    return h


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def forward_tanh(flat, offsets, dims, x, acts):
    """:func:`forward` with tanh on the last layer's output (in place in ``acts[-1]``, which
    :func:`backward` then reads for tanh's derivative): a deterministic policy's actions in
    [-1, 1]. Returns them (a view of ``acts[-1]``)."""
    a = forward(flat, offsets, dims, x, acts)
    for r in range(a.shape[0]):
        for c in range(a.shape[1]):
            a[r, c] = np.tanh(a[r, c])
    return a


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def backward(flat, offsets, dims, x, acts, dz, grads, param_grads, input_grad, dacts, dx):
    """Backpropagate ``dz`` (rows x dims[-1]: the loss's gradient with respect to the last
    layer's output, before any output activation) through the ReLU MLP in ``flat`` whose
    forward of ``x`` left its layer outputs in ``acts`` (:func:`forward`).

    With ``param_grads`` every layer's weight and bias gradient is written into ``grads`` (the
    layout of ``flat``, overwritten); with ``input_grad`` the gradient with respect to ``x`` into
    ``dx`` (at least rows x dims[0]). ``dacts``: scratch shaped as ``acts`` (the hidden layers'
    gradients). Cost: per layer one product for the weight gradient (when ``param_grads``) and
    one for the gradient of its input (except the first layer's, unless ``input_grad``)."""
    n = x.shape[0]
    top = len(dims) - 2
    if param_grads:  # the top layer's bias gradient; each lower one's is summed where its dz is made
        _, gb = _weight(grads, offsets, dims, top)
        gb[:] = 0
        for r in range(n):
            for c in range(dz.shape[1]):
                gb[c] += dz[r, c]
    for l in range(top, -1, -1):
        h = x if l == 0 else acts[l - 1][:n]
        if param_grads:
            gw, _ = _weight(grads, offsets, dims, l)
            np.dot(dz.T, h, gw)
        if l > 0 or input_grad:
            w, _ = _weight(flat, offsets, dims, l)
            out = dx[:n] if l == 0 else dacts[l - 1][:n]
            np.dot(dz, w, out)
            if l > 0 and param_grads:  # ReLU's derivative (0 where the output was clamped), and the bias gradient
                _, gb = _weight(grads, offsets, dims, l - 1)
                gb[:] = 0
                for r in range(n):
                    for c in range(out.shape[1]):
                        g = out[r, c] if h[r, c] > 0 else np.float32(0.0)
                        out[r, c] = g
                        gb[c] += g
            elif l > 0:
                for r in range(n):
                    for c in range(out.shape[1]):
                        if h[r, c] <= 0:
                            out[r, c] = 0
            dz = out


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def greedy(flat, offsets, dims, x, acts):
    """argmax over actions of the MLP's output for each row of ``x`` (int64)."""
    q = forward(flat, offsets, dims, x, acts)
    out = np.empty(x.shape[0], dtype=np.int64)
    for r in range(x.shape[0]):
        best = 0
        for c in range(1, q.shape[1]):
            if q[r, c] > q[r, best]:
                best = c
        out[r] = best
    return out


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def dqn_gradients(online, target, offsets, dims, obs, action, reward, next_obs, done, weights, gamma, double_q,
                  both, acts, tacts, dacts, dz, grads, td_abs):
    """One DQN update's loss and gradients (into ``grads``, overwritten) and |TD errors| (into
    ``td_abs``, float32): double-Q (or max) targets from ``target``, a Huber loss (beta 1)
    weighted by ``weights`` and averaged over the batch, as :meth:`DQNLearner._step` computes
    it. Scratch: ``both`` (2B x in) and ``acts`` (per layer, 2B rows): the online network's
    forward of ``obs`` and, for double-Q, ``next_obs`` stacked below it, one product per layer
    for both (a taller product runs nearer the matrix rate than two short ones); ``tacts``
    (B rows) the target network's on ``next_obs``; ``dacts`` (B rows) the backward's hidden
    gradients; ``dz`` (B x actions) the loss's gradient. Returns the loss."""
    B = obs.shape[0]
    if double_q:
        both[:B] = obs
        both[B:2 * B] = next_obs
        q_both = forward(online, offsets, dims, both[:2 * B], acts)
        q_all, qn = q_both[:B], q_both[B:2 * B]
    else:
        q_all = forward(online, offsets, dims, obs, acts)
        qn = q_all  # unused without double-Q
    qt = forward(target, offsets, dims, next_obs, tacts)
    # the loss's gradient with respect to the last layer's output: only the taken action's column
    dz = dz[:B]
    dz[:] = 0
    loss = 0.0
    for r in range(B):
        if double_q:
            best = 0
            for c in range(1, qn.shape[1]):
                if qn[r, c] > qn[r, best]:
                    best = c
            next_q = qt[r, best]
        else:
            next_q = qt[r, 0]
            for c in range(1, qt.shape[1]):
                next_q = max(next_q, qt[r, c])
        not_done = np.float32(0.0) if done[r] else np.float32(1.0)
        y = np.float32(reward[r] + np.float32(gamma) * not_done * next_q)
        q = q_all[r, action[r]]
        d = q - y
        ad = abs(d)
        td_abs[r] = ad
        huber = 0.5 * d * d if ad < 1.0 else ad - 0.5
        loss += weights[r] * huber
        dz[r, action[r]] = np.float32(weights[r] * max(-1.0, min(1.0, d)) / B)
    # the online forward's first B rows are obs's, all backward reads of acts (acts[l][:B]);
    # no input gradient, so its dx argument (dacts[0]) is never written
    backward(online, offsets, dims, obs, acts, dz, grads, True, False, dacts, dacts[0])
    return loss / B


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def clip_and_adam(params, grads, m, v, step, lr, beta1, beta2, eps, max_norm):
    """Clip ``grads`` to global norm ``max_norm`` (torch's ``clip_grad_norm_``: scaled by
    min(1, max_norm / (norm + 1e-6)); no clipping when ``max_norm`` <= 0), then one Adam step
    (torch's: bias-corrected, no weight decay) on ``params`` with moments ``m``, ``v`` and the
    step count ``step[0]`` (float32, incremented). Returns the gradient norm before clipping
    (0.0 without clipping: not computed, a pass saved). The element loop runs in float32 (as
    torch's fused Adam does), vectorised."""
    norm = 0.0
    scale = np.float32(1.0)
    if max_norm > 0:
        total = 0.0
        for i in range(grads.size):
            total += np.float64(grads[i]) * grads[i]
        norm = math.sqrt(total)
        scale = np.float32(min(1.0, max_norm / (norm + 1e-6)))
    step[0] += 1
    t = step[0]
    bc1 = 1.0 - beta1 ** t
    bc2_sqrt = math.sqrt(1.0 - beta2 ** t)
    step_size = np.float32(lr / bc1)
    b1, b2 = np.float32(beta1), np.float32(beta2)
    c1, c2 = np.float32(1.0 - beta1), np.float32(1.0 - beta2)
    inv_bc2 = np.float32(1.0 / bc2_sqrt)
    e = np.float32(eps)
    for i in range(params.size):
        g = grads[i] * scale
        grads[i] = g
        mi = b1 * m[i] + c1 * g
        vi = b2 * v[i] + c2 * g * g
        m[i] = mi
        v[i] = vi
        params[i] -= step_size * mi / (np.sqrt(vi) * inv_bc2 + e)
    return norm


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def soft_update(target, online, tau):
    """``target <- target + tau (online - target)`` (tau = 1: a copy), element by element."""
    t = np.float32(tau)
    if tau >= 1.0:
        target[:] = online
        return
    for i in range(target.size):
        target[i] += t * (online[i] - target[i])
