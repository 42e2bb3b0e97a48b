"""What-if at thousands of GPUs: a simulator on the alpha-beta cost model.

* :class:`Network` - workers in nodes, intra- and inter-node links (:mod:`.network`);
* :func:`allreduce_time` - closed forms for flat ring, tree, hierarchical (:mod:`.allreduce_time`);
* :func:`replay` - discrete-event replay of per-rank programs, e.g. the traces of a real
  collective (:mod:`.replay`); :func:`trace_collective` records them on ThreadComm ranks;
* :func:`simulate_step` - one data-parallel training step: backward pass, tensor-fusion
  buckets, overlap, stragglers (:mod:`.step`), and :func:`scaling` over worker counts;
* :mod:`.resnet50` - the ResNet-50 on 1024 GPUs case study (Jia et al. 2018), and
  :func:`~.at_scale.simulate_at_scale`, chapter 7's experiment on it;
* :mod:`.validate` - simulated vs measured: chapter 3's training step on the live cluster, with
  the link and gamma measured by :mod:`coursekit.measure`;
* :func:`replay_schedule` - chapter 5's pipeline schedules on the two-level network.
"""

from .allreduce_time import ALGORITHMS, allreduce_time
from .network import Network
from .pipeline_replay import PipelineReplay, programs_from_schedule, replay_schedule
from .replay import Compute, Deadlock, Recv, Replay, Send, programs_from_traces, replay
from .step import StepResult, Stragglers, Workload, buckets, scaling, simulate_step
from .trace import trace_collective

__all__ = ["ALGORITHMS", "Compute", "Deadlock", "Network", "PipelineReplay", "Recv", "Replay",
           "Send", "StepResult", "Stragglers", "Workload", "allreduce_time", "buckets",
           "programs_from_schedule", "programs_from_traces", "replay", "replay_schedule",
           "scaling", "simulate_step", "trace_collective"]
