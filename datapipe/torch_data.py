"""PyTorch adapter: a datapipe.Stream as an IterableDataset that torchdata's StatefulDataLoader resumes exactly.

    dataset = StreamDataset("out/demo", shuffle=True, seed=0)   # rank and world_size from torch.distributed
    loader = StatefulDataLoader(dataset, batch_size=8, num_workers=2, collate_fn=collate_packed)
    ...  torch.save(loader.state_dict(), path)  ...  loader.load_state_dict(torch.load(path))

Each DataLoader worker reads a contiguous part of its rank's samples (Stream.for_worker);
StatefulDataLoader saves every worker's (epoch, position) with the batch it produced and
restores them before iterating, and its round-robin over workers is deterministic, so a
resumed loader yields exactly the batches that would have come next. The core loader
needs no torch; this module is the only one that imports it.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as err:  # pragma: no cover - depends on the install
    raise ImportError("datapipe.torch_data needs torch: pip install 'datapipe[torch]' "
                      "(or pip install torch==2.13.0 for the CPU build)") from err

from datapipe.shards import int32_range
from datapipe.stream import Stream


class StreamDataset(IterableDataset):
    """One rank's samples; DataLoader workers split them; state_dict()/load_state_dict() per worker."""

    def __init__(self, source: str | Path | list[str | Path], rank: int | None = None,
                 world_size: int | None = None, **options: Any):
        rank, world_size = default_placement(rank, world_size)
        self.template = Stream(source, rank=rank, world_size=world_size, **options)
        self.current: Stream | None = None

    def stream(self) -> Stream:
        """This worker's Stream, made on first use inside the worker process."""
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        place = self.current.place if self.current else None
        if place is None or (place.worker, place.num_workers) != (worker, num_workers):
            self.current = self.template.for_worker(worker, num_workers)
        return self.current

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.stream())

    def __len__(self) -> int:
        return len(self.template)

    def set_epoch(self, epoch: int) -> None:
        """Call at the start of each epoch, as with DistributedSampler: worker processes start from copies."""
        self.template.set_epoch(epoch)
        if self.current is not None:
            self.current.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.stream().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream().load_state_dict(state)


def default_placement(rank: int | None, world_size: int | None) -> tuple[int, int]:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else 0
    if world_size is None:
        world_size = torch.distributed.get_world_size() if distributed else 1
    return rank, world_size


def collate_packed(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch for varlen attention: every array member of one shape across the batch stacked (tokens
    [B, seq_len] as int64, since torch has few uint32 ops; loss_mask...), position_ids restarting
    at every document, cu_seqlens (int32 document boundaries over the flattened batch), the keys."""
    batch: dict[str, Any] = {"keys": [s["key"] for s in samples]}
    for name, value in samples[0].items():
        if isinstance(value, np.ndarray) and name != "doc_lens" and all(s[name].shape == value.shape for s in samples):
            stacked = np.stack([s[name] for s in samples])
            batch[name] = torch.from_numpy(stacked.astype(np.int64) if stacked.dtype == np.uint32 else stacked)
    lengths = [documents_and_padding(s) for s in samples]
    if "position_ids" not in batch:  # a loader with position_ids=False: int32, as the loader's own
        positions = np.concatenate([int32_range(n) for row in lengths for n in row])
        batch["position_ids"] = torch.from_numpy(positions.reshape(len(samples), -1))
    flat = np.concatenate([[0], np.cumsum([n for row in lengths for n in row])])
    batch["cu_seqlens"] = torch.from_numpy(flat.astype(np.int32))
    return batch


def documents_and_padding(sample: dict[str, Any]) -> list[int]:
    lengths = [int(n) for n in sample["doc_lens"]]
    return lengths + [int(sample["num_pad"])] if sample["num_pad"] else lengths
