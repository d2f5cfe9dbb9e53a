"""Gossip learners (docs/gossip.md): two A2C learners on loopback nodes that average their
models by point-to-point messages over TCP, through the ``replaybench gossip`` command. The run
writes one result folder like any other; tiny sizes here.

    python examples/gossip_two_learners.py
"""


def main(steps: int = 2000, out: str | None = None) -> int:
    import tempfile

    from replaybench.cli import main as replaybench

    with tempfile.TemporaryDirectory() as tmp:
        return replaybench(["gossip", "--nodes", "2", "--learners-per-node", "1", "--topology", "ring",
                            "--peers", "1", "--staleness", "1", "--steps", str(steps), "--n-envs", "4",
                            "--env-workers", "0", "--timeout", "120", "--out", out or tmp, "--run-id", "gossip",
                            "--no-progress"])


if __name__ == "__main__":
    raise SystemExit(main())
