"""Compiled kernels of the TD3 update (:class:`~impl.rl.algorithms.compiled_step.CompiledTD3Step`),
built on the MLP kernels of :mod:`impl.rl.algorithms.mlp_kernels`: the twin critics' loss and
gradients (:func:`critic_gradients`) and the policy's (:func:`policy_gradients`).

Vectors: ``critics`` holds both critics, q1's parameters then q2's, each in the critic layout
(``q_offsets``, ``q_dims``: ``concat(obs, action) -> Q``); ``critic_targets`` their targets the
same way; ``policy`` / ``policy_target`` one policy each (``pi_offsets``, ``pi_dims``: ``obs ->
action``, tanh output). One vector for both critics is what lets one Adam, and one clipping
norm, cover them as torch's single critic optimizer does.

The arithmetic is :meth:`impl.rl.algorithms.td3.TD3Learner.learn`'s, term by term, with the
target-policy smoothing noise given (drawn by the caller from torch's generator, as the eager
step draws it); results agree with it within float32 rounding, not bitwise
(tests/test_fast_td3.py). Thread-safety: none (the caller owns every array written); the
kernels release the GIL.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from replaybench.impl.rl.algorithms.mlp_kernels import backward, forward, forward_tanh

__all__ = ["critic_gradients", "policy_gradients"]


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def _concat(obs, action, x):
    """``x[:n] <- concat(obs, action)`` along the columns (a critic's input)."""
    o = obs.shape[1]
    for r in range(obs.shape[0]):
        for c in range(o):
            x[r, c] = obs[r, c]
        for c in range(action.shape[1]):
            x[r, o + c] = action[r, c]


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def critic_gradients(critics, critic_targets, policy_target, q_offsets, q_dims, pi_offsets, pi_dims,
                     obs, action, reward, next_obs, done, weights, noise, gamma, policy_noise, noise_clip,
                     x, next_x, pi_t_acts, q1_t_acts, q2_t_acts, q1_acts, q2_acts, dacts, dz1, dz2, dx,
                     critic_grads, td_abs):
    """The critic loss of one TD3 update, its gradients and the new priorities.

    ``y = reward + gamma (1 - done) min(q1_t, q2_t)(next_obs, a')`` with ``a' = clamp(pi_t(next_obs)
    + clamp(noise * policy_noise, +-noise_clip), +-1)``; loss ``mean(weights ((q1 - y)^2 + (q2 -
    y)^2))`` over the batch, at ``(obs, action)``. Writes the loss's gradient with respect to
    ``critics`` into ``critic_grads`` (same layout, overwritten) and ``(|y - q1| + |y - q2|) / 2``
    into ``td_abs``; returns the loss. ``noise``: standard normal draws, rows x action columns.
    Scratch (each with at least the batch's rows): ``x`` / ``next_x`` the critics' inputs (rows x
    q_dims[0]), ``*_acts`` one forward's layer outputs each, ``dacts`` the critics' hidden
    gradients, ``dz1`` / ``dz2`` (rows x 1), ``dx`` (unused here; :func:`backward`'s input
    gradient). Cost: five forwards (target policy, two target critics, two critics) and two
    critic backwards."""
    B = obs.shape[0]
    half = critics.size // 2
    q1, q2 = critics[:half], critics[half:]
    a_t = forward_tanh(policy_target, pi_offsets, pi_dims, next_obs, pi_t_acts)
    # the smoothed target action, in next_x's action columns
    o = next_obs.shape[1]
    pn, clip = np.float32(policy_noise), np.float32(noise_clip)
    for r in range(B):
        for c in range(o):
            next_x[r, c] = next_obs[r, c]
        for c in range(a_t.shape[1]):
            eps = min(max(noise[r, c] * pn, -clip), clip)
            next_x[r, o + c] = min(max(a_t[r, c] + eps, np.float32(-1.0)), np.float32(1.0))
    nx = next_x[:B]
    qt1 = forward(critic_targets[:half], q_offsets, q_dims, nx, q1_t_acts)
    qt2 = forward(critic_targets[half:], q_offsets, q_dims, nx, q2_t_acts)
    _concat(obs, action, x)
    xb = x[:B]
    v1 = forward(q1, q_offsets, q_dims, xb, q1_acts)
    v2 = forward(q2, q_offsets, q_dims, xb, q2_acts)
    g = np.float32(gamma)
    scale = np.float32(2.0 / B)  # d/dq of the batch mean of (q - y)^2
    loss = 0.0
    for r in range(B):
        not_done = np.float32(0.0) if done[r] else np.float32(1.0)
        y = reward[r] + g * not_done * min(qt1[r, 0], qt2[r, 0])
        d1, d2 = v1[r, 0] - y, v2[r, 0] - y
        loss += weights[r] * (d1 * d1 + d2 * d2)
        dz1[r, 0] = scale * weights[r] * d1
        dz2[r, 0] = scale * weights[r] * d2
        td_abs[r] = np.float32(0.5) * (abs(d1) + abs(d2))
    backward(q1, q_offsets, q_dims, xb, q1_acts, dz1[:B], critic_grads[:half], True, False, dacts, dx)
    backward(q2, q_offsets, q_dims, xb, q2_acts, dz2[:B], critic_grads[half:], True, False, dacts, dx)
    return loss / B


@njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def policy_gradients(policy, critics, pi_offsets, pi_dims, q_offsets, q_dims, obs,
                     x, pi_acts, q_acts, q_dacts, pi_dacts, dz_q, dz_pi, dx, policy_grads):
    """The policy loss ``-mean(q1(obs, pi(obs)))`` of one TD3 policy update and its gradient
    with respect to ``policy`` (into ``policy_grads``, overwritten); returns the loss.

    The gradient flows through q1 into its action input and on through the policy's tanh;
    q1's own parameter gradients are not formed (the eager step's land on the critics'
    ``.grad`` and are cleared unused). Scratch as in :func:`critic_gradients`: ``x`` (rows x
    q_dims[0]), the layer outputs of the policy (``pi_acts``) and of q1 (``q_acts``), hidden
    gradients (``q_dacts``, ``pi_dacts``), ``dz_q`` (rows x 1), ``dz_pi`` (rows x action
    columns), ``dx`` (rows x q_dims[0]). Cost: a policy and a critic forward, a critic backward
    to its input (no weight gradients) and a policy backward."""
    B = obs.shape[0]
    q1 = critics[:critics.size // 2]
    a = forward_tanh(policy, pi_offsets, pi_dims, obs, pi_acts)
    _concat(obs, a, x)
    xb = x[:B]
    q = forward(q1, q_offsets, q_dims, xb, q_acts)
    loss = 0.0
    for r in range(B):
        loss -= q[r, 0]
    dz_q[:B] = np.float32(-1.0 / B)
    backward(q1, q_offsets, q_dims, xb, q_acts, dz_q[:B], policy_grads, False, True, q_dacts, dx)
    o = obs.shape[1]
    for r in range(B):
        for c in range(a.shape[1]):
            dz_pi[r, c] = dx[r, o + c] * (np.float32(1.0) - a[r, c] * a[r, c])  # tanh' = 1 - tanh^2
    backward(policy, pi_offsets, pi_dims, obs, pi_acts, dz_pi[:B], policy_grads, True, False, pi_dacts, dx)
    return loss / B
