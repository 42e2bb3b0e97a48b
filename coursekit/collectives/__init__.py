"""Collective operations written only against the point-to-point :class:`~coursekit.comm.Comm`.

Every collective is a plain function ``f(comm, x, ..., algorithm=NAME, check=True)`` that
runs unchanged on every backend. ``ALGORITHMS[collective]`` lists the algorithm names a
collective accepts and ``DEFAULT_ALGORITHM[collective]`` the one it uses when none is
named. Each module's docstring states its algorithms' alpha-beta-gamma costs;
:mod:`coursekit.costmodel` has the same formulas as code.

``check=True`` (the default) first exchanges a small fingerprint of the call so that
mismatched shapes, dtypes, roots, ops or algorithms raise the same ValueError on every
rank (see :mod:`.fingerprint`); ``check=False`` skips it (MPI's contract: you promise).
"""

from . import allgather as _allgather
from . import allreduce as _allreduce
from . import alltoall as _alltoall
from . import bcast as _bcast
from . import reduce as _reduce
from . import reduce_scatter as _reduce_scatter
from . import scatter_gather as _scatter_gather
from .allgather import allgather
from .allreduce import allreduce
from .alltoall import alltoall
from .bcast import bcast
from .hierarchical import hierarchical_allreduce
from .ops import OPS
from .reduce import reduce
from .reduce_scatter import reduce_scatter
from .scatter_gather import gather, scatter
from .tags import COLLECTIVES, TAG_BASE

FUNCTIONS = {"bcast": bcast, "scatter": scatter, "gather": gather, "reduce": reduce,
             "allreduce": allreduce, "reduce_scatter": reduce_scatter,
             "allgather": allgather, "alltoall": alltoall}
"""Collective name -> function."""

ALGORITHMS = {
    "bcast": tuple(_bcast.ALGORITHMS),
    "scatter": tuple(_scatter_gather.SCATTER_ALGORITHMS),
    "gather": tuple(_scatter_gather.GATHER_ALGORITHMS),
    "reduce": tuple(_reduce.ALGORITHMS),
    "allreduce": tuple(_allreduce.ALGORITHMS),
    "reduce_scatter": tuple(_reduce_scatter.ALGORITHMS),
    "allgather": tuple(_allgather.ALGORITHMS),
    "alltoall": tuple(_alltoall.ALGORITHMS),
}
"""Collective name -> the algorithm names it accepts."""

DEFAULT_ALGORITHM = {
    "bcast": _bcast.DEFAULT,
    "scatter": _scatter_gather.SCATTER_DEFAULT,
    "gather": _scatter_gather.GATHER_DEFAULT,
    "reduce": _reduce.DEFAULT,
    "allreduce": _allreduce.DEFAULT,
    "reduce_scatter": _reduce_scatter.DEFAULT,
    "allgather": _allgather.DEFAULT,
    "alltoall": _alltoall.DEFAULT,
}

__all__ = ["ALGORITHMS", "COLLECTIVES", "DEFAULT_ALGORITHM", "FUNCTIONS", "OPS", "TAG_BASE",
           "allgather", "allreduce", "alltoall", "bcast", "gather", "hierarchical_allreduce",
           "reduce", "reduce_scatter", "scatter"]
