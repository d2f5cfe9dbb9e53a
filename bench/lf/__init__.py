"""The Lingua Franca benchmarks' backends (Kwok, Lohstroh, Lee, arXiv 2312.04704).

One module per workload, each with every backend it is measured on, all behind one shape
(construct, run rounds, close) so that the scenario (:mod:`bench.scenarios.lf`) times them the
same way in the same run:

- :mod:`.lockstep`: lock-step sampling with random actions (Ray, our static dataflow,
  gymnasium SyncVectorEnv and AsyncVectorEnv, multiprocessing queues);
- :mod:`.pql_ray`: parallel Q-learning on Ray (the static-dataflow side is
  :func:`impl.dataflow.run_pql`);
- :mod:`.multiagent`: multi-agent inference, one policy per agent (Ray, one process, our
  batched policy bank);
- :mod:`.raysession`: starting and stopping Ray, and saying why it is unavailable.
"""
