"""The wire format shared by every backend: a small fixed header plus raw bytes.

Nothing on this path is pickled, so a frame can never execute code on the receiver.

Header (little-endian, 16 + 8*ndim bytes)::

    magic  4s   b"CKM1"
    dtype  u8   code into DTYPES (bool, int8..64, uint8..64, float16/32/64, complex64/128)
    ndim   u8   0..MAX_NDIM
    flags  u8   bit 0 = INLINE: the payload follows the header in the same buffer
                bit 1 = REMOTE: a 24-byte descriptor follows instead (see below)
    pad    x
    tag    i32  >= 0 (user tags 0..MAX_TAG, internal tags above)
    source i32  sender's rank
    shape  ndim * u64

A message is either one buffer ``header + payload`` (INLINE; used for small payloads) or
two parts ``header``, ``payload``. The payload is the array's bytes in C order,
little-endian; its length must equal ``prod(shape) * itemsize``. A REMOTE message is one
buffer ``header + descriptor`` (u64 pid, u64 address, u64 id, little-endian): the payload
stays in the sender's memory at ``address`` and the receiver copies it from there
(:mod:`coursekit.comm.cma`). Anything else is rejected with a :class:`CommError` that says
what was wrong.
"""

from __future__ import annotations

import struct
from math import prod
from typing import NamedTuple

import numpy as np

from .errors import CommError

MAGIC = b"CKM1"
INLINE = 0x01
REMOTE = 0x02
_FLAGS = (0, INLINE, REMOTE)
MAX_NDIM = 32
INLINE_MAX = 8192
"""Payloads up to this many bytes travel inline (one part, one extra small copy)."""

_HEAD = struct.Struct("<4sBBBxii")
_DIMS = tuple(struct.Struct(f"<{n}Q") for n in range(MAX_NDIM + 1))
_FULL = tuple(struct.Struct(f"<4sBBBxii{n}Q") for n in range(MAX_NDIM + 1))
HEADER_MIN = _HEAD.size
DESCRIPTOR = struct.Struct("<QQQ")

DTYPES = tuple(np.dtype(s) for s in (
    "?", "<i1", "<i2", "<i4", "<i8", "<u1", "<u2", "<u4", "<u8",
    "<f2", "<f4", "<f8", "<c8", "<c16"))
DTYPE_CODE = {dt: code for code, dt in enumerate(DTYPES)}
"""The wire code of each dtype a message may carry (the index into DTYPES)."""
ALLOWED = "bool, int8/16/32/64, uint8/16/32/64, float16/32/64, complex64/128"


class Header(NamedTuple):
    """A decoded header. ``size`` is its length in bytes; ``nbytes`` the payload's."""

    dtype: np.dtype
    shape: tuple
    tag: int
    source: int
    inline: bool
    size: int
    nbytes: int
    remote: bool = False


def wire_array(arr) -> np.ndarray:
    """Return ``arr`` as a C-contiguous little-endian array ready to send (a view if possible).

    Raises TypeError for anything that is not a NumPy array of a supported numeric dtype.
    """
    if type(arr) is np.ndarray and arr.dtype in DTYPE_CODE and arr.flags.c_contiguous:
        return arr  # already one (Comm.send checks this case inline, before calling here)
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"Comm sends NumPy arrays only, got {type(arr).__name__}; "
                        "wrap the value with np.asarray(...)")
    dt = arr.dtype
    if dt not in DTYPE_CODE:
        wire = dt.newbyteorder("<") if dt.kind in "biufc" else None
        if wire not in DTYPE_CODE:
            raise TypeError(f"Comm cannot send dtype {dt}; allowed dtypes: {ALLOWED}")
        arr = arr.astype(wire)
    if arr.ndim > MAX_NDIM:
        raise TypeError(f"Comm sends arrays with at most {MAX_NDIM} dimensions, got {arr.ndim}")
    return np.ascontiguousarray(arr).view(np.ndarray)


def encode(arr: np.ndarray, tag: int, source: int, inline: bool = False) -> bytes:
    """Header for ``arr`` (a :func:`wire_array`), followed by its bytes when ``inline``."""
    flags = INLINE if inline else 0
    head = _HEADERS.get((arr.dtype, arr.shape, flags, tag, source))  # _header's lookup, inlined
    if head is None:
        head = _header(arr, flags, tag, source)
    return head + arr.tobytes() if inline else head


def inline_header(arr: np.ndarray, tag: int, source: int) -> bytes:
    """The header of an INLINE message for ``arr``; its bytes must follow it in the same
    buffer (for a transport that writes the payload itself, e.g. into shared memory)."""
    return _header(arr, INLINE, tag, source)


def encode_remote(arr: np.ndarray, tag: int, source: int, pid: int, message_id: int) -> bytes:
    """A REMOTE message for ``arr``: header + (pid, address of arr's data, message_id)."""
    return _header(arr, REMOTE, tag, source) + DESCRIPTOR.pack(pid, arr.ctypes.data, message_id)


_HEADERS: dict = {}
"""Headers packed before, by (dtype, shape, flags, tag, source): a send's header is
usually one it sent before, and looking it up costs a third of packing it."""
_HEADERS_MAX = 4096


def _header(arr: np.ndarray, flags: int, tag: int, source: int) -> bytes:
    key = (arr.dtype, arr.shape, flags, tag, source)
    head = _HEADERS.get(key)
    if head is None:
        head = _FULL[arr.ndim].pack(MAGIC, DTYPE_CODE[arr.dtype], arr.ndim, flags, tag, source,
                                    *arr.shape)
        if len(_HEADERS) >= _HEADERS_MAX:
            _HEADERS.clear()
        _HEADERS[key] = head
    return head


def descriptor(header: Header, frame) -> tuple[int, int, int]:
    """(pid, address, message_id) of a REMOTE message whose first part is ``frame``."""
    return DESCRIPTOR.unpack_from(frame, header.size)


def nbytes_of(buf) -> int:
    """Length in bytes of any buffer (bytes, bytearray, zmq.Frame, memoryview, ndarray)."""
    # isinstance, not hasattr: zmq.Frame answers unknown attributes slowly (socket options)
    return buf.nbytes if isinstance(buf, (np.ndarray, memoryview)) else len(buf)


def decode(frame, size: int) -> Header:
    """Parse the first part of a message (any buffer) from a world of ``size`` ranks.

    For an INLINE header the payload is ``frame[header.size:]`` (see :func:`to_array`),
    for a REMOTE one the descriptor (see :func:`descriptor`).
    Raises CommError naming the defect for anything that is not a well-formed frame.
    """
    length = nbytes_of(frame)
    if length < HEADER_MIN:
        raise CommError(f"malformed frame: {length} bytes is shorter than the "
                        f"{HEADER_MIN}-byte header")
    magic, code, ndim, flags, tag, source = fields = _HEAD.unpack_from(frame)
    if (magic != MAGIC or code >= len(DTYPES) or ndim > MAX_NDIM or flags not in _FLAGS
            or tag < 0 or not 0 <= source < size):
        _reject(fields, size)
    hsize = HEADER_MIN + 8 * ndim
    if length < hsize:
        raise CommError(f"malformed frame: {length} bytes cannot hold a {ndim}-d shape")
    shape = _DIMS[ndim].unpack_from(frame, HEADER_MIN)
    dtype = DTYPES[code]
    nbytes = prod(shape) * dtype.itemsize
    inline, remote = flags == INLINE, flags == REMOTE
    rest = length - hsize
    if rest != (nbytes if inline else DESCRIPTOR.size if remote else 0):
        if inline:
            raise CommError(f"malformed frame: inline payload has {rest} bytes, "
                            f"header says {dtype}{shape} = {nbytes} bytes")
        if remote:
            raise CommError(f"malformed frame: remote descriptor has {rest} bytes, "
                            f"not {DESCRIPTOR.size}")
        raise CommError(f"malformed frame: {rest} unexpected bytes after the header")
    return Header(dtype, shape, tag, source, inline, hsize, nbytes, remote)


def _reject(fields, size: int):
    """Raise the CommError that names what is wrong with a header's fixed fields."""
    magic, code, ndim, flags, tag, source = fields
    if magic != MAGIC:
        raise CommError(f"foreign frame: magic {bytes(magic)!r} is not {MAGIC!r}")
    if code >= len(DTYPES):
        raise CommError(f"malformed frame: unknown dtype code {code}")
    if ndim > MAX_NDIM:
        raise CommError(f"malformed frame: ndim {ndim} > {MAX_NDIM}")
    if flags not in _FLAGS:
        raise CommError(f"malformed frame: flags {flags:#x} are not one of "
                        f"{', '.join(f'{f:#x}' for f in _FLAGS)}")
    if tag < 0:
        raise CommError(f"malformed frame: negative tag {tag}")
    raise CommError(f"malformed frame: source rank {source} is not in 0..{size - 1}")


def check_payload(header: Header, nbytes: int) -> None:
    """Raise CommError unless a separate payload part has exactly the announced length."""
    if nbytes != header.nbytes:
        raise CommError(f"malformed message: payload has {nbytes} bytes, header "
                        f"announced {header.dtype}{header.shape} = {header.nbytes} bytes")


def to_array(header: Header, buf, offset: int = 0) -> np.ndarray:
    """View ``buf[offset:]`` (any buffer) as the array the header describes, without a copy."""
    if type(buf) is not bytearray or len(buf) - offset != header.nbytes:  # lanes' frames pass
        check_payload(header, nbytes_of(buf) - offset)                   # this cheaply
    return np.ndarray(header.shape, header.dtype, buf, offset)  # half np.frombuffer().reshape's cost
