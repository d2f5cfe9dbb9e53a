"""Parts every engine and algorithm of :mod:`impl.rl` shares; nothing here imports them.

==============  ===============================================================
errors          ConfigError (a bad argument), InjectedFailure, WorkerFailed
result          TrainResult (what a run measured) and the update schedule
envs            environments, transition schema, thresholds, episode log, staging, EnvRunner
seeding         RunSeeds: every process's, env's and network's seed from one SeedSequence
profiler        per-section perf_counter accumulators
processes       usable cores, free ports, work shares, the progress cadence
shared_state    counters, rate limiter and weight broadcast in shared memory
allreduce       the learners' gradient mean over shared memory (PAL's averaging, L > 1)
stepping        SharedVectorEnv: n_e envs over n_w worker processes in lock step (PAAC's runners)
local_replay    building and warming up the in-process buffer
device          the learners' device setting ("cpu", "cuda", "auto"), one-copy results to the host
device_feed     replay samples to a learner's device through pinned host memory
==============  ===============================================================
"""
