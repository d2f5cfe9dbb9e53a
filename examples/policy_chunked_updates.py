"""A concurrency policy in one file (docs/extending.md): priority updates applied in chunks of
256, releasing the tree lock between chunks, so inserts and samples interleave with a large
update. As a module of impl/concurrent/policies/ it registers itself when ``names()`` imports
that folder; importing this file registers it as well.

    python examples/policy_chunked_updates.py
"""

import numpy as np

from replaybench.impl.concurrent.policy import Policy, register


@register
class ChunkedUpdates(Policy):
    name = "chunked-updates"
    CHUNK = 256  # priority updates per hold of the tree lock

    def update(self, idx, vals, stamps) -> int:
        applied = 0
        for lo in range(0, idx.size, self.CHUNK):
            part = slice(lo, lo + self.CHUNK)
            applied += super().update(idx[part], vals[part], None if stamps is None else stamps[part])
        return applied


def main(capacity: int = 2**12) -> int:
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    with SharedPrioritizedBuffer.create(capacity, {"obs": ((4,), "float32")}, policy="chunked-updates") as buf:
        buf.add({"obs": np.zeros((capacity, 4), np.float32)})
        out = buf.sample(1000)
        applied = buf.update_priorities(out["indices"], np.full(1000, 2.0), out["stamps"])  # four chunks
        print(f"{applied} priorities written in chunks of {ChunkedUpdates.CHUNK}")
        return applied


if __name__ == "__main__":
    main()
