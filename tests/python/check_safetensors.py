#!/usr/bin/python3
"""Cross-check of fsdp-cpp's safetensors files with PyTorch, no fsdp-cpp code.

Parses the format itself (struct + json: the safetensors package is not
installed), so this also checks that our files follow the published layout:
8-byte little-endian header length, JSON header, raw little-endian data.

  check_safetensors.py read FILE   # FILE written by the C++ test: values must match
  check_safetensors.py write FILE  # writes a torch state dict the C++ test loads

Both sides compute the expected values from one rule: tensor k (in the order
of SPECS) holds arange(numel) * 0.001 + k (float64, then cast to its dtype).
"""
import json
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}

SPECS = [  # must match tests/test_checkpoint_python.cpp
    ("embed.weight", [13, 7], torch.float32),
    ("blocks.0.fc.weight", [7, 5], torch.bfloat16),
    ("blocks.0.fc.bias", [5], torch.float16),
    ("head.scale", [], torch.float64),
    ("steps", [4], torch.int64),
]


def expected(k, shape, dtype):
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float64) * 0.001 + k).to(dtype).reshape(shape)


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert 8 + n <= len(blob), "header length beyond the file"
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dt = DTYPES[e["dtype"]]
        raw = bytearray(blob[base + b:base + end])
        t = torch.frombuffer(raw, dtype=dt) if raw else torch.empty(0, dtype=dt)
        out[name] = t.reshape(e["shape"])
    return out, header.get("__metadata__", {})


def cmd_read(path):
    tensors, meta = read(path)
    bad = 0
    for k, (name, shape, dtype) in enumerate(SPECS):
        want = expected(k, shape, dtype)
        got = tensors.get(name)
        if got is None:
            print(f"MISSING {name}")
            bad += 1
        elif got.dtype != want.dtype or list(got.shape) != list(want.shape) or not torch.equal(got, want):
            print(f"MISMATCH {name}: got {got.dtype} {list(got.shape)}, want {want.dtype} {list(want.shape)}")
            bad += 1
        else:
            print(f"ok {name} {NAMES[got.dtype]} {list(got.shape)}")
    if set(tensors) != {s[0] for s in SPECS}:
        print(f"UNEXPECTED {sorted(set(tensors) - {s[0] for s in SPECS})}")
        bad += 1
    print("metadata", meta)
    return 1 if bad else 0


def cmd_write(path):
    # A PyTorch state dict, written the way the safetensors package does it.
    sd = {name: expected(k, shape, dtype) for k, (name, shape, dtype) in enumerate(SPECS)}
    header, chunks, off = {}, [], 0
    for name, t in sorted(sd.items()):  # data order differs from SPECS on purpose
        raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
    print(f"wrote {path}: {len(sd)} tensors")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("read", "write"):
        print(__doc__)
        sys.exit(2)
    sys.exit(cmd_read(sys.argv[2]) if sys.argv[1] == "read" else cmd_write(sys.argv[2]))
