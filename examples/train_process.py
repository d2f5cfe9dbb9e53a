"""The process engine (docs/engines/process.md): actor processes and learner processes over one
shared-memory prioritized buffer, held to the sequential loop's updates per env step by a rate
limiter. Workers start by forkserver, so a script that calls ``train`` keeps the call under
``if __name__ == "__main__"``.

    python examples/train_process.py
"""

from replaybench.impl.rl import TrainConfig, train

TINY = {"learning_starts": 100, "batch_size": 32, "hidden": 32}


def main(steps: int = 400, seed: int = 0):
    cfg = TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", policy="lazy-writing",
                      actors=1, learners=1, backend="process", steps=steps, seed=seed, overrides=TINY,
                      timeout_s=120)
    result = train(cfg)
    print(f"{result.engine}: {result.env_steps} env steps, {result.updates} updates, "
          f"{result.env_steps_per_s:.0f} env steps/s, actors waited {result.actor_wait_s:.2f} s")
    return result


if __name__ == "__main__":
    main()
