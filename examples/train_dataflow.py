"""The dataflow engine (docs/engines/dataflow.md): one server process infers for all
actors x envs_per_actor environments per lock step, ``actors`` processes only step them, and the
learners are the process engine's. Workers start by forkserver: keep the call under
``if __name__ == "__main__"`` in a script.

    python examples/train_dataflow.py
"""

from replaybench.impl.rl import TrainConfig, train

TINY = {"learning_starts": 100, "batch_size": 32, "hidden": 32}


def main(steps: int = 400, seed: int = 0):
    cfg = TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", policy="lazy-writing",
                      actors=2, learners=1, envs_per_actor=4, backend="dataflow", steps=steps, seed=seed,
                      overrides=TINY, timeout_s=120)
    result = train(cfg)
    print(f"{result.engine}: {result.env_steps} env steps, {result.updates} updates, "
          f"{result.env_steps_per_s:.0f} env steps/s, per env worker {result.actor_steps}")
    return result


if __name__ == "__main__":
    main()
