"""Parallel training strategies, one module (or package) per parallelism.

* :mod:`coursekit.parallel.data_parallel` - synchronous data-parallel SGD: allreduce, parameter
  server or averaging (:mod:`.exchange`), LR rules, buckets and overlap, stragglers, checkpoints.
* :mod:`coursekit.parallel.param_server` / :mod:`coursekit.parallel.async_sgd` - sharded parameter
  server, BSP / SSP / ASP (Downpour), staleness, worker failure.
* :mod:`coursekit.parallel.compression` - compressor / error-feedback memory / communicator.
* :mod:`coursekit.parallel.pipeline` - pipeline schedules as data, validator, simulator, executor.
* :mod:`coursekit.parallel.tensor_parallel` - Megatron column/row-parallel layers, layer split.
"""
