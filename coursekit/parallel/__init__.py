"""Parallel training strategies, one module (or package) per parallelism.

* :mod:`coursekit.parallel.pipeline` - pipeline schedules as data, validator, simulator, executor.
* :mod:`coursekit.parallel.tensor_parallel` - Megatron column/row-parallel layers, layer split.
"""
