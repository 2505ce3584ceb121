"""A directory as a service: the whole client contract in one module.

1. ``load_options(conn_id)`` turns an Airflow connection into frozen, hashable options that
   hold no secret a ``repr`` could print; their ``lease_key`` names the shared client they open.
   Only the trigger's kwargs carry the ``conn_id``.
2. ``open_reader(options)`` builds the shared client off the loop; ``close_reader`` closes it.
   Every trigger on the same key shares one:
   ``self.lease(options.lease_key, lambda: open_reader(options), close_reader)``.
3. ``classify_files_error(exc)`` maps the library's exceptions to the error vocabulary, once;
   no trigger imports a library exception type. ``None``: not the library's, the caller's
   default applies.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

from airflow_deferrable_kit.connections import get_connection
from airflow_deferrable_kit.errors import ErrorType, FatalError, TransientError, WaitError


@dataclass(frozen=True)
class FilesOptions:
    """What the connection says: the directory (``host``) and a token (``password``) kept out of ``repr``."""

    root: str
    token: str = field(default="", repr=False)

    @property
    def lease_key(self) -> tuple[str, str]:
        """The shared reader's key: one per directory in the process."""
        return ("files-reader", self.root)


async def load_options(conn_id: str) -> FilesOptions:
    conn = await get_connection(conn_id, argument="files_conn_id", conn_types=("fs",))
    if not conn.host:
        raise FatalError(f"files_conn_id={conn_id!r} names no directory (host)", error_type=ErrorType.BAD_CONNECTION)
    return FilesOptions(root=conn.host, token=conn.password or "")


class Reader:
    """The shared client: answers "which names are in this folder" off the loop."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.closed = False

    async def names(self, folder: str) -> set[str]:
        return set(await asyncio.to_thread(os.listdir, self.root / folder))


async def open_reader(options: FilesOptions) -> Reader:
    root = Path(options.root)
    if not await asyncio.to_thread(root.is_dir):
        raise FatalError(f"{options.root!r} is not a directory", error_type=ErrorType.NOT_FOUND)
    return Reader(root)


async def close_reader(reader: Reader) -> None:
    reader.closed = True


def classify_files_error(exc: BaseException) -> WaitError | None:
    if isinstance(exc, FileNotFoundError):
        return FatalError(f"no such folder: {exc.filename}", error_type=ErrorType.NOT_FOUND)
    if isinstance(exc, PermissionError):
        return FatalError(f"not allowed to read {exc.filename}", error_type=ErrorType.AUTHORIZATION)
    if isinstance(exc, OSError):
        return TransientError(f"the file system failed: {exc}", error_type=ErrorType.UNAVAILABLE)
    return None
