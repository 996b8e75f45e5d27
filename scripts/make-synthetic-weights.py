#!/usr/bin/env python3
"""Write large synthetic weight shards for staging benchmarks (standard library only).

Usage: python3 scripts/make-synthetic-weights.py OUTDIR [--files 8] [--size 1GiB] [--seed 0] [--force]

Writes OUTDIR/model-0000N-of-0000M.safetensors (N = 1..M) of exactly --size bytes each plus
model.safetensors.index.json, like a sharded Hugging Face snapshot. Each shard is a valid
safetensors file holding one U8 tensor; its data is pseudo-random and deterministic: one random
64 MiB block (from --seed), byte-substituted per file (a permutation table drawn from
(seed, file)), then written per 64 MiB chunk rotated by an offset drawn from (seed, file,
chunk) behind a 32-byte chunk key. So files differ everywhere, chunks differ from each other,
ordinary compressors (gzip, zstd, xz) find nothing to squeeze, and the same arguments give
byte-identical files. Cost: ~0.15 s of CPU per file; the rest is disk speed.

An existing OUTDIR made with the same arguments (checked via the index's metadata and the shard
sizes) is left alone unless --force is given. --size takes bytes or a B/KiB/MiB/GiB/KB/MB/GB suffix.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

BLOCK = 64 * 1024 * 1024
INDEX = "model.safetensors.index.json"
UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not match or match[2].upper() not in UNITS:
        raise argparse.ArgumentTypeError(f"{text!r}: give bytes or e.g. 512MiB, 1GiB")
    return int(match[1]) * UNITS[match[2].upper()]


def shard_name(index: int, count: int) -> str:
    return f"model-{index:05d}-of-{count:05d}.safetensors"


def header(size: int, tensor: str) -> bytes:
    """A safetensors header (8-byte length + JSON padded to 8 bytes) for one U8 tensor filling ``size``."""
    data = size
    for _ in range(4):  # the header's length depends on the data length's digits
        meta = {
            "__metadata__": {"format": "pt", "generator": "labctl make-synthetic-weights"},
            tensor: {"dtype": "U8", "shape": [data], "data_offsets": [0, data]},
        }
        text = json.dumps(meta, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        new = size - 8 - len(text)
        if new == data:
            return struct.pack("<Q", len(text)) + text
        data = new
    raise SystemExit(f"make-synthetic-weights: cannot lay out a header for {size} bytes")


def _rng(*parts: int) -> random.Random:
    return random.Random(hashlib.sha256(":".join(map(str, parts)).encode()).digest())


def file_block(block: bytes, seed: int, file_index: int) -> bytes:
    """The block with every byte value substituted by a per-file permutation (C speed)."""
    table = list(range(256))
    _rng(seed, file_index).shuffle(table)
    return block.translate(bytes(table))


def chunks(block: bytes, seed: int, file_index: int, length: int) -> Iterator[memoryview | bytes]:
    """``length`` bytes: per 64 MiB chunk a 32-byte key, then the block rotated (zero-copy views)."""
    view = memoryview(block)
    chunk_index = 0
    while length > 0:
        key = hashlib.sha256(f"{seed}:{file_index}:{chunk_index}".encode()).digest()
        offset = _rng(seed, file_index, chunk_index).randrange(len(block))
        rotated: list[memoryview | bytes] = [key, view[offset:], view[:offset]]
        for part in rotated:
            piece = part[: max(0, length)]
            if len(piece):
                yield piece
            length -= len(piece)
        chunk_index += 1


def write_shard(path: Path, size: int, block: bytes, seed: int, file_index: int, tensor: str) -> None:
    head = header(size, tensor)
    if len(head) > size:
        raise SystemExit(f"make-synthetic-weights: --size {size} is too small for a safetensors header")
    data = file_block(block, seed, file_index)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as out:
        out.write(head)
        for piece in chunks(data, seed, file_index, size - len(head)):
            out.write(piece)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--size", type=parse_size, default=parse_size("1GiB"), help="bytes per file (default 1GiB)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rewrite even when OUTDIR looks up to date")
    args = parser.parse_args()
    if args.files < 1 or args.files > 99999:
        parser.error("--files must be 1..99999")
    names = [shard_name(i, args.files) for i in range(1, args.files + 1)]
    params = {"files": args.files, "size": args.size, "seed": args.seed}
    out: Path = args.outdir
    index_path = out / INDEX
    if not args.force and index_path.is_file():
        try:
            meta = json.loads(index_path.read_text())["metadata"]["synthetic"]
        except (ValueError, KeyError, TypeError):
            meta = None
        if meta == params and all((out / n).is_file() and (out / n).stat().st_size == args.size for n in names):
            print(f"make-synthetic-weights: {out}: up to date ({args.files} x {args.size} bytes)", file=sys.stderr)
            print(out)
            return
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("model-*-of-*.safetensors"):
        if stale.name not in names:
            stale.unlink()
    block = random.Random(args.seed).randbytes(BLOCK)
    started = time.monotonic()
    weight_map = {}
    for number, name in enumerate(names, start=1):
        tensor = f"synthetic.blob_{number:05d}"
        write_shard(out / name, args.size, block, args.seed, number, tensor)
        weight_map[tensor] = name
        print(f"make-synthetic-weights: {name} ({number}/{args.files})", file=sys.stderr)
    index = {"metadata": {"total_size": args.size * args.files, "synthetic": params}, "weight_map": weight_map}
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    took = time.monotonic() - started
    total = args.size * args.files
    print(
        f"make-synthetic-weights: {out}: {args.files} x {args.size} bytes in {took:.1f}s "
        f"({total / max(took, 1e-9) / 2**20:.0f} MiB/s)",
        file=sys.stderr,
    )
    print(out)


if __name__ == "__main__":
    main()
