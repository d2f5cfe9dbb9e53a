"""Torch helpers the agents share: MLP builder, target updates, flat weight vectors, gradient averaging.

Flat vectors are how weights travel from learners to actors (one float32 array in shared
memory, see :mod:`impl.rl.weights`) and how tests compare learners bit for bit.
"""

from __future__ import annotations

import hashlib
from typing import Iterable

import torch
from torch import nn

__all__ = ["mlp", "update_target", "flat_params", "load_flat_params", "params_digest", "GradientAverager"]


def mlp(sizes: Iterable[int], out_activation: nn.Module | None = None) -> nn.Sequential:
    """Linear layers ``sizes[0] -> sizes[1] -> ...`` with ReLU between them."""
    sizes = list(sizes)
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    if out_activation is not None:
        layers.append(out_activation)
    return nn.Sequential(*layers)


@torch.no_grad()
def update_target(target: nn.Module, online: nn.Module, tau: float) -> None:
    """``target <- tau * online + (1 - tau) * target``, parameter by parameter.

    ``tau = 1`` is the hard copy (DQN's periodic target update), ``0 < tau < 1`` Polyak
    averaging (TD3, soft DQN). The two modules must have the same architecture. Cost: one
    pass over the parameters (a single fused ``_foreach_lerp_`` call for the soft update).
    """
    targets, sources = list(target.parameters()), list(online.parameters())
    if tau >= 1.0:
        torch._foreach_copy_(targets, sources)
    else:
        torch._foreach_lerp_(targets, sources, tau)


def flat_params(module: nn.Module) -> torch.Tensor:
    """All parameters of ``module`` concatenated into one detached float32 vector, a copy in
    host memory wherever the module lives (actors load it into their CPU copies)."""
    flat = torch.nn.utils.parameters_to_vector(module.parameters()).detach()
    return flat.clone() if flat.device.type == "cpu" else flat.cpu()


@torch.no_grad()
def load_flat_params(module: nn.Module, flat) -> None:
    """Copy a vector made by :func:`flat_params` (tensor or array) into ``module``'s parameters."""
    flat = torch.as_tensor(flat)
    torch.nn.utils.vector_to_parameters(flat, module.parameters())


def params_digest(*modules: nn.Module) -> str:
    """SHA-1 of the exact bytes of every parameter of ``modules``: equal iff bitwise identical."""
    h = hashlib.sha1()
    for module in modules:
        for p in module.parameters():
            h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


class GradientAverager:
    """Averages gradients across the learners of a torch.distributed process group (the Ray
    engine's learners, which may span machines; the process engine's, on one machine, use
    :class:`~impl.rl.common.allreduce.SharedGradientAverager`).

    ``averager(params)`` flattens the gradients of ``params`` into one buffer, all-reduces it
    (sum) and divides by the world size: one collective per call, however many tensors.
    Every learner must call it the same number of times with parameters of the same shapes;
    after it, all learners hold the same bits (gloo's all-reduce gives every rank the same
    result), so the same optimizer step keeps their weights identical.
    Cost: O(number of parameters) copies plus one all-reduce.
    """

    def __init__(self, world_size: int):
        self.world_size = int(world_size)

    def __call__(self, params: Iterable[nn.Parameter]) -> None:
        import torch.distributed as dist

        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.world_size
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n
