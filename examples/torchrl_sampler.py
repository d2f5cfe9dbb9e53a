"""TorchRL's PrioritizedSampler API on our trees (docs/frameworks.md); needs the torchrl extra:
``pip install 'replaybench[torchrl]'``. The storage stays TorchRL's; the priority key and
``update_tensordict_priority`` (what a loop with DQNLoss calls) work as in
TensorDictPrioritizedReplayBuffer.

    python examples/torchrl_sampler.py
"""


def main(size: int = 2**12):
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from replaybench.adapters.torchrl import PrioritizedSampler

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(size), priority_key="td_error", batch_size=32,
                                sampler=PrioritizedSampler(size, alpha=0.6, beta=0.4, variant="kary-aligned"))
    rb.extend(TensorDict({"obs": torch.randn(100, 4)}, batch_size=[100]))
    sample = rb.sample()                          # sample["index"], sample["priority_weight"]
    sample["td_error"] = torch.rand(32)           # what DQNLoss writes
    rb.update_tensordict_priority(sample)
    print(f"{len(rb)} stored, weights of shape {tuple(sample['priority_weight'].shape)}")
    return rb, sample


if __name__ == "__main__":
    main()
