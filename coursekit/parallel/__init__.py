"""Parallel training strategies, one module (or package) per parallelism.

* :mod:`coursekit.parallel.data_parallel` - synchronous data-parallel SGD: allreduce, parameter
  server or averaging, LR rules, buckets and overlap, stragglers, checkpoints.
* :mod:`coursekit.parallel.param_server` - sharded parameter server, BSP / SSP / ASP
  (Downpour), staleness, worker failure.
* :mod:`coursekit.parallel.compression` - compressor / error-feedback memory / communicator.
* :mod:`coursekit.parallel.pipeline` - pipeline schedules as data, validator, simulator, executor.
* :mod:`coursekit.parallel.tensor_parallel` - Megatron column/row-parallel layers, layer split.
* :mod:`coursekit.parallel.zero` - ZeRO stages 0-3: optimizer state, gradients, parameters
  partitioned over the data-parallel ranks.
* :mod:`coursekit.parallel.inference` - batch inference split over the ranks (scatter rows,
  gather labels).

The data path: :mod:`.prefetch` (a loader whose reader threads read ahead into a bounded
queue while the step computes) and :mod:`.input_pipeline` (chapter 7: step time without and
with prefetching, measured on the ranks against r + c and max(r / w, c)).

Shared by them: :mod:`.spans` (the one :class:`~.spans.Span` type: what each rank did when),
:mod:`.faults` (which faults a shared cluster allows), :mod:`.checkpoint` (the one checkpoint
module: what data parallel and the parameter server save, in files that prove they are whole).
"""
