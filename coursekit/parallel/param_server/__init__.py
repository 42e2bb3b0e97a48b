"""A sharded parameter server: BSP, SSP and ASP (Downpour) training, staleness, failures.

>>> from coursekit.cluster.runner import LocalRunner
>>> r = train(LocalRunner(4), PSConfig(model="ssp", staleness=2, steps=40), workers=3)
>>> r.topology
PSTopology(servers=1, workers=3)
>>> int(r.staleness.max()) <= 2
True

* :mod:`.async_sgd` - :func:`train_ps` (every rank's part) and :func:`train` on a runner;
* :mod:`.server` - a shard (SSP / ASP); :mod:`.bsp` - the lockstep loops of BSP;
* :mod:`.worker` - a worker's pull / compute / push; :mod:`.protocol` - the messages;
* :mod:`.consistency` - the SSP clock gate; the shards' checkpoints:
  :class:`coursekit.parallel.checkpoint.ShardState`;
* :mod:`.config` / :mod:`.results` - :class:`PSConfig` in, :class:`PSResult` out; the
  run's shape (``workers=``, ``servers=`` of :func:`train`) is a :class:`PSTopology`.
"""

from .async_sgd import train, train_ps
from .config import PSConfig
from .protocol import PSTopology
from .results import PSResult, ServerFailure

__all__ = ["PSConfig", "PSResult", "PSTopology", "ServerFailure", "train", "train_ps"]
