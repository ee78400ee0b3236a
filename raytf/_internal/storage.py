"""Where a run keeps its files: a local directory or any ``pyarrow.fs`` URI.

Every JSON file raytf writes (the checkpoint index, history, run record,
lease claims) goes through :func:`write_json`: replaced whole, so a reader
sees the old file or the new one, and standard JSON, so any tool can read it
(non-finite floats become the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"``, which :func:`read_json` turns back into floats).
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import uuid
from typing import Any, Optional

import pyarrow.fs as pafs

from raytf._internal.redact import redact, scrub
from raytf.errors import ConfigError, StorageError

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def resolve_storage(
    storage_path: str | os.PathLike, filesystem: Optional[pafs.FileSystem] = None
) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, root path on it, root as the user should see it: :func:`redact`'s)."""
    text = os.fspath(storage_path)
    if filesystem is not None:
        root = text.rstrip("/")
        return filesystem, root, f"{filesystem.type_name}://{root.lstrip('/')}"
    if "://" not in text:
        root = os.path.abspath(os.path.expanduser(text))
        return pafs.LocalFileSystem(), root, root
    try:
        filesystem, root = pafs.FileSystem.from_uri(text)
    except (ValueError, OSError) as error:  # pyarrow.ArrowInvalid is a ValueError
        raise ConfigError(
            f"RunConfig.storage_path={redact(text)!r} is not a URI pyarrow.fs can open: {scrub(str(error), text)}"
        ) from None
    return filesystem, root.rstrip("/"), redact(text.rstrip("/"))


def join(fs: pafs.FileSystem, *parts: str) -> str:
    return os.path.join(*parts) if isinstance(fs, pafs.LocalFileSystem) else posixpath.join(*parts)


def plain_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its JSON-safe string."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: plain_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_json(v) for v in value]
    return value


def _restore_non_finite(value: Any) -> Any:
    if isinstance(value, str):
        return _NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {k: _restore_non_finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore_non_finite(v) for v in value]
    return value


def dumps(value: Any) -> bytes:
    return json.dumps(plain_json(value), indent=1, sort_keys=True, allow_nan=False).encode()


def loads(data: bytes | str) -> Any:
    """JSON as raytf writes it. Also reads files of older raytf versions, which wrote bare NaN."""
    return _restore_non_finite(json.loads(data))


def write_json(fs: pafs.FileSystem, path: str, value: Any) -> None:
    """Replace ``path`` with ``value`` as standard JSON, so a reader never sees half a file.

    A local write goes to a temporary name and is renamed into place (atomic
    on POSIX); an object store writes a whole object with one PUT. A write that fails leaves
    nothing behind and raises :class:`~raytf.errors.StorageError` naming the path and the cause.
    """
    data = dumps(value)
    tmp = f"{path}.tmp-{uuid.uuid4().hex}" if isinstance(fs, pafs.LocalFileSystem) else path
    try:
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        if tmp != path:
            os.replace(tmp, path)
    except OSError as error:
        if tmp != path:
            try:
                os.remove(tmp)  # nothing left over: a disk that filled up mid-write keeps no half file
            except OSError:
                pass
        raise StorageError(
            f"raytf could not write {path} ({type(error).__name__}: {error}); the run's storage "
            "is read-only, full or unreachable: free or fix it, then run again with the same "
            "RunConfig to resume from the last committed checkpoint"
        ) from error


def read_json(fs: pafs.FileSystem, path: str) -> Any:
    with fs.open_input_stream(path) as stream:
        return loads(stream.read())


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


class RunStorage:
    """The directory of one run, ``<storage_path>/<name>``."""

    def __init__(self, storage_path: str | os.PathLike, name: str, filesystem: Optional[pafs.FileSystem] = None):
        self.filesystem, root, shown_root = resolve_storage(storage_path, filesystem)
        self.root = join(self.filesystem, root, name)
        self._given = os.fspath(storage_path)  # with any credentials: only to hide them in errors
        base, _, query = shown_root.partition("?")  # s3://b/p?endpoint_override=... keeps its query last
        self.uri = f"{base.rstrip('/')}/{name}" + (f"?{query}" if query else "")  # as shown: redacted
        given_base, _, given_query = self._given.rstrip("/").partition("?")
        # The run's URI with its credentials, for what opens the filesystem itself (a launched script).
        self.full_uri = (
            f"{given_base.rstrip('/')}/{name}" + (f"?{given_query}" if given_query else "")
            if "://" in self._given and filesystem is None
            else self.uri
        )
        try:
            self.filesystem.create_dir(self.root, recursive=True)
        except OSError as error:
            raise self._unwritable(error) from None

    def check_writable(self) -> None:
        """Write and remove a small file in the run's directory: a storage path that is a file, on a
        read-only disk or in a bucket this user cannot write fails here, before anything starts."""
        probe = self.path(f".raytf-write-check-{uuid.uuid4().hex}")
        try:
            with self.filesystem.open_output_stream(probe) as out:
                out.write(b"raytf")
            self.filesystem.delete_file(probe)
        except OSError as error:
            raise self._unwritable(error) from None

    def _unwritable(self, error: OSError) -> ConfigError:
        return ConfigError(
            f"RunConfig.storage_path: raytf cannot write the run's directory {self.uri} ({self.scrub(str(error))}). "
            "Give a storage_path that is a directory (or bucket prefix) this user can write; raytf creates it if missing"
        )

    def scrub(self, text: str) -> str:
        """``text`` with the storage path's secrets hidden (:func:`scrub`)."""
        return scrub(text, self._given)

    def path(self, relpath: str) -> str:
        return join(self.filesystem, self.root, relpath)

    def write_json(self, relpath: str, value: Any) -> None:
        write_json(self.filesystem, self.path(relpath), value)

    def read_json(self, relpath: str, default: Any = None) -> Any:
        """The JSON at ``relpath``, or ``default`` when there is no such file."""
        path = self.path(relpath)
        if default is not None and not exists(self.filesystem, path):
            return default
        return read_json(self.filesystem, path)


# The bytes read per request when files are copied to or from storage: an object store serves each
# read as one ranged GET, so pyarrow's default (1 MiB) makes 1,024 sequential requests per GiB of
# checkpoint (request latency, not bandwidth, bounds it); 64 MiB makes 16. Measured against the
# loopback S3 server (moto), a 256 MiB download: 29.5 s at 1 MiB, 2.2 s at 16 MiB, 0.9 s at 64 MiB.
COPY_CHUNK = 64 << 20


def copy_files(
    source: str, target: str, source_filesystem: pafs.FileSystem, destination_filesystem: pafs.FileSystem
) -> None:
    """``pyarrow.fs.copy_files`` in :data:`COPY_CHUNK` reads (a file, or a directory's files)."""
    pafs.copy_files(
        source,
        target,
        source_filesystem=source_filesystem,
        destination_filesystem=destination_filesystem,
        chunk_size=COPY_CHUNK,
    )
