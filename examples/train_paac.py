"""The PAAC engine (docs/engines/paac.md): A2C with one learner, n_envs environments stepped in
lock step by n_workers processes and one batched forward for all of them per step. Here 4
environments stepped in this process (n_workers 0), for a second's run.

    python examples/train_paac.py
"""

from replaybench.impl.rl import TrainConfig, train

TINY = {"n_envs": 4, "n_workers": 0, "t_max": 5, "hidden": 32}  # A2CConfig fields, over the preset


def main(steps: int = 400, seed: int = 0):
    result = train(TrainConfig(algo="a2c", env="CartPole-v1", steps=steps, seed=seed, overrides=TINY))
    print(f"{result.engine}: {result.env_steps} env steps (whole rollouts of 4 x 5), {result.updates} A2C updates, "
          f"{result.env_steps_per_s:.0f} env steps/s")
    return result


if __name__ == "__main__":
    main()
