"""Ray for the benchmarks: whether it is installed, and a session that always shuts down."""

from __future__ import annotations

import contextlib

from replaybench.impl.machine import usable_cores

__all__ = ["unavailable", "session"]


def unavailable() -> str:
    """Why Ray cannot be used here ("" when it can): the optional extra is not installed."""
    try:
        import ray  # noqa: F401
    except ImportError as err:
        return f"ray is not installed (pip install 'replaybench[ray]'): {err}"
    return ""


@contextlib.contextmanager
def session(num_cpus: int | None = None):
    """``ray.init`` of a new local instance (``num_cpus``: default every core), without dashboard
    or driver logging; ``ray.shutdown`` on every exit path, which stops every actor process."""
    import ray

    if ray.is_initialized():  # a session left by someone else would change what is measured
        ray.shutdown()
    # address="local": always a new local instance, never a cluster some other process started here
    ray.init(address="local", num_cpus=num_cpus or usable_cores(), include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()
