"""The Ray engine: the parallel replay loop's roles as Ray actors (:mod:`.driver` runs a run,
:mod:`.workers` holds the replay server, actor and learner actors). Needs the ``ray`` extra;
Ray itself is imported only when a run starts."""

from replaybench.impl.rl.engines.ray.driver import check, run_ray

__all__ = ["run_ray", "check"]
