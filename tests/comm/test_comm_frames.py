"""The wire format: round trips for every dtype/shape, and fuzzed frames never crash."""

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from coursekit.comm import CommError, frames

DTYPES = [np.dtype(d) for d in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8",
                                 "f2", "f4", "f8", "c8", "c16")]
arrays = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)))


def roundtrip(arr, inline):
    wire = frames.wire_array(arr)
    head = frames.encode(wire, tag=7, source=2, inline=inline)
    header = frames.decode(head, size=3)
    if inline:
        return header, frames.to_array(header, head, header.size)
    return header, frames.to_array(header, wire.tobytes())


@settings(max_examples=150, deadline=None)
@given(arrays, st.booleans())
def test_roundtrip_any_dtype_and_shape(arr, inline):
    header, back = roundtrip(arr, inline)
    assert (header.tag, header.source, header.inline) == (7, 2, inline)
    assert back.dtype == arr.dtype and back.shape == arr.shape
    np.testing.assert_array_equal(back, arr)  # NaNs compare equal here
    assert header.nbytes == arr.nbytes


def test_big_endian_and_noncontiguous_arrays_are_converted():
    arr = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2]
    _, back = roundtrip(arr, inline=False)
    assert back.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(back, [[0, 2], [4, 6], [8, 10]])


@pytest.mark.parametrize("bad", [[1, 2], 3.0, np.float32(1.0), b"raw", None])
def test_non_arrays_are_rejected(bad):
    with pytest.raises(TypeError, match="NumPy arrays only"):
        frames.wire_array(bad)


@pytest.mark.parametrize("dtype", ["O", "U3", "M8[s]", "V4", np.longdouble])
def test_unsupported_dtypes_are_rejected(dtype):
    with pytest.raises(TypeError, match="allowed dtypes"):
        frames.wire_array(np.zeros(2, dtype=dtype))


def valid_head(**over):
    fields = dict(magic=frames.MAGIC, code=10, ndim=1, flags=0, tag=0, source=0, dims=(4,))
    fields.update(over)
    return (struct.pack("<4sBBBxii", fields["magic"], fields["code"], fields["ndim"],
                        fields["flags"], fields["tag"], fields["source"])
            + struct.pack(f"<{len(fields['dims'])}Q", *fields["dims"]))


@pytest.mark.parametrize("head, why", [
    (b"", "shorter than"),
    (valid_head(magic=b"HTTP"), "foreign frame"),
    (valid_head(code=99), "unknown dtype"),
    (valid_head(ndim=40, dims=()), "ndim 40"),
    (valid_head(flags=0x80), "flags 0x80 are not one of"),
    (valid_head(flags=frames.INLINE | frames.REMOTE), "flags 0x3"),
    (valid_head(flags=frames.REMOTE) + b"x" * 16, "remote descriptor has 16 bytes"),
    (valid_head(tag=-3), "negative tag"),
    (valid_head(source=5), "source rank 5"),
    (valid_head(ndim=2), "cannot hold"),
    (valid_head() + b"xx", "unexpected bytes"),
    (valid_head(flags=frames.INLINE) + b"x" * 7, "inline payload has 7"),
])
def test_malformed_headers_name_the_defect(head, why):
    with pytest.raises(CommError, match=why):
        frames.decode(head, size=2)


def test_remote_message_carries_pid_address_and_id():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    head = frames.encode_remote(arr, tag=4, source=1, pid=1234, message_id=9)
    header = frames.decode(head, size=2)
    assert header.remote and not header.inline and header.nbytes == arr.nbytes
    assert (header.shape, header.tag, header.source) == ((2, 3), 4, 1)
    assert frames.descriptor(header, head) == (1234, arr.ctypes.data, 9)


def test_payload_length_is_checked():
    header = frames.decode(valid_head(), size=1)  # float16 (4,) = 8 bytes
    with pytest.raises(CommError, match="payload has 6 bytes"):
        frames.to_array(header, b"x" * 6)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_random_bytes_decode_or_raise_commerror(blob):
    try:
        header = frames.decode(blob, size=4)
    except CommError:
        return
    assert header.size <= len(blob)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255),
       st.integers(-2**31, 2**31 - 1), st.integers(-2**31, 2**31 - 1),
       st.lists(st.integers(0, 2**64 - 1), max_size=4), st.binary(max_size=40))
def test_fuzzed_headers_with_real_magic(code, ndim, flags, tag, source, dims, tail):
    blob = struct.pack("<4sBBBxii", frames.MAGIC, code, ndim, flags, tag, source)
    blob += struct.pack(f"<{len(dims)}Q", *dims) + tail
    try:
        header = frames.decode(blob, size=4)
    except CommError:
        return
    assert 0 <= header.source < 4 and header.tag >= 0 and header.dtype in DTYPES
