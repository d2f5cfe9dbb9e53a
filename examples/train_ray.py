"""The Ray engine (docs/engines/ray.md): actors as Ray actors on any node of a Ray cluster, a
replay server owning the shared buffer, learners on the server's node. Needs the ray extra
(``pip install 'replaybench[ray]'``); without it, ``train`` refuses the config before starting
anything. ``address=None`` starts a local Ray for the run and shuts it down after.

    python examples/train_ray.py
"""

from replaybench.impl.rl import TrainConfig, train

TINY = {"learning_starts": 100, "batch_size": 32, "hidden": 32}


def main(steps: int = 400, seed: int = 0, address: str | None = None):
    cfg = TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", policy="lazy-writing",
                      actors=1, learners=1, backend="ray", ray_address=address, steps=steps, seed=seed,
                      overrides=TINY, timeout_s=300)
    result = train(cfg)
    print(f"{result.engine}: {result.env_steps} env steps, {result.updates} updates, "
          f"{result.actor_restarts} actor restarts, {result.dropped_batches} dropped batches")
    return result


if __name__ == "__main__":
    main()
