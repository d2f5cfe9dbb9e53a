"""Tianshou's prioritized-buffer API on our buffer (docs/frameworks.md); needs the tianshou
extra: ``pip install 'replaybench[tianshou]'``. Tianshou's Collector, DQN and trainer use it
unchanged.

    python examples/tianshou_buffer.py
"""

import numpy as np


def main(size: int = 2**12):
    from tianshou.data import Batch

    from replaybench.adapters.tianshou import PrioritizedReplayBuffer, PrioritizedVectorReplayBuffer

    buf = PrioritizedReplayBuffer(size, alpha=0.6, beta=0.4, variant="kary-aligned")
    for t in range(100):
        buf.add(Batch(obs=[t, 0.0], act=1, rew=1.0, terminated=False, truncated=False, obs_next=[t + 1, 0.0]))
    batch, indices = buf.sample(32)               # batch.weight: importance weights
    buf.update_weight(indices, np.ones(32))       # |TD error|, as Tianshou's DQN calls it
    # one sub-buffer per environment, for a Collector over a DummyVectorEnv / SubprocVectorEnv of 4
    vbuf = PrioritizedVectorReplayBuffer(size, buffer_num=4, alpha=0.6, beta=0.4)
    print(f"{len(buf)} stored, weights of shape {batch.weight.shape}, {vbuf.buffer_num} sub-buffers")
    return buf, batch, vbuf


if __name__ == "__main__":
    main()
