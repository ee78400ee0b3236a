"""Where a run keeps its files: a local directory or any ``pyarrow.fs`` URI."""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from typing import Any, Optional

import pyarrow.fs as pafs

from raytf.errors import ConfigError


def resolve_storage(
    storage_path: str | os.PathLike, filesystem: Optional[pafs.FileSystem] = None
) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, root path on it, root as the user should see it)."""
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
            f"RunConfig.storage_path={text!r} is not a URI pyarrow.fs can open: {error}"
        ) from None
    return filesystem, root.rstrip("/"), text.rstrip("/")


class RunStorage:
    """The directory of one run, ``<storage_path>/<name>``."""

    def __init__(self, storage_path: str | os.PathLike, name: str, filesystem: Optional[pafs.FileSystem] = None):
        self.filesystem, root, shown_root = resolve_storage(storage_path, filesystem)
        local = isinstance(self.filesystem, pafs.LocalFileSystem)
        self.root = os.path.join(root, name) if local else posixpath.join(root, name)
        base, _, query = shown_root.partition("?")  # s3://b/p?endpoint_override=... keeps its query last
        self.uri = f"{base.rstrip('/')}/{name}" + (f"?{query}" if query else "")
        self.filesystem.create_dir(self.root, recursive=True)

    def write_json(self, relpath: str, value: Any) -> None:
        """Replace ``relpath`` with ``value`` as JSON, so a reader never sees half a file.

        A local write goes to a temporary name and is renamed into place; an
        object store writes a whole object at once.
        """
        path = f"{self.root}/{relpath}"
        data = json.dumps(value, indent=1, sort_keys=True).encode()
        if isinstance(self.filesystem, pafs.LocalFileSystem):
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            with self.filesystem.open_output_stream(tmp) as out:
                out.write(data)
            self.filesystem.move(tmp, path)
        else:
            with self.filesystem.open_output_stream(path) as out:
                out.write(data)

    def read_json(self, relpath: str) -> Any:
        with self.filesystem.open_input_stream(f"{self.root}/{relpath}") as stream:
            return json.loads(stream.read())
