"""Checkpoint directories in a run's storage: upload through a staging name, a manifest of
every file's size and CRC32 written last, verification, and the names raytf gives them.

Layout under ``<storage_path>/<run name>/checkpoints/``::

    index.json                 the commit record (see manager.py)
    checkpoint_000003/         one committed checkpoint (the user's files)
        .raytf_manifest.json   every file's size and CRC32, written last into the staging copy
    .staging-<uuid>/           a checkpoint being uploaded; never listed in the index
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import uuid
import zlib
from typing import Any, Callable, Optional

import pyarrow.fs as pafs

from raytf._internal import storage as _storage
from raytf.errors import CheckpointError

MANIFEST = ".raytf_manifest.json"
STAGING_PREFIX = ".staging-"
_CHUNK = 1 << 20
_join = _storage.join
_NAME = re.compile(r"checkpoint_(\d{6,})")


def _crc32(stream: Any) -> tuple[int, int]:
    crc, size = 0, 0
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            return crc, size
        crc = zlib.crc32(chunk, crc)
        size += len(chunk)


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_links(root: str) -> None:
    """Refuse symbolic links in a checkpoint directory that leave it, dangle or loop.

    Links that stay inside the directory are followed (their targets' bytes
    are stored). One that leaves it would copy files the user never meant to
    store (``/etc/passwd``), and a loop would be copied level after level.
    """
    real_root = os.path.realpath(root)

    def walk(path: str, ancestors: frozenset[str]) -> None:
        for entry in os.scandir(path):
            relative = os.path.relpath(entry.path, root)
            if entry.is_symlink():
                target = os.path.realpath(entry.path)
                if not _within(target, real_root):
                    raise CheckpointError(
                        f"checkpoint directory {root!r}: {relative!r} is a symbolic link to {target!r}, "
                        "outside the checkpoint; copy the file in, or point the link inside the directory"
                    )
                if not os.path.exists(entry.path):
                    raise CheckpointError(
                        f"checkpoint directory {root!r}: {relative!r} is a symbolic link that dangles or "
                        "loops; remove it"
                    )
            if entry.is_dir():  # follows links to directories
                real = os.path.realpath(entry.path)
                if real in ancestors:
                    raise CheckpointError(
                        f"checkpoint directory {root!r}: {relative!r} links back to a directory that "
                        "contains it (a loop); remove the link"
                    )
                walk(entry.path, ancestors | {real})

    walk(root, frozenset({real_root}))


def _manifest(fs: pafs.FileSystem, root: str, *, checksums: bool = True) -> dict[str, dict[str, int]]:
    """Every file under ``root``: its size, and with ``checksums`` its CRC32 (which reads it)."""
    files = {}
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(root) :].lstrip("/").lstrip(os.sep)
        if relative == MANIFEST:
            continue
        entry = {"size": info.size}
        if checksums:
            with fs.open_input_stream(info.path) as stream:
                entry["crc32"], entry["size"] = _crc32(stream)
        files[relative.replace(os.sep, "/")] = entry
    return files


def _source_files(checkpoint: Any) -> dict[str, dict[str, int]]:
    """The manifest of a checkpoint about to be uploaded, computed from its source (so nothing is
    read back from storage); its links checked again, as the directory may have changed since
    ``from_directory``."""
    if isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        check_links(checkpoint.path)
    return _manifest(checkpoint.filesystem, checkpoint.path)


def _copy(checkpoint: Any, fs: pafs.FileSystem, target: str) -> None:
    _storage.copy_files(checkpoint.path, target, checkpoint.filesystem, fs)


def _publish(
    fs: pafs.FileSystem, checkpoints_dir: str, name: str, files: dict[str, dict[str, int]], fill: Callable[[str], None]
) -> str:
    """Put a checkpoint in storage under ``name``: ``fill(target)`` puts its files in, and the
    manifest of ``files`` is written last, so a torn upload can never look complete. A local disk
    renames directories atomically, so there it is filled under a staging name and renamed into
    place; object stores cannot, so there it goes straight to its final name, and the index write
    (done by the driver afterwards) is the only commit point. Returns the final path."""
    final = _join(fs, checkpoints_dir, name)
    local = isinstance(fs, pafs.LocalFileSystem)
    target = _join(fs, checkpoints_dir, f"{STAGING_PREFIX}{uuid.uuid4().hex}") if local else final
    if fs.get_file_info(final).type != pafs.FileType.NotFound:
        fs.delete_dir(final)  # debris of an upload whose commit never happened
    fs.create_dir(target, recursive=True)
    fill(target)
    with fs.open_output_stream(_join(fs, target, MANIFEST)) as out:
        out.write(json.dumps({"files": files}, sort_keys=True).encode())
    if local:
        fs.move(target, final)
    return final


def upload(checkpoint: Any, fs: pafs.FileSystem, checkpoints_dir: str, name: str) -> str:
    """Copy a local checkpoint into storage under ``name`` (see :func:`_publish`); the final path."""
    files = _source_files(checkpoint)
    return _publish(fs, checkpoints_dir, name, files, lambda target: _copy(checkpoint, fs, target))


def parts_name(attempt: int, round_: int) -> str:
    """The staging directory of the ranks' parts of one collective report (every rank agrees on it)."""
    return f"{STAGING_PREFIX}parts-a{attempt}-r{round_}"


def upload_part(
    checkpoint: Any, fs: pafs.FileSystem, checkpoints_dir: str, parts: str, rank: int
) -> tuple[str, dict[str, dict[str, int]]]:
    """Copy one rank's local checkpoint into ``<parts>/rank-<rank>/``; (that path, its manifest),
    which the driver merges with the other ranks' when it assembles the checkpoint (:func:`merge_parts`)."""
    target = _join(fs, checkpoints_dir, parts, f"rank-{rank}")
    if fs.get_file_info(target).type != pafs.FileType.NotFound:
        fs.delete_dir(target)  # what a dead predecessor of this rank left
    files = _source_files(checkpoint)
    fs.create_dir(target, recursive=True)
    _copy(checkpoint, fs, target)
    return target, files


def merge_parts(
    fs: pafs.FileSystem, checkpoints_dir: str, name: str, parts: list[tuple[int, str, dict[str, dict[str, int]]]]
) -> str:
    """Assemble one checkpoint ``name`` from the ranks' uploaded parts ((rank, path, manifest) each):
    every rank's files in one directory, as Ray Train merges them (see :func:`_publish`). A file
    that two ranks wrote with different contents is an error that names it (which rank's to keep
    is not raytf's to guess); the same file from several ranks is kept once. The files are moved,
    not copied: a rename on a local disk, a server-side copy on an object store. Returns the final path.
    """
    merged: dict[str, dict[str, int]] = {}
    source: dict[str, str] = {}
    owner: dict[str, int] = {}
    for rank, path, files in sorted(parts):
        for relative, info in files.items():
            if relative in merged and merged[relative] != info:
                raise CheckpointError(
                    f"ranks {owner[relative]} and {rank} both wrote {relative!r} into the checkpoint, with different "
                    "contents; every rank's files are merged into one directory, so give each rank's files "
                    "names of their own (e.g. with the rank in them), or pass the checkpoint from one rank"
                )
            if relative not in merged:
                merged[relative], owner[relative] = info, rank
                source[relative] = _join(fs, path, *relative.split("/"))

    def move_in(target: str) -> None:
        for relative, path in source.items():
            destination = _join(fs, target, *relative.split("/"))
            parent = (
                os.path.dirname(destination) if isinstance(fs, pafs.LocalFileSystem) else posixpath.dirname(destination)
            )
            fs.create_dir(parent, recursive=True)
            fs.move(path, destination)

    return _publish(fs, checkpoints_dir, name, merged, move_in)


def verify(fs: pafs.FileSystem, path: str, *, checksums: bool = True, copy: Optional[str] = None) -> Optional[str]:
    """Why the checkpoint at ``path`` is unusable, or None if every file matches its manifest.

    ``checksums=False`` compares sizes from one listing (missing or truncated
    files) without reading the data: enough to commit a fresh upload. Resuming
    reads everything and checks the CRC32s too. ``copy``: check the files of that
    local directory (a copy of the checkpoint, memory.py) against the manifest at ``path``.
    """
    try:
        with fs.open_input_stream(_join(fs, path, MANIFEST)) as stream:
            expected = json.loads(stream.read())["files"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"its manifest is missing or unreadable ({error})"
    found = (
        _manifest(fs, path, checksums=checksums)
        if copy is None
        else _manifest(pafs.LocalFileSystem(), copy, checksums=checksums)
    )
    for relative, want in expected.items():
        got = found.get(relative)
        if got is None:
            return f"file {relative!r} is missing"
        if got["size"] != want["size"]:
            return f"file {relative!r} has {got['size']} bytes, {want['size']} were written"
        if checksums and got["crc32"] != want["crc32"]:
            return f"file {relative!r} does not match its checksum"
    if copy is not None and set(found) - set(expected):
        return f"it has files the checkpoint has not: {sorted(set(found) - set(expected))[:3]}"
    return None


def checkpoints_dir(fs: pafs.FileSystem, run_root: str) -> str:
    return _join(fs, run_root, "checkpoints")


def checkpoint_name(seq: int) -> str:
    return f"checkpoint_{seq:06d}"


def seq_of_name(name: Any) -> Optional[int]:
    """The number in a checkpoint's name, or None for a name that is not one of raytf's."""
    match = _NAME.fullmatch(name) if isinstance(name, str) else None
    return int(match.group(1)) if match else None


def sweep_dead(root: str, prefix: str) -> None:
    """Remove each directory in ``root`` named ``<prefix><pid>-...`` whose process is gone: what a
    worker that was killed (raytf ends the workers it stops that way) left behind."""
    import shutil

    try:
        names = [n for n in os.listdir(root) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :].partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
