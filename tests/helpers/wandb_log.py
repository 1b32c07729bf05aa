"""Read a W&B offline run's ``run-ID.wandb`` file back: its history rows (step → metrics).

wandb 0.31 ships no Python reader any more (``wandb.sdk.internal.datastore`` is gone; the
Go core reads the file), so this reads the format directly: the LevelDB log format
(32 KiB blocks, each record a 7-byte header ``<crc32 uint32, length uint16, type uint8>``
then its bytes; FULL / FIRST / MIDDLE / LAST fragments) after W&B's 7-byte file header
``":W&B", 0xBEE1, version 0``; every record is a ``wandb.proto.wandb_internal_pb2.Record``
(the library's own message), checked against its CRC-32 (seeded with the type byte, as
W&B writes it). History rows are the records of type ``history``: items with a ``key`` (or
a ``nested_key`` path, joined with "/") and a ``value_json``.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

BLOCK_BYTES = 32768
HEADER = (b":W&B", 0xBEE1, 0)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every record of the file, parsed (``wandb_internal_pb2.Record``), in order.

    Raises:
        ValueError: a bad file header, a CRC mismatch or a broken fragment chain.
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    header = struct.unpack_from("<4sHB", data, 0)
    if header != HEADER:
        raise ValueError(f"{path}: file header {header!r}, expected {HEADER!r}")
    pos, chunks, pending = 7, [], None
    while pos + 7 <= len(data):
        left = BLOCK_BYTES - pos % BLOCK_BYTES
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        if kind == 0 and length == 0:  # zero padding to the block's end
            pos += left
            continue
        body = data[pos + 7: pos + 7 + length]
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: CRC mismatch in the record at byte {pos}")
        pos += 7 + length
        if kind == FULL:
            chunks.append(body)
        elif kind == FIRST:
            pending = body
        elif kind in (MIDDLE, LAST) and pending is not None:
            pending += body
            if kind == LAST:
                chunks.append(pending)
                pending = None
        else:
            raise ValueError(f"{path}: record type {kind} at byte {pos} breaks the fragment chain")
    out = []
    for chunk in chunks:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(chunk)
        out.append(rec)
    return out


def history_rows(path: Path) -> list[dict[str, Any]]:
    """The history rows of the file, in order: ``{name: value}``, with W&B's own ``_step``,
    ``_runtime`` and ``_timestamp``."""
    rows = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
    return rows
