"""TorchRL's PrioritizedSampler API on our trees (docs/frameworks.md); needs the torchrl extra:
``pip install 'replaybench[torchrl]'``. The storage stays TorchRL's; the priority key and
``update_tensordict_priority`` (what a loop with DQNLoss calls) work as in
TensorDictPrioritizedReplayBuffer. Our TensorDictPrioritizedReplayBuffer builds the same buffer
around our sampler, with extend, sample and update_tensordict_priority one pass each.

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

    from replaybench.adapters.torchrl import TensorDictPrioritizedReplayBuffer

    fast = TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4, storage=LazyTensorStorage(size),
                                             priority_key="td_error", batch_size=32, variant="kary-aligned")
    for _ in range(3):                            # the first extend creates the storage (TorchRL's path)
        fast.extend(TensorDict({"obs": torch.randn(100, 4)}, batch_size=[100]))
    batch = fast.sample()                         # the same keys: batch["index"], batch["priority_weight"]
    batch["td_error"] = torch.rand(32, 1)         # (n,) or (n, 1), as TorchRL's losses write it
    fast.update_tensordict_priority(batch)
    print(f"{len(fast)} stored in our TensorDictPrioritizedReplayBuffer")
    return rb, sample


if __name__ == "__main__":
    main()
