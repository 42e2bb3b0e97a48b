"""Message tags reserved for collectives.

Every collective owns a block of 8 tags starting at :data:`TAG_BASE`, one per phase of its
algorithms (:func:`tag`); the fingerprint exchange of ``check=True`` has :data:`FINGERPRINT_TAG`.
Messages between two ranks with one tag arrive in the order they were sent (the Comm
contract, as in MPI), so a fixed tag per phase keeps steps, phases and successive calls
apart. User code should keep its own tags below TAG_BASE.
"""

COLLECTIVES = ("bcast", "scatter", "gather", "reduce", "allreduce",
               "reduce_scatter", "allgather", "alltoall")
TAG_BASE = 32000
FINGERPRINT_TAG = TAG_BASE + 8 * len(COLLECTIVES)
assert FINGERPRINT_TAG <= 32767  # MPI_TAG_UB is at least 32767 everywhere


def tag(collective: str, phase: int = 0) -> int:
    """The tag of ``phase`` (0..7) of ``collective``."""
    return TAG_BASE + 8 * COLLECTIVES.index(collective) + phase
