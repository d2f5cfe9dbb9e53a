"""Stable-Baselines3's DQN with our prioritized buffer (docs/frameworks.md); needs the sb3 extra:
``pip install 'replaybench[sb3]'``. ``PrioritizedDQN`` weights the loss by the importance
weights, writes |TD error| back and anneals beta to 1.

    python examples/sb3_prioritized_dqn.py
"""


def main(total_timesteps: int = 300, path: str = "replay.pkl"):
    from replaybench.adapters.sb3 import PrioritizedDQN

    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", learning_starts=100, seed=0,
                           replay_buffer_kwargs={"variant": "kary-aligned", "alpha": 0.6, "beta": 0.4})
    model.learn(total_timesteps=total_timesteps)
    model.save_replay_buffer(path)                # SB3's own save / load_replay_buffer work
    print(f"{model.replay_buffer.size()} transitions stored, saved to {path}")
    return model


if __name__ == "__main__":
    main()
