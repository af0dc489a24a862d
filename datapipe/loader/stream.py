"""Stream packed samples to a trainer: `for sample in datapipe.stream("out/demo", rank=r, world_size=n)`.

The loader reads a phase folder (manifest.json) or a run folder (run.json: the
curriculum's phases in order, each until its token budget), from a local path or any
fsspec URL. What a (rank, worker) reads, and in what order, is index arithmetic over
the manifests (datapipe.loader.schedule): equal sample counts on every rank, shard order and a
window shuffle from (seed, epoch). So the state is two integers, (epoch, position), and
whether that epoch has ended (its position then stays at the end: "epoch 1 done" is not "epoch
2 not begun"): `load_state_dict` then `iter` reads one shuffle window and skips into it, and the
samples that follow are exactly those an uninterrupted run would have yielded next.

Shards are mapped or read whole (or downloaded into an optional cache) `prefetch` ahead
by a thread pool, checked against the manifest's size and, with verify=True, its sha256.
The same threads read each shard's index (datapipe.packing.writer writes one beside each shard;
a shard without one is located by a walk over its tar headers), locate the span's members
(datapipe.loader.decode.locate_span: numpy only) and derive its position ids
(datapipe.loader.positions.span_positions), so the thread that iterates only builds the sample
dicts (about 3 us a sample at 8K tokens) and makes the position ids a chunk at a time as
they go out: per sample, 0.36-0.40 of `cat`'s pace at 8K and 0.5 at 64K with position ids,
0.55-0.75 and ~1.0 without, in fresh processes on our 2-core box (bench/stream.py). The
samples are those of the plain reference decoder (datapipe.loader.reference), which the
tests hold every path equal to.

One pipeline for every mode: the spans' samples become Rows, the samples of consecutive
epoch positions (a span in order, or a shuffle window in its permuted order), which go out
one by one or, with batch_size, in batches of consecutive rows (datapipe.loader.batches); in
order, a span of text samples comes as columns (each array one strided view of the shard)
that batches only slice, no Python per sample. A bad shard raises ShardError naming it; with
on_error="skip" its samples are left out instead, logged, and listed in `.skipped` (that rank
then yields fewer samples); a member that does not decode fails its sample alone.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from itertools import chain, islice
from pathlib import Path
from typing import Any, NamedTuple

from datapipe.loader import fetch
from datapipe.loader.batches import Rows, batch_count, batched, span_rows
from datapipe.loader.decode import BadSample, SpanLayout, decode_samples, locate_span
from datapipe.loader.options import StreamOptions, check_options, default_window, make_options
from datapipe.loader.positions import SpanPositions, finish_samples, span_positions
from datapipe.loader.schedule import (
    Phase,
    Placement,
    Span,
    epoch_schedule,
    phase_ends,
    spans_from,
    window_order,
    windows,
)
from datapipe.loader.shardindex import ShardError, ShardIndex, damaged_samples, parse_index, walk_index
from datapipe.schema import PackedSample
from datapipe.shardformat import MANIFEST, RUN_MANIFEST, member_field, phase_name, run_phases

log = logging.getLogger(__name__)


class LoadedSpan(NamedTuple):
    """What a prefetch thread hands the main thread for one span."""

    buffer: Any  # the shard's bytes
    index: ShardIndex
    layout: SpanLayout  # where the span's members lie, located and typed
    positions: SpanPositions | None  # the span's position ids, made when sliced; None: finish_samples derives them
    rows: Rows | None  # with batch_size, unshuffled: the span as columns (batches.span_rows), or None: decode it
    damaged: list[int]  # the span's samples whose bytes fail their digest (shardindex.damaged_samples)


class Stream:
    """An iterable over the samples of one (rank, worker), resumable with state_dict()."""

    def __init__(self, source: str | Path | list[str | Path], rank: int = 0, world_size: int = 1,
                 worker: int = 0, num_workers: int = 1, **options: Any):
        self.place = Placement(rank, world_size, worker, num_workers)
        self.phases = load_phases(source)
        if not self.phases:
            raise ValueError("no phase to read: give a run folder, a phase folder, or a non-empty list of them")
        self.options = default_window(make_options(options), self.phases)
        self.fingerprint = data_fingerprint(self.phases)  # in every state_dict (torchdata takes one a batch)
        check_options(self.options, self.place, self.phases)
        self.epoch, self.position = 0, 0
        self.ended = False  # this object iterated `epoch` to its end: the next iter() starts the next epoch
        self.skipped: list[str] = []  # shards left out under on_error="skip", in the order met
        self.shard_pool: fetch.BufferPool | None = None  # memory for shards read (not mapped), made on the first iter()
        self.position_pool: fetch.BufferPool | None = None  # and for the position ids

    def for_worker(self, worker: int, num_workers: int) -> Stream:
        """The same loader for one DataLoader worker: a contiguous part of this rank's samples."""
        other = copy.copy(self)
        other.place = Placement(self.place.rank, self.place.world_size, worker, num_workers)
        check_options(other.options, other.place, other.phases)
        other.skipped, other.shard_pool, other.position_pool = [], None, None
        return other

    def __getstate__(self) -> dict[str, Any]:
        """A pickled loader (a DataLoader worker's copy) starts with no pools: they are not shareable."""
        return {**self.__dict__, "shard_pool": None, "position_pool": None}

    def __iter__(self) -> Iterator[PackedSample]:
        yield from self.iterate_epoch()
        while self.options.loop:
            if not (yield from counted(self.iterate_epoch())):  # else it would spin through empty epochs forever
                log.warning("loop=True: a whole epoch yielded no sample (an empty share of the data for this rank "
                            "and worker, or every shard skipped); stopping")
                return

    def __len__(self) -> int:
        """Samples (with batch_size: batches, cut at each phase's end) this (rank, worker) yields per
        epoch, before any skipped shard."""
        ends = phase_ends(epoch_schedule(self.phases, self.place, self.options.seed, 0, False))
        if self.options.batch_size is None:
            return ends[-1] if ends else 0  # a budget worth fewer samples than ranks: none
        return sum(batch_count(end - start, self.options.batch_size, self.options.drop_last)
                   for start, end in zip([0, *ends], ends))

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning, unless the loader is already inside it (after a resume,
        even one saved at its very end: then that epoch yields nothing more)."""
        if epoch != self.epoch or self.ended:
            self.epoch, self.position, self.ended = epoch, 0, False

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "ended": self.ended, **self.identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume where `state` was saved. A state saved before shuffle_window was named so holds
        the same number under "buffer"."""
        if "shuffle_window" not in state and "buffer" in state:
            state = {**state, "shuffle_window": state["buffer"]}
        for key, value in self.identity().items():
            if state.get(key) != value:
                raise ValueError(f"cannot resume: the state was saved with {key}={state.get(key)!r}, this loader has "
                                 f"{key}={value!r}; resume with the same data, seed, shuffle, shuffle_window, ranks, "
                                 "workers")
        self.epoch, self.position, self.ended = state["epoch"], state["position"], state.get("ended", False)

    def identity(self) -> dict[str, Any]:
        """What must not change across a resume for the order to be the same."""
        options = self.options
        return {**asdict(self.place), "seed": options.seed, "shuffle": options.shuffle,
                "shuffle_window": options.shuffle_window, "data": self.fingerprint}

    def iterate_epoch(self) -> Iterator[PackedSample]:
        """The rest of the current epoch. Once it is done the position stays at its end and `ended`
        says so, so that a state saved then tells "epoch e done" from "epoch e+1 not begun" (the
        torch adapter needs the first: torchdata/StreamDataset.load_state_dict)."""
        if self.ended:
            self.epoch, self.position, self.ended = self.epoch + 1, 0, False
        options = self.options
        segments = epoch_schedule(self.phases, self.place, options.seed, self.epoch, options.shuffle)
        todo = [w for w in windows(segments, self.place, options.seed, self.epoch, options.shuffle_window)
                if w[0] + w[1] > self.position]
        if todo:
            first = todo[0][0] if options.shuffle else self.position
            if options.on_error == "raise":
                self.check_present(spans_from(segments, first))
            spans = self.read_spans(spans_from(segments, first))
            rows = self.shuffled(todo, spans) if options.shuffle else self.in_order(spans)
            try:
                if options.batch_size is None:
                    yield from self.one_by_one(rows)
                else:
                    yield from self.in_batches(rows, phase_ends(segments))
            finally:
                spans.close()
        ends = phase_ends(segments)
        self.position, self.ended = max(self.position, ends[-1] if ends else 0), True

    def in_order(self, spans: Iterator[Rows | list]) -> Iterator[Rows]:
        """The spans' rows in schedule order: as the prefetch threads made them, or decoded here."""
        for item in spans:
            if item.__class__ is Rows:
                yield item
            else:
                yield from self.rows_of(item)

    def shuffled(self, todo: list, spans: Iterator[list]) -> Iterator[Rows]:
        """Each window's samples in its permuted order (the first from the current position on)."""
        slots, skip = chain.from_iterable(spans), self.position - todo[0][0]
        for _, size, key in todo:
            window = list(islice(slots, size))
            permuted = [window[index] for index in window_order(size, key, True)[skip:]]
            window, skip = None, 0  # the next window is read while this one goes out: hold it once only
            yield from self.rows_of(permuted)

    def rows_of(self, samples: list) -> Iterator[Rows]:
        """Consecutive positions' samples (a dict, a BadSample, or None where a skipped shard was) as
        rows. A bad sample is left out, or under on_error="raise" raised after the rows before
        it, so that the samples (and the batches they complete) before it come out first."""
        if all(sample.__class__ is dict for sample in samples):
            yield Rows(samples, None, len(samples))
            return
        slots = []
        for slot, sample in enumerate(samples):
            if sample.__class__ is dict:
                slots.append(slot)
            elif sample is not None:
                if self.options.on_error == "raise":
                    yield Rows([samples[s] for s in slots], slots, slot)
                self.bad_sample(sample)
        yield Rows([samples[slot] for slot in slots], slots, len(samples))

    def one_by_one(self, rows: Iterator[Rows]) -> Iterator[PackedSample]:
        """The rows' samples; while one is out, the position is the one after it. Each leaves its
        list as it goes out, so that its memory (shard, position ids) frees once the consumer
        lets it go, not when the span or window is done."""
        for part in rows:
            start, samples = self.position, part.columns
            after = range(start + 1, start + 1 + len(samples)) if part.slots is None else \
                [start + slot + 1 for slot in part.slots]
            for number, position in enumerate(after):
                sample, samples[number] = samples[number], None
                self.position = position
                yield sample
            self.position = start + part.size

    def in_batches(self, rows: Iterator[Rows], ends: list[int]) -> Iterator[dict[str, Any]]:
        """Batches of consecutive rows, never two phases in one (they end at `ends`); while a batch is
        out, the position is the one after its last sample."""
        options = self.options
        for batch, position in batched(rows, options.batch_size, options.drop_last, self.position, ends):
            self.position = position
            yield batch

    def bad_sample(self, sample: BadSample) -> None:
        """A sample with a member that does not decode: raised, or under on_error="skip" left out."""
        if self.options.on_error == "raise":
            raise sample.error
        log.warning("skipping a sample: %s", sample.error)
        self.skipped.append(sample.shard)

    def read_spans(self, spans: Iterator[Span]) -> Iterator[list]:
        """Each span's samples in schedule order: a list per span (or per part of one), one item per
        position (a dict, a BadSample, or None where a skipped shard was), or with batch_size
        unshuffled the span's Rows when the prefetch thread could make them. A span is decoded
        when its turn comes.

        Reads, downloads and sha256 run `prefetch` shards ahead in threads (all three release
        the GIL), so the next shard arrives while this one is decoded; prefetch=0 reads inline.
        Shuffled, they run a window further ahead: a window is decoded whole before its first
        sample goes out, and the next one's shards are read while this one is handed out."""
        pool = ThreadPoolExecutor(max_workers=max(1, self.options.prefetch), thread_name_prefix="datapipe-fetch")
        submit = pool.submit if self.options.prefetch else run_now
        window = shards_per_window(self.phases, self.options)
        ahead = self.options.prefetch + window if self.options.prefetch else 0
        if self.shard_pool is None:  # kept for the next epochs: fresh memory costs the kernel a zero-fill
            self.shard_pool = fetch.BufferPool(keep=ahead + 2 + window)
            self.position_pool = fetch.BufferPool(keep=ahead + 2 + window)
        pending: deque = deque()
        try:
            for span in spans:
                pending.append((span, submit(self.load, span, self.shard_pool)))
                if len(pending) > ahead:
                    yield from self.span_samples(*pending.popleft())
            while pending:
                yield from self.span_samples(*pending.popleft())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def check_present(self, spans: Iterator[Span]) -> None:
        """Every local shard the rest of the epoch reads exists (a stat each), so a deleted shard
        stops the run at the epoch's start, not after the samples before it went into training.
        A remote shard found missing fails when it is downloaded."""
        shards = dict.fromkeys((span.phase, span.shard) for span in spans)
        locations = [fetch.join(self.phases[p].location, self.phases[p].shards[s]["name"]) for p, s in shards]
        missing = [where for where in locations if not fetch.is_url(where) and not fetch.local_path(where).is_file()]
        if missing:
            raise ShardError(f"{len(missing)} shard(s) this loader reads are missing: {', '.join(missing[:3])}"
                             f"{' ...' if len(missing) > 3 else ''}; copy the whole phase folder, or read with "
                             "on_error='skip'")

    def load(self, span: Span, pool: fetch.BufferPool) -> LoadedSpan:
        """A prefetch thread's part of a span: the shard's bytes, its index (the writer's, else a
        walk over its tar headers), where the span's members lie and the position ids."""
        phase = self.phases[span.phase]
        shard = phase.shards[span.shard]
        cache = Path(self.options.cache_dir) if self.options.cache_dir else None
        location = fetch.join(phase.location, shard["name"])
        if "index" in shard and not pool.warm:  # shards come from disk: have the index read meanwhile
            fetch.will_need(fetch.join(phase.location, shard["index"]["name"]))
        buffer = fetch.load_shard(location, shard, cache, self.options.verify, pool, self.options.mmap)
        index = self.load_index(phase, shard, location, cache) or walk_index(buffer, location, span.stop)
        if index.more and span.stop == shard["samples"]:  # the walk met a sample the manifest does not list
            index.error = ShardError(f"{location}: holds more than the {shard['samples']} samples the manifest "
                                     "lists: replaced, or the manifest edited; rewrite the phase")
        layout = locate_span(buffer, index, span.start, span.stop)
        if self.options.fields is not None:
            layout.columns = {s: c for s, c in layout.columns.items() if member_field(s) in self.options.fields}
        options = self.options
        damaged = damaged_samples(buffer, index, span.start, span.stop) if options.check_samples else []
        positions = span_positions(layout, self.position_pool) if options.position_ids else None
        rows = span_rows(buffer, layout, options.position_ids, positions) \
            if options.batch_size and not options.shuffle and not damaged else None
        return LoadedSpan(buffer, index, layout, positions, rows, damaged)

    def load_index(self, phase: Phase, shard: dict[str, Any], location: str, cache: Path | None) -> ShardIndex | None:
        """The shard's index; None, so that its tar headers are walked, when it has none or a bad one
        (the samples are the same either way: an index only saves time)."""
        entry = shard.get("index")
        if entry is None:
            return None
        try:  # its sha256 always: an index is small (0.1 ms), and a flipped offset would misplace members unseen
            data = fetch.load_shard(fetch.join(phase.location, entry["name"]), entry, cache, "sha256" in entry)
            return parse_index(memoryview(data), location, shard)
        except ShardError as err:
            log.warning("reading a shard by its tar headers: %s", err)
            return None

    def finished(self, samples: list, positions: SpanPositions | None, shard: str) -> Iterator[list]:
        """A span's decoded samples, finished (finish_samples) a chunk at a time as they are asked
        for: position ids are made as the samples go out (datapipe.loader.positions)."""
        step = max(1, len(samples)) if positions is None else positions.chunk
        for start in range(0, len(samples), step):
            part = samples[start : start + step]
            samples[start : start + step] = [None] * len(part)  # else the span's list keeps every chunk alive
            rows = None if positions is None else positions[start : start + step]
            finish_samples(part, rows, self.options.position_ids, shard)
            yield part

    def span_samples(self, span: Span, future) -> Iterator[Rows | list]:
        phase = self.phases[span.phase]
        location = fetch.join(phase.location, phase.shards[span.shard]["name"])
        produced = 0
        try:
            loaded = future.result()
            if loaded.rows is not None:
                produced = len(loaded.layout.keys)
                yield loaded.rows
            else:
                samples = decode_samples(loaded.buffer, loaded.layout, location)
                mark_damaged(samples, loaded, span.start, location)
                produced = len(samples)
                yield from self.finished(samples, loaded.positions, location)
            if loaded.index.error is not None:
                raise loaded.index.error
            if produced < span.stop - span.start:
                raise ShardError(f"{location}: has {span.start + produced} samples, the manifest says "
                                 f"{phase.shards[span.shard]['samples']}: replaced or damaged; rewrite it")
        except ShardError as err:
            if self.options.on_error == "raise":
                raise
            log.warning("skipping the rest of a shard: %s", err)
            self.skipped.append(location)
            yield [None] * (span.stop - span.start - produced)


def mark_damaged(samples: list, loaded: LoadedSpan, start: int, location: str) -> None:
    """The span's samples whose bytes fail their digest become BadSamples (raised, or skipped)."""
    for number in loaded.damaged:
        key = loaded.layout.keys[number - start]
        samples[number - start] = BadSample(location, ShardError(
            f"{location}: sample {key} differs from the digest its index records: its bytes changed after "
            "they were written (a flipped bit, a damaged disk or copy); rewrite the shard, or read with "
            "on_error='skip'"))


def shards_per_window(phases: list[Phase], options: StreamOptions) -> int:
    """How many shards one shuffle window spans at most: their buffers stay alive together (0 unshuffled)."""
    if not options.shuffle:
        return 0
    smallest = min((shard["samples"] for phase in phases for shard in phase.shards), default=1)
    return min(64, -(-options.shuffle_window // max(1, smallest)) + 1)


def counted(samples: Iterator[PackedSample]) -> Iterator[PackedSample]:
    """`samples` passed through; returns how many there were (for `yield from`)."""
    count = 0
    for count, sample in enumerate(samples, 1):  # noqa: B007 - the count is the return value
        yield sample
    return count


def run_now(function, *args) -> Future:
    """A finished future: the inline twin of ThreadPoolExecutor.submit."""
    future: Future = Future()
    try:
        future.set_result(function(*args))
    except Exception as err:  # noqa: BLE001 - handed to whoever reads the future, as a pool would
        future.set_exception(err)
    return future


def stream(source: str | Path | list[str | Path], rank: int = 0, world_size: int = 1, **options: Any) -> Stream:
    """The samples of a phase or run folder (path or URL) for `rank` of `world_size`; see StreamOptions."""
    return Stream(source, rank=rank, world_size=world_size, **options)


def load_phases(source: str | Path | list[str | Path]) -> list[Phase]:
    """A run folder's curriculum (run.json), one phase folder (manifest.json), or a list of phase folders."""
    if isinstance(source, (list, tuple)):
        return [phase for location in source for phase in load_phases(location)]
    location = str(source)
    run = fetch.read_text(fetch.join(location, RUN_MANIFEST))
    if run is not None:
        manifest = json.loads(run)
        if not run_phases(manifest) and "documents" in manifest:
            raise ValueError(f"{location}: this run wrote documents ({manifest['documents']}), not shards: its recipe "
                             "has `phases: []`; give it phases and a tokenize stage to write shards for a trainer")
        return [load_phase(fetch.join(location, entry["name"]), entry.get("token_budget"))
                for entry in run_phases(manifest)]
    return [load_phase(location, None)]


def load_phase(location: str, token_budget: int | None) -> Phase:
    text = fetch.read_text(fetch.join(location, MANIFEST))
    if text is None:
        raise FileNotFoundError(f"{location}: neither run.json (a run folder) nor manifest.json (a phase folder); "
                                "a run that did not finish has neither: run it again with `datapipe run`")
    manifest = json.loads(text)
    return Phase(phase_name(manifest, location), location, tuple(manifest["shards"]), token_budget)


def data_fingerprint(phases: list[Phase]) -> str:
    """The data's identity in a state_dict: phase names and budgets, shard names, sizes, sha256."""
    digest = hashlib.sha256()
    for phase in phases:
        digest.update(f"{phase.name}:{phase.token_budget}:".encode())
        for shard in phase.shards:
            digest.update(f"{shard['name']}:{shard['samples']}:{shard.get('sha256', '')};".encode())
    return digest.hexdigest()[:16]
