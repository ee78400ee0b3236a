"""Reported metrics as TensorBoard event files, written by the driver into the run directory.

``tensorboard --logdir <storage_path>/<name>/tensorboard`` shows every numeric
metric rank 0 reports, against its ``step`` (or the report's number when it
has none). The driver writes the files itself, without TensorFlow (which it
never imports) and through the run's ``pyarrow`` filesystem, so the same code
writes to a local disk, S3 or GCS.

The format: a file of TFRecords (length, masked CRC32C of the length, data,
masked CRC32C of the data), each holding one ``tensorflow.Event`` protocol
buffer; the first event carries the file version, the others one summary of
scalar values each. The few protobuf fields needed are encoded here.
"""

from __future__ import annotations

import logging
import math
import socket
import struct
import time
from typing import Any, Mapping, Optional

import pyarrow.fs as pafs

from raytf._internal import storage as _storage

logger = logging.getLogger(__name__)

DIRECTORY = "tensorboard"


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord: what TensorFlow's record writer frames ``data`` in."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked(crc32c(length))) + data + struct.pack("<I", _masked(crc32c(data)))


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 fields encode negatives as two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, wire_type: int) -> bytes:
    return _varint((number << 3) | wire_type)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def event(
    wall_time: float, step: int, *, scalars: Optional[Mapping[str, float]] = None, file_version: Optional[str] = None
) -> bytes:
    """A ``tensorflow.Event``: wall_time (1, double), step (2, int64), file_version (3) or summary (5)."""
    out = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if scalars:
        # Summary { repeated Value value = 1 }; Value { string tag = 1; float simple_value = 2 }
        values = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", value))
            for tag, value in scalars.items()
        )
        out += _bytes_field(5, values)
    return out


_FLOAT32_MAX = 3.4028234663852886e38  # TensorBoard's scalars are float32
_warned: set[str] = set()


def scalars_of(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics TensorBoard can plot: finite numbers within float32's range, nested dicts
    flattened to ``a/b``. A value beyond float32 is left out (with one warning per metric); the
    history keeps it as reported."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            out.update({f"{key}/{k}": v for k, v in scalars_of(value).items()})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an int beyond any float
                number = math.inf
            if isinstance(value, float) and not math.isfinite(value):
                continue  # NaN and infinities: nothing to plot
            if abs(number) > _FLOAT32_MAX:
                if key not in _warned:
                    _warned.add(key)
                    logger.warning(
                        "metric %r = %r is beyond float32's range, which TensorBoard's scalars "
                        "have; it is not plotted (result.history keeps it)",
                        key,
                        value,
                    )
                continue
            out[key] = number
    return out


class EventWriter:
    """One event file per driver start under ``<run>/tensorboard/``.

    On a local disk each flush appends; an object store cannot append, so
    there the file is written whole at each flush (scalars only: small).
    """

    def __init__(self, fs: pafs.FileSystem, run_root: str, driver_start: int):
        self._fs = fs
        directory = _storage.join(fs, run_root, DIRECTORY)
        fs.create_dir(directory, recursive=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.raytf{driver_start}"
        self._path = _storage.join(fs, directory, name)
        self._local = isinstance(fs, pafs.LocalFileSystem)
        self._written: list[bytes] = []  # everything so far (object stores rewrite the whole file)
        self._pending: list[bytes] = [record(event(time.time(), 0, file_version="brain.Event:2"))]

    def add(self, step: int, metrics: Mapping[str, Any]) -> None:
        scalars = scalars_of(metrics)
        if scalars:
            self._pending.append(record(event(time.time(), step, scalars=scalars)))

    def flush(self) -> None:
        if not self._pending:
            return
        if self._local:
            with open(self._path, "ab") as out:
                out.write(b"".join(self._pending))
        else:
            self._written.extend(self._pending)
            with self._fs.open_output_stream(self._path) as out:
                out.write(b"".join(self._written))
        self._pending = []
