"""A tiny pure-python safetensors reader/writer (docs/MODEL.md#safetensors-shards).

File layout: [u64 LE header_len][JSON header][data]. Each header entry is
{dtype, shape, data_offsets: [start, end]} relative to the end of the header; the optional
"__metadata__" key is skipped. BF16 is handled with uint16 <-> uint32 shifts (bf16 -> f32 is
`bits << 16`, exact; f32 -> bf16 rounds to nearest even).
"""
import json
import os
import struct

import numpy as np

DTYPES = {  # safetensors dtype tag -> numpy dtype of the stored elements
    "BF16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
}


def bf16_bits_to_f32(bits):
    """uint16 bf16 bits -> float32 (exact widening: bits << 16)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    """float32 -> uint16 bf16 bits, round to nearest even (inputs must be finite)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def bf16_round(x):
    """round float values to the nearest bf16 and return them as float64."""
    return bf16_bits_to_f32(f32_to_bf16_bits(np.asarray(x, np.float32))).astype(np.float64)


class SafeTensorsFile:
    """One shard: header parsed eagerly, tensor bytes read on demand."""

    def __init__(self, path):
        self.path = path
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        self.data_start = 8 + n
        self.meta = header.pop("__metadata__", None)
        self.entries = header  # name -> {dtype, shape, data_offsets}

    def names(self):
        return list(self.entries)

    def abs_range(self, name):
        """absolute [start, end) byte range of a tensor in the file."""
        s, e = self.entries[name]["data_offsets"]
        return self.data_start + s, self.data_start + e

    def raw(self, name):
        ent = self.entries[name]
        start, end = self.abs_range(name)
        with open(self.path, "rb") as f:
            f.seek(start)
            buf = f.read(end - start)
        arr = np.frombuffer(buf, dtype=DTYPES[ent["dtype"]])
        return ent["dtype"], arr.reshape(ent["shape"])

    def get(self, name):
        """tensor as float64 (BF16/F16/F32 widened) or as its integer dtype (U8 etc.)."""
        dtype, arr = self.raw(name)
        if dtype == "BF16":
            return bf16_bits_to_f32(arr).astype(np.float64)
        if dtype in ("F16", "F32", "F64"):
            return arr.astype(np.float64)
        return arr.copy()


def write_safetensors(path, tensors, metadata=None, align=8):
    """tensors: ordered list of (name, dtype_tag, shape, bytes); data laid out in list order,
    back to back (no gaps). The header is space-padded so the data section starts on an
    `align` boundary. Returns {name: (abs_start, abs_end)}."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    for name, dtype, shape, data in tensors:
        n = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
        assert len(data) == n, (name, len(data), n)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hjson = json.dumps(header, separators=(",", ":")).encode()
    pad = (-(8 + len(hjson))) % align
    hjson += b" " * pad
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for _, _, _, data in tensors:
            f.write(data)
    os.replace(tmp, path)
    base = 8 + len(hjson)
    return {name: (base + header[name]["data_offsets"][0], base + header[name]["data_offsets"][1])
            for name, _, _, _ in tensors}


class ShardedCheckpoint:
    """A model directory: model.safetensors.index.json (weight_map) or a single
    model.safetensors / any *.safetensors files. Lookup by exact tensor name."""

    def __init__(self, model_dir):
        self.dir = model_dir
        idx = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(idx):
            with open(idx) as f:
                shard_names = sorted(set(json.load(f)["weight_map"].values()))
        else:
            shard_names = sorted(p for p in os.listdir(model_dir) if p.endswith(".safetensors"))
        self.shards = {s: SafeTensorsFile(os.path.join(model_dir, s)) for s in shard_names}
        self.where = {}
        for s, st in self.shards.items():
            for name in st.names():
                self.where[name] = s

    def __contains__(self, name):
        return name in self.where

    def get(self, name):
        return self.shards[self.where[name]].get(name)

    def raw(self, name):
        return self.shards[self.where[name]].raw(name)
