"""The sequential engine (docs/engines/sequential.md): one process acts, stores, samples, learns
and writes priorities back, over any registered variant in process memory. Tiny sizes here;
the baseline of every speedup in the training rows.

    python examples/train_sequential.py
"""

from replaybench.impl.rl import TrainConfig, train

TINY = {"learning_starts": 100, "batch_size": 32, "hidden": 32}  # DQNConfig fields, over the preset


def main(steps: int = 400, seed: int = 0):
    cfg = TrainConfig(algo="dqn", env="CartPole-v1", buffer="kary-aligned", actors=0, learners=0,
                      steps=steps, seed=seed, overrides=TINY)
    result = train(cfg)                            # validates cfg first: a bad field raises ConfigError
    print(f"{result.engine}: {result.env_steps} env steps, {result.updates} updates, "
          f"{result.env_steps_per_s:.0f} env steps/s, {len(result.episodes)} episodes")
    return result


if __name__ == "__main__":
    main()
