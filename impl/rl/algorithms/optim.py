"""RMSProp as TensorFlow 1 computes it, for reproducing TF-era papers (PAAC's A2C).

``torch.optim.RMSprop`` and TF1's ``RMSPropOptimizer`` differ in two places that matter with
the large epsilon those papers use (0.1):

- torch adds ``eps`` outside the square root, TF1 inside: ``g / (sqrt(ms) + eps)`` against
  ``g / sqrt(ms + eps)``. With eps 0.1 and small mean squares torch's step is up to
  1 / sqrt(0.1) = 3.2x larger.
- torch starts the mean square at 0, TF1 at 1. After the first update torch's ``ms`` is
  ``(1 - alpha) g^2``, so its first step is ``lr g / (sqrt(1 - alpha) |g| + eps)``: with
  alpha 0.99 and eps 0.1 that is 10 lr g for small gradients (and 10 lr for large ones), where
  TF1's is ``lr g / sqrt(1 + eps)``, about lr g.

With PAAC's learning rate (0.0224) torch's early steps collapsed the policy's entropy on Pong
within 20 updates (1.79 -> 0.15 nats), so A2C uses this one by default
(``A2CConfig.rmsprop_tf``).
"""

from __future__ import annotations

import torch

__all__ = ["TFRMSprop"]


class TFRMSprop(torch.optim.Optimizer):
    """RMSProp without momentum, as TF1's ``RMSPropOptimizer``::

        ms <- alpha * ms + (1 - alpha) * g^2        (ms starts at 1)
        p  <- p - lr * g / sqrt(ms + eps)

    Same constructor arguments as ``torch.optim.RMSprop`` (``lr``, ``alpha``, ``eps``); the
    learning rate may be changed per step through ``param_groups``. Cost per step: five
    elementwise passes over the parameters, each one multi-tensor (``torch._foreach_*``) op;
    state: one tensor per parameter.
    """

    def __init__(self, params, lr: float, alpha: float = 0.99, eps: float = 1e-10):
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr!r}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
        if not eps >= 0:
            raise ValueError(f"eps must be >= 0, got {eps!r}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            for p in params:
                if not self.state[p]:
                    self.state[p]["square_avg"] = torch.ones_like(p)
            grads = [p.grad for p in params]
            ms = [self.state[p]["square_avg"] for p in params]
            # one multi-tensor op per line (the per-parameter loop's arithmetic, element for element):
            # on a GPU each line is one launch for all parameters instead of one per parameter
            torch._foreach_mul_(ms, group["alpha"])
            torch._foreach_addcmul_(ms, grads, grads, value=1.0 - group["alpha"])
            denom = torch._foreach_add(ms, group["eps"])
            torch._foreach_sqrt_(denom)
            torch._foreach_addcdiv_(params, grads, denom, value=-group["lr"])
        return loss
