"""A Hugging Face model folder in a bucket (`model.hf.path: s3://BUCKET/PREFIX`), read by
DCP with each rank fetching only the rows of each tensor it holds: a safetensors file's
header (its first 8 bytes say how long) gives each tensor's byte range, and a slice of rows
is one ranged GET. A slice along another dimension (a tensor-parallel row-wise weight) is
fetched as the whole rows it spans and cut here, so such a tensor is read whole by each of
its ranks.

Why by hand: DCP's HuggingFaceStorageReader opens local files with safetensors' safe_open
(memory-mapped); the fsspec route to S3 needs s3fs and aiobotocore, whose pins of botocore
fight boto3's (raytrain.train.bucket_reader says the same of DCP's own checkpoints).

    reader = BucketHFReader(open_store("s3://models/llama"))
    dcp.load(state, storage_reader=reader); reader.bytes_read
    headers(store)   # {file: {tensor: (dtype, shape, start, end)}}, for the shape check
"""

from __future__ import annotations

import json
import struct

import torch
from torch.distributed.checkpoint import HuggingFaceStorageReader
from torch.distributed.checkpoint._hf_utils import _HFStorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from raytrain.cloud.object_store import Store
from raytrain.errors import FieldError, SpecError

# safetensors' dtype names (its format's list), as torch holds them.
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
          "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
          "I8": torch.int8, "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16,
          "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
          "F8_E5M2": torch.float8_e5m2}
Header = dict[str, tuple[torch.dtype, list[int], int, int]]  # tensor: (dtype, shape, bytes)


def header(store: Store, key: str) -> Header:
    """A safetensors file's tensors: dtype, shape and absolute byte range (two ranged
    GETs: the header's length, then the header)."""
    size = struct.unpack("<Q", store.get_range(key, 0, 8))[0]
    document = json.loads(store.get_range(key, 8, size))
    found: Header = {}
    for name, info in document.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if info["dtype"] not in DTYPES:
            raise SpecError([FieldError(("model", "hf", "path"), (
                f"{key}'s tensor {name} is {info['dtype']}, which torch does not read. To "
                "fix: save the folder in a dtype torch reads (bfloat16 or float32)"))])
        found[name] = (DTYPES[info["dtype"]], list(info["shape"]), 8 + size + start,
                       8 + size + end)
    return found


def headers(store: Store) -> dict[str, Header]:
    """The header of every safetensors file of the folder's weights (weight_files), by
    key."""
    names = [key for key in store.keys("") if "/" not in key]
    return {key: header(store, key)
            for key in weight_files(names, store.get_bytes(INDEX), "the folder")}


INDEX = "model.safetensors.index.json"


def weight_files(names: list[str], index: bytes | None, where: str) -> list[str]:
    """Which of a folder's files (`names`) hold its weights: those its index
    (model.safetensors.index.json's weight_map) lists when it has one, as transformers
    reads it (a stale shard beside them is not the model's), else every .safetensors.
    SpecError naming model.hf.path for an index that lists a file the folder lacks."""
    if index is None:
        return sorted(name for name in names if name.endswith(".safetensors"))
    try:
        listed = sorted(set(json.loads(index)["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SpecError([FieldError(("model", "hf", "path"), (
            f"{where}'s {INDEX} is not an index of its weights ({exc!r}). To fix: write it "
            "again with save_pretrained, or remove it"))]) from None
    missing = [name for name in listed if name not in names]
    if missing:
        raise SpecError([FieldError(("model", "hf", "path"), (
            f"{where}'s {INDEX} lists {', '.join(missing)}, which it lacks. To fix: copy "
            "the whole folder save_pretrained wrote"))])
    return listed


class BucketHFReader(HuggingFaceStorageReader):
    """HuggingFaceStorageReader over a store's keys (module doc)."""

    def __init__(self, store: Store) -> None:
        super().__init__(path=".")
        self.store = store
        self.bytes_read = 0
        self._headers: dict[str, Header] = {}

    def read_metadata(self) -> Metadata:
        self._headers = headers(self.store)
        self.bytes_read += sum(min((t[2] for t in tensors.values()), default=0)
                               for tensors in self._headers.values())  # each file's header
        state: dict[str, TensorStorageMetadata] = {}
        storage: dict[MetadataIndex, _HFStorageInfo] = {}
        for key, tensors in self._headers.items():
            for name, (dtype, shape, _, _) in tensors.items():
                size = torch.Size(shape)
                state[name] = TensorStorageMetadata(
                    properties=TensorProperties(dtype=dtype), size=size,
                    chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)),
                                                 sizes=size)])
                storage[MetadataIndex(fqn=name, offset=[0] * len(shape))] = _HFStorageInfo(
                    relative_path=key, shape=size, dtype=dtype)
        metadata = Metadata(state_dict_metadata=state,  # type: ignore[arg-type]
                            storage_data=storage)
        metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for item in plan.items:
            planner.commit_tensor(item, self._read(item, planner))
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read(self, item: ReadItem, planner: LoadPlanner) -> torch.Tensor:
        """The item's slice: the rows it spans, one ranged GET, cut along the other
        dimensions here; copied into the planner's tensor."""
        info: _HFStorageInfo = self.storage_data[item.storage_index]
        dtype, shape, start, _ = self._headers[info.relative_path][item.storage_index.fqn]
        offsets, lengths = list(item.storage_offsets), list(item.lengths)
        if not shape:  # a scalar
            rows, first, count = 1, 0, 1
        else:
            rows = 1
            for extent in shape[1:]:
                rows *= extent  # elements a row (of dimension 0) holds
            first, count = offsets[0], lengths[0]
        width = torch.tensor([], dtype=dtype).element_size()
        data = self.store.get_range(info.relative_path, start + first * rows * width,
                                    count * rows * width)
        self.bytes_read += len(data)
        tensor = torch.frombuffer(bytearray(data), dtype=dtype).reshape(
            [count, *shape[1:]] if shape else [])
        if shape:
            tensor = tensor[(slice(None),) + tuple(
                slice(o, o + n) for o, n in zip(offsets[1:], lengths[1:]))]
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise AssertionError(f"{item.storage_index}: {tuple(target.size())} wanted, "
                                 f"{tuple(tensor.size())} read")
        target.copy_(tensor)
        return target

