"""One prioritized buffer in shared memory, used by two threads through its concurrency policy
(docs/concurrency.md). A process attaches the same way, with the handle as its argument.

    python examples/shared_buffer.py
"""

import threading

import numpy as np


def learner(handle, rounds: int, seen: list) -> None:
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    child = SharedPrioritizedBuffer.attach(handle)    # in a thread here; a child process alike
    try:
        for _ in range(rounds):
            out = child.sample(64)                    # fields, indices, weights and stamps
            td = np.abs(out["obs"][:, 0]) + 0.1       # a stand-in for |TD error|
            seen.append(child.update_priorities(out["indices"], td, out["stamps"]))
    finally:
        child.close()                                 # drops the mapping; only the owner frees it


def main(capacity: int = 2**12, rounds: int = 20, policy: str = "lazy-writing") -> list:
    from replaybench.impl.concurrent import SharedPrioritizedBuffer

    fields = {"obs": ((4,), "float32"), "action": ((), "int64")}
    buf = SharedPrioritizedBuffer.create(capacity, fields, variant="kary-aligned", policy=policy)
    try:
        rng = np.random.default_rng(0)
        buf.add({"obs": rng.random((512, 4), dtype=np.float32), "action": np.zeros(512, np.int64)})
        applied: list = []
        thread = threading.Thread(target=learner, args=(buf.handle, rounds, applied))
        thread.start()
        for _ in range(rounds):                       # this thread keeps inserting meanwhile
            buf.add({"obs": rng.random((32, 4), dtype=np.float32), "action": np.ones(32, np.int64)})
        thread.join()
        print(f"{len(buf)} stored, {sum(applied)} priorities written back "
              f"(updates to slots overwritten since they were sampled are skipped)")
        return applied
    finally:
        buf.close()                                   # the owner's close unlinks the segment


if __name__ == "__main__":
    main()
