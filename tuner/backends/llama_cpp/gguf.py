"""Reading a GGUF file's tensor table straight from its header, without parsing the metadata.

``gguf``'s reader takes seconds to parse a large vocabulary; telling whether two files hold the
same model only needs the tensor names and shapes, which follow the metadata in the header.
Layout (little-endian): magic, version (u32), tensor count (u64), metadata count (u64), the
metadata key/value pairs, then per tensor its name, dimension count (u32), dimensions (u64
each), type (u32) and data offset (u64).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct

from ...errors import AutotuneError

HEADER_BYTES = 24  # magic, version, tensor count, metadata count
STRING, ARRAY = 8, 9  # metadata value types of variable size
# Metadata value types with a fixed size in bytes: u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64.
FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(buf: mmap.mmap, kind: int, pos: int) -> int:
    """The offset just past a metadata value of type ``kind`` that starts at ``pos``."""
    if kind == STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    if kind != ARRAY:
        return pos + FIXED_SIZES[kind]
    sub, count = struct.unpack_from("<IQ", buf, pos)
    if sub in FIXED_SIZES:
        return pos + 12 + FIXED_SIZES[sub] * count
    pos += 12
    for _ in range(count):
        pos = _skip_value(buf, sub, pos)
    return pos


def tensor_shapes(path: str) -> list[tuple[str, list[int]]]:
    """The (tensor name, shape in elements) pairs of a GGUF file, in file order.

    An unreadable or cut header raises AutotuneError naming the file.
    """
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
            pos = HEADER_BYTES
            for _ in range(n_kv):
                pos = _skip_value(buf, STRING, pos)  # the key
                pos = _skip_value(buf, struct.unpack_from("<I", buf, pos)[0], pos + 4)
            shapes = []
            for _ in range(n_tensors):
                size = struct.unpack_from("<Q", buf, pos)[0]
                name = buf[pos + 8:pos + 8 + size].decode("utf-8")
                n_dims = struct.unpack_from("<I", buf, pos + 8 + size)[0]
                dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 12 + size)
                shapes.append((name, list(dims)))
                pos += 12 + size + 8 * n_dims + 12  # then the type (u32) and data offset (u64)
    except (KeyError, struct.error, ValueError, OSError) as exc:
        raise AutotuneError(f"model file {path} has an unreadable GGUF tensor table ({exc})") from None
    return shapes


def tensor_shape_signature(path: str) -> str:
    """Hash of the sorted (tensor name, shape in elements) pairs: the same for every quant type.

    Two files with the same signature hold the same model's tensors; llama.cpp's quantizer
    may reorder them, hence the sorting.
    """
    return hashlib.sha256(json.dumps(sorted(tensor_shapes(path))).encode()).hexdigest()
