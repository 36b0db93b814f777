"""DCP's reader for a checkpoint in a bucket: each rank fetches only the byte ranges of the
items it loads (one ranged GET per item), and the metadata, so a cold start on N ranks reads
the checkpoint about once in all rather than N times, and nothing is staged on disk.

Why by hand: DCP's own readers read a local folder (FileSystemReader) or go through fsspec
(FsspecReader, which for S3 needs s3fs and aiobotocore, whose pins of botocore fight
boto3's). This one is FileSystemReader with its two file operations replaced: a data file
is never opened whole (`_slice_file` asks the store for the item's range), and the metadata
file is read whole.

    reader = BucketReader(store, "step_000000100")
    dcp.load(state, storage_reader=reader)
    reader.bytes_read                      # what this rank fetched
"""

from __future__ import annotations

import io
import os
from collections.abc import Generator
from contextlib import contextmanager
from typing import IO, Any

from torch.distributed.checkpoint.filesystem import FileSystemBase, FileSystemReader

from raytrain.cloud.object_store import Store


class _Object(io.RawIOBase):
    """A key of the store, read whole only if read (the metadata); a data file's items are
    fetched by range (BucketReader._slice_file)."""

    def __init__(self, files: _BucketFiles, key: str) -> None:
        super().__init__()
        self.files, self.key = files, key
        self._whole: io.BytesIO | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._whole is None:
            data = self.files.store.get_bytes(self.key)
            if data is None:
                raise FileNotFoundError(f"{self.files.store}/{self.key}")
            self.files.bytes_read += len(data)
            self._whole = io.BytesIO(data)
        return self._whole.readinto(buffer)


class _BucketFiles(FileSystemBase):
    """The file operations DCP's reader uses, on a store's keys."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.bytes_read = 0

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str
                      ) -> Generator[io.IOBase, None, None]:
        if mode != "rb":
            raise ValueError(f"a checkpoint in a bucket is read here, not written ({mode})")
        yield io.BufferedReader(_Object(self, str(path)))

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return f"{path}/{suffix}"

    def init_path(self, path: str | os.PathLike[str]) -> str:
        return str(path)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.store.get_bytes(str(path)) is not None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        raise NotImplementedError("read only")

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        raise NotImplementedError("read only")

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        raise NotImplementedError("read only")


class BucketReader(FileSystemReader):
    """Read checkpoint `name` (its key prefix in `store`), each item by its range."""

    def __init__(self, store: Store, name: str) -> None:
        super().__init__(name)
        self.files = _BucketFiles(store)
        self.fs = self.files  # type: ignore[assignment]
        self.path = name

    @property
    def bytes_read(self) -> int:
        return self.files.bytes_read

    def _slice_file(self, file: Any, sinfo: Any) -> IO[bytes]:
        key = file.raw.key  # the stream create_stream opened: nothing read from it
        data = self.files.store.get_range(key, sinfo.offset, sinfo.length)
        self.files.bytes_read += len(data)
        return io.BytesIO(data)
