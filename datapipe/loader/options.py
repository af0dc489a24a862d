"""The loader's options (StreamOptions), checked once where a Stream is made.

Every option has a default that suits a trainer reading local or remote shards; the
shuffle window's default is sized in bytes (64 MiB of the largest samples: ~2K samples at
8K tokens, 255 at 64K), since a window is held in memory whole. A renamed option is
refused with its new name (StreamOptions(buffer=...) is now shuffle_window=...).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from datapipe.loader.schedule import Phase, Placement

ON_ERROR = ("raise", "skip")
WINDOW_BYTES = 64 << 20  # the default shuffle window's memory: a trainer host has it to spare per rank
RENAMED = {"buffer": "shuffle_window"}  # options renamed: the old name is refused with the new one


@dataclass(frozen=True)
class StreamOptions:
    shuffle: bool = False  # permute shard order and shuffle within windows, from (seed, epoch)
    seed: int = 0  # the same seed, epoch and placement give the same order on every machine
    shuffle_window: int | None = None  # samples a window; None: what fits in 64 MiB (~2K at 8K tokens, 255 at 64K)
    loop: bool = False  # False: one iter() is one epoch; True: epochs follow each other forever
    verify: bool = False  # check each shard's sha256 (about 1.5 GB/s of one core, in the prefetch threads)
    check_samples: bool = True  # check each sample's bytes against its xxh3 digest in the index (prefetch threads)
    on_error: str = "raise"  # "raise": a bad shard stops with its name; "skip": leave it out and log it
    cache_dir: str | None = None  # keep downloaded shards here; None: remote shards stay in memory only
    prefetch: int = 2  # shards read ahead of the one being decoded (shuffled: plus a window), in threads
    position_ids: bool = True  # derive position_ids from doc_lens as read_shard does (1/3 of the loop at 8K, 1/2 at 64K)
    mmap: bool = True  # map local shards the page cache holds whole (no copy); False: read them (see fetch.map_cached)
    batch_size: int | None = None  # yield batches of this many samples (datapipe.loader.batches); None: samples one by one
    drop_last: bool = False  # with batch_size: leave out an epoch's last batch when it is short
    fields: tuple[str, ...] | None = None  # decode only these members (see member_field); None: all of them


def make_options(options: dict[str, Any]) -> StreamOptions:
    """StreamOptions from keyword arguments; a renamed option says its new name."""
    for old, new in RENAMED.items():
        if old in options:
            raise TypeError(f"stream option {old}= is now {new}= (the same number: samples a shuffle window holds)")
    return StreamOptions(**options)


def default_window(options: StreamOptions, phases: list[Phase]) -> StreamOptions:
    """Fill in the default shuffle window: WINDOW_BYTES of the largest samples, 16 to 8192 of them."""
    if options.shuffle_window is not None:
        return options
    sample_bytes = max(sum(s["bytes"] for s in phase.shards) / max(1, phase.samples) for phase in phases)
    return replace(options, shuffle_window=int(min(8192, max(16, WINDOW_BYTES // max(1, sample_bytes)))))


def check_options(options: StreamOptions, place: Placement, phases: list[Phase]) -> None:
    """Refuse options that cannot work for this placement and data, saying what to pass instead."""
    if not 0 <= place.rank < place.world_size:
        raise ValueError(f"rank {place.rank} is outside world_size {place.world_size}")
    if not 0 <= place.worker < place.num_workers:
        raise ValueError(f"worker {place.worker} is outside num_workers {place.num_workers}")
    if options.shuffle_window < 1:
        raise ValueError(f"shuffle_window {options.shuffle_window}: a shuffle window holds at least 1 sample")
    if options.on_error not in ON_ERROR:
        raise ValueError(f"on_error {options.on_error!r}; allowed: {', '.join(ON_ERROR)}")
    if options.batch_size is not None and options.batch_size < 1:
        raise ValueError(f"batch_size {options.batch_size}: a batch holds at least 1 sample (None: no batches)")
    if isinstance(options.fields, str):
        raise ValueError(f"fields={options.fields!r}: give a tuple of names, e.g. fields=('tokens', 'loss_mask')")
    if options.verify and (unsigned := [p.name for p in phases if any("sha256" not in x for x in p.shards)]):
        raise ValueError(f"verify=True, but the manifest of phase(s) {', '.join(unsigned)} gives no sha256 for some "
                         "shards (written by another tool?): rewrite them with datapipe, or read with verify=False")
    if options.fields is not None and options.position_ids and not {"tokens", "doc_lens"} <= set(options.fields):
        raise ValueError(f"position_ids come from doc_lens and tokens, which fields={options.fields!r} leaves out: "
                         "add them, or pass position_ids=False")
