"""PyTorch adapter: a datapipe.Stream as an IterableDataset that torchdata's StatefulDataLoader resumes exactly.

    dataset = StreamDataset("out/demo", shuffle=True, seed=0)   # rank and world_size from torch.distributed
    loader = StatefulDataLoader(dataset, batch_size=8, num_workers=2, collate_fn=collate_packed)
    # or batches made by the loader (views of the shards, no per-sample Python; see datapipe.loader.batches):
    dataset = StreamDataset("out/demo", batch_size=8, num_workers=2)  # num_workers as the DataLoader's, for len()
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=2, collate_fn=packed_batch)
    ...  torch.save(loader.state_dict(), path)  ...  loader.load_state_dict(torch.load(path))

Each DataLoader worker reads a contiguous part of its rank's samples (Stream.for_worker);
StatefulDataLoader saves every worker's (epoch, position) with the batch it produced and
restores them before iterating, and its round-robin over workers is deterministic, so a
resumed loader yields exactly the batches that would have come next. The core loader
needs no torch; this module is the only one that imports it.
"""
from __future__ import annotations

import logging
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

from datapipe.loader.batches import collate
from datapipe.loader.positions import positions_of
from datapipe.loader.stream import Stream
from datapipe.shardformat import derive_position_ids

log = logging.getLogger(__name__)


class StreamDataset(IterableDataset):
    """One rank's samples; DataLoader workers split them; state_dict()/load_state_dict() per worker."""

    def __init__(self, source: str | Path | list[str | Path], rank: int | None = None,
                 world_size: int | None = None, num_workers: int = 0, **options: Any):
        rank, world_size = default_placement(rank, world_size)
        self.template = Stream(source, rank=rank, world_size=world_size, **options)
        self.current: Stream | None = None
        self.num_workers = max(1, num_workers)  # the DataLoader's (0: its main process): len() needs it with batch_size

    def stream(self) -> Stream:
        """This worker's Stream, made on first use inside the worker process."""
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        place = self.current.place if self.current is not None else None  # not len(): an empty share is falsy
        if place is None or (place.worker, place.num_workers) != (worker, num_workers):
            self.current = self.template.for_worker(worker, num_workers)
            if self.template.options.batch_size and num_workers != self.num_workers and worker == 0:
                log.warning("StreamDataset(num_workers=%d) under a DataLoader with %d workers: len() counts the "
                            "batches of %d; pass num_workers=%d", self.num_workers, num_workers, self.num_workers,
                            num_workers)
        return self.current

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.stream())

    def __len__(self) -> int:
        """Samples of this rank; with batch_size, batches: each worker cuts its own share into
        batches (its last one short), so the count depends on the DataLoader's num_workers."""
        workers = self.num_workers if self.template.options.batch_size else 1
        return sum(len(self.template.for_worker(worker, workers)) for worker in range(workers))

    def set_epoch(self, epoch: int) -> None:
        """Call at the start of each epoch, as with DistributedSampler: worker processes start from copies."""
        self.template.set_epoch(epoch)
        if self.current is not None:
            self.current.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.stream().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """In a worker process, a state saved after the worker's share ended resumes to nothing more
        of that epoch: torchdata asks every restored worker for a batch even when its share is done,
        and the loader moves on to the next epoch only as it finishes one (the main process, without
        workers, keeps the saved fetcher's end and asks nothing more)."""
        if get_worker_info() is not None and state.get("ended"):
            state = {**state, "ended": False}
        self.stream().load_state_dict(state)


def default_placement(rank: int | None, world_size: int | None) -> tuple[int, int]:
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if rank is None:
        rank = torch.distributed.get_rank() if distributed else 0
    if world_size is None:
        world_size = torch.distributed.get_world_size() if distributed else 1
    return rank, world_size


def collate_packed(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch of single samples (DataLoader(batch_size=B, collate_fn=collate_packed)) for varlen
    attention: see packed_batch."""
    return packed_batch(collate(samples))


def packed_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """A loader batch (StreamDataset(..., batch_size=B) under DataLoader(batch_size=None,
    collate_fn=packed_batch)) for varlen attention: its stacked arrays as tensors (tokens
    [B, seq_len] as int64, since torch has few uint32 ops; loss_mask...), position_ids restarting
    at every document, cu_seqlens (int32 document boundaries over the flattened batch), the keys."""
    check_packable(batch)
    out: dict[str, Any] = {"keys": batch["key"]}
    for name, value in batch.items():
        if isinstance(value, np.ndarray):
            out[name] = torch.from_numpy(value.astype(np.int64) if value.dtype == np.uint32 else value)
    seq_len = batch["tokens"].shape[1]
    if "position_ids" not in out:  # a loader with position_ids=False: int32, as the loader's own
        out["position_ids"] = torch.from_numpy(row_positions(batch["doc_lens"], seq_len))
    lengths = [documents_and_padding(lens, seq_len) for lens in batch["doc_lens"]]
    flat = np.concatenate([[0], np.cumsum([n for row in lengths for n in row])])
    out["cu_seqlens"] = torch.from_numpy(flat.astype(np.int32))
    return out


def check_packable(batch: dict[str, Any]) -> None:
    if not isinstance(batch.get("tokens"), np.ndarray) or batch["tokens"].ndim != 2:
        raise ValueError("packed_batch needs samples of one length (tokens stacked into [B, seq_len]); these differ "
                         "(two curriculum phases in one DataLoader batch?): use StreamDataset(..., batch_size=B) "
                         "under DataLoader(batch_size=None), whose batches never mix phases")
    if "doc_lens" not in batch:
        raise ValueError("packed_batch needs doc_lens for position_ids and cu_seqlens: add 'doc_lens' to the "
                         "loader's fields=")


def row_positions(doc_lens: list, seq_len: int) -> np.ndarray:
    """The rows' position ids as the loader derives a span's (positions_of); rows that do not tile
    (a row without pieces) one at a time."""
    lens = [np.asarray(row) for row in doc_lens]
    positions = positions_of(np.concatenate(lens), np.array([len(row) for row in lens]), seq_len)
    return np.stack([derive_position_ids(row, seq_len) for row in lens]) if positions is None else positions


def documents_and_padding(doc_lens: np.ndarray, seq_len: int) -> list[int]:
    """The pieces of a row: its documents, then its padding (the rest of seq_len) as one more."""
    lengths = [int(n) for n in doc_lens]
    padding = seq_len - sum(lengths)
    return lengths + [padding] if padding else lengths
