"""Stream packed samples to a trainer: `for sample in datapipe.stream("out/demo", rank=r, world_size=n)`.

The loader reads a stage folder (manifest.json) or a run folder (run.json: the
curriculum's stages in order, each until its token budget), from a local path or any
fsspec URL. What a (rank, worker) reads, and in what order, is index arithmetic over
the manifests (datapipe.loader.schedule): equal sample counts on every rank, shard order and a
window shuffle from (seed, epoch). So the state is two integers, (epoch, position):
`load_state_dict` then `iter` reads one shuffle window and skips into it, and the
samples that follow are exactly those an uninterrupted run would have yielded next.

Shards are mapped or read whole (or downloaded into an optional cache) `prefetch` ahead
by a thread pool, checked against the manifest's size and, with verify=True, its sha256.
The same threads read each shard's index (datapipe.packing.writer writes one beside each shard;
a shard without one is located by a walk over its tar headers), plan the decoding of the
span (datapipe.loader.decode.plan_span: numpy only) and derive its position ids
(datapipe.loader.positions.span_positions), so the thread that iterates only builds the sample
dicts: about 3 us a sample at 8K tokens in a tight loop on our 2-core box (about 7 in
the loader), where `cat` of the same bytes takes 7-9 (bench/stream.py, README "Speed").
With batch_size the loader yields batches of consecutive samples instead
(datapipe.loader.batches): in a shard of text samples the prefetch threads make each array column
one strided view of the shard and this thread only slices it, no Python per sample.
A bad shard raises ShardError naming it; with on_error="skip" its samples are left out
instead, logged, and listed in `.skipped` (that rank then yields fewer samples); a member
that does not decode fails its sample alone.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from itertools import chain, islice
from pathlib import Path
from typing import Any, NamedTuple

from datapipe.loader import fetch
from datapipe.loader.batches import Rows, batch_count, batched, collate, span_rows
from datapipe.loader.decode import BadSample, SpanPlan, decode_samples, plan_span
from datapipe.loader.positions import finish_samples, span_positions
from datapipe.loader.schedule import Placement, Span, Stage, epoch_plan, spans_from, stage_ends, window_order, windows
from datapipe.loader.shardindex import ShardError, ShardIndex, parse_index, walk_index
from datapipe.schema import PackedSample
from datapipe.shardformat import MANIFEST, RUN_MANIFEST, member_field, phase_name, run_phases

log = logging.getLogger(__name__)
ON_ERROR = ("raise", "skip")
WINDOW_BYTES = 64 << 20  # the default shuffle window's memory: a trainer host has it to spare per rank


@dataclass(frozen=True)
class StreamOptions:
    shuffle: bool = False  # permute shard order and shuffle within windows, from (seed, epoch)
    seed: int = 0  # the same seed, epoch and placement give the same order on every machine
    buffer: int | None = None  # shuffle window in samples; None: what fits in 64 MiB (~2K at 8K tokens, 255 at 64K)
    loop: bool = False  # False: one iter() is one epoch; True: epochs follow each other forever
    verify: bool = False  # check each shard's sha256 (about 1.5 GB/s of one core, in the prefetch threads)
    on_error: str = "raise"  # "raise": a bad shard stops with its name; "skip": leave it out and log it
    cache_dir: str | None = None  # keep downloaded shards here; None: remote shards stay in memory only
    prefetch: int = 2  # shards read ahead of the one being decoded (shuffled: plus a window), in threads
    position_ids: bool = True  # derive position_ids from doc_lens as read_shard does (~40% of the decode at 8K)
    mmap: bool = True  # map local shards the page cache holds whole (no copy); False: read them (see fetch.map_cached)
    batch_size: int | None = None  # yield batches of this many samples (datapipe.loader.batches); None: samples one by one
    drop_last: bool = False  # with batch_size: leave out an epoch's last batch when it is short
    fields: tuple[str, ...] | None = None  # decode only these members (see member_field); None: all of them


class LoadedSpan(NamedTuple):
    """What a prefetch thread hands the main thread for one span."""

    buffer: Any  # the shard's bytes
    index: ShardIndex
    plan: SpanPlan  # the span's members, located and typed
    positions: Any  # the span's position ids (a row per sample), or None: finish_samples derives them
    rows: Rows | None  # with batch_size, unshuffled: the span as columns (batches.span_rows), or None: decode it


class Stream:
    """An iterable over the samples of one (rank, worker), resumable with state_dict()."""

    def __init__(self, source: str | Path | list[str | Path], rank: int = 0, world_size: int = 1,
                 worker: int = 0, num_workers: int = 1, **options: Any):
        self.place = Placement(rank, world_size, worker, num_workers)
        self.stages = load_stages(source)
        if not self.stages:
            raise ValueError("no stage to read: give a run folder, a stage folder, or a non-empty list of them")
        self.options = resolve_buffer(StreamOptions(**options), self.stages)
        self.fingerprint = data_fingerprint(self.stages)  # in every state_dict (torchdata takes one a batch)
        check_options(self.options, self.place, self.stages)
        self.epoch, self.position = 0, 0
        self.skipped: list[str] = []  # shards left out under on_error="skip", in the order met
        self.buffers: fetch.BufferPool | None = None  # shard buffers, made on the first iter()
        self.position_buffers: fetch.BufferPool | None = None  # and the position ids' memory

    def for_worker(self, worker: int, num_workers: int) -> Stream:
        """The same loader for one DataLoader worker: a contiguous part of this rank's samples."""
        other = copy.copy(self)
        other.place = Placement(self.place.rank, self.place.world_size, worker, num_workers)
        check_options(other.options, other.place, other.stages)
        other.skipped, other.buffers, other.position_buffers = [], None, None
        return other

    def __getstate__(self) -> dict[str, Any]:
        """A pickled loader (a DataLoader worker's copy) starts with no buffers: they are not shareable."""
        return {**self.__dict__, "buffers": None, "position_buffers": None}

    def __iter__(self) -> Iterator[PackedSample]:
        yield from self.iterate_epoch()
        while self.options.loop:
            if not (yield from counted(self.iterate_epoch())):  # else it would spin through empty epochs forever
                log.warning("loop=True: a whole epoch yielded no sample (an empty share of the data for this rank "
                            "and worker, or every shard skipped); stopping")
                return

    def __len__(self) -> int:
        """Samples (with batch_size: batches, cut at each stage's end) this (rank, worker) yields per
        epoch, before any skipped shard."""
        ends = stage_ends(epoch_plan(self.stages, self.place, self.options.seed, 0, False))
        if self.options.batch_size is None:
            return ends[-1] if ends else 0  # a budget worth fewer samples than ranks: none
        return sum(batch_count(end - start, self.options.batch_size, self.options.drop_last)
                   for start, end in zip([0, *ends], ends))

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` from its beginning, unless the loader is already inside it (after a resume)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, **self.identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in self.identity().items():
            if state.get(key) != value:
                raise ValueError(f"cannot resume: the state was saved with {key}={state.get(key)!r}, this loader has "
                                 f"{key}={value!r}; resume with the same data, seed, shuffle, buffer, ranks, workers")
        self.epoch, self.position = state["epoch"], state["position"]

    def identity(self) -> dict[str, Any]:
        """What must not change across a resume for the order to be the same."""
        options = self.options
        return {**asdict(self.place), "seed": options.seed, "shuffle": options.shuffle, "buffer": options.buffer,
                "data": self.fingerprint}

    def iterate_epoch(self) -> Iterator[PackedSample]:
        options = self.options
        segments = epoch_plan(self.stages, self.place, options.seed, self.epoch, options.shuffle)
        todo = [w for w in windows(segments, self.place, options.seed, self.epoch, options.buffer)
                if w[0] + w[1] > self.position]
        if todo:
            first = todo[0][0] if options.shuffle else self.position
            spans = self.read_spans(spans_from(segments, first))
            try:
                if options.batch_size is None:
                    yield from self.shuffled(todo, spans) if options.shuffle else self.in_order(spans)
                elif options.shuffle:
                    yield from self.collated(self.shuffled(todo, spans), stage_ends(segments))
                else:
                    yield from self.in_batches(spans, stage_ends(segments))
            finally:
                spans.close()
        self.epoch, self.position = self.epoch + 1, 0

    def in_order(self, spans: Iterator[list]) -> Iterator[PackedSample]:
        for samples in spans:
            for sample in samples:
                self.position += 1
                if sample.__class__ is dict:
                    yield sample
                elif sample is not None:
                    self.bad_sample(sample)

    def shuffled(self, todo: list, spans: Iterator[list]) -> Iterator[PackedSample]:
        """Fill a window, yield it in its permuted order from the current position; the next window."""
        slots = chain.from_iterable(spans)
        for start, size, key in todo:
            chunk = list(islice(slots, size))
            for index in window_order(size, key, True)[self.position - start:]:
                sample, chunk[index] = chunk[index], None  # drop our reference: its shard buffer frees sooner
                self.position += 1
                if sample.__class__ is dict:
                    yield sample
                elif sample is not None:
                    self.bad_sample(sample)

    def in_batches(self, spans: Iterator[Rows | list], ends: list[int]) -> Iterator[dict[str, Any]]:
        """Batches of consecutive samples: slices of the spans' rows, which the prefetch threads
        made, or of samples decoded here when a span is not laid out for that."""
        rows = chain.from_iterable((item,) if item.__class__ is Rows else self.rows_of(item) for item in spans)
        options = self.options
        for batch, position in batched(rows, options.batch_size, options.drop_last, self.position, ends):
            self.position = position
            yield batch

    def rows_of(self, samples: list) -> Iterator[Rows]:
        """Decoded samples as rows, collated batch by batch (batches.join). A bad sample is left
        out, or under on_error="raise" raised after the rows before it, so that the batches they
        complete come out first, as the per-sample loader yields those samples."""
        slots: list[int] = []
        for slot, sample in enumerate(samples):
            if sample.__class__ is dict:
                slots.append(slot)
            elif sample is not None:
                if self.options.on_error == "raise":
                    yield Rows([samples[s] for s in slots], slots, slot)
                self.bad_sample(sample)
        yield Rows([samples[slot] for slot in slots], slots, len(samples))

    def collated(self, samples: Iterator[PackedSample], ends: list[int]) -> Iterator[dict[str, Any]]:
        """Shuffled samples in batches, stacked (a copy: a window's samples lie all over its
        shards), never two stages in one batch. Only the next sample shows that a stage ended:
        while the batch before it goes out, the position is the one after that batch's last sample."""
        size, drop_last, batch, stage, after_last = self.options.batch_size, self.options.drop_last, [], None, 0
        for sample in samples:
            here, position = bisect_right(ends, self.position - 1), self.position
            if batch and here != stage:
                self.position = after_last
                if not drop_last:
                    yield collate(batch)
                self.position, batch = position, []
            batch.append(sample)
            stage, after_last = here, position
            if len(batch) == size:
                yield collate(batch)
                batch = []
        if batch and not drop_last:
            yield collate(batch)

    def bad_sample(self, sample: BadSample) -> None:
        """A sample with a member that does not decode: raised, or under on_error="skip" left out."""
        if self.options.on_error == "raise":
            raise sample.error
        log.warning("skipping a sample: %s", sample.error)
        self.skipped.append(sample.shard)

    def read_spans(self, spans: Iterator[Span]) -> Iterator[list]:
        """The samples of each span in plan order, a list per span (or per part of one), one item
        per planned position: a dict, a BadSample, or None where a skipped shard was. A span is
        decoded when its turn comes.

        Reads, downloads and sha256 run `prefetch` shards ahead in threads (all three release
        the GIL), so the next shard arrives while this one is decoded; prefetch=0 reads inline.
        Shuffled, they run a window further ahead: a window is decoded whole before its first
        sample goes out, and the next one's shards are read while this one is handed out."""
        pool = ThreadPoolExecutor(max_workers=max(1, self.options.prefetch), thread_name_prefix="datapipe-fetch")
        submit = pool.submit if self.options.prefetch else run_now
        window = shards_per_window(self.stages, self.options)
        ahead = self.options.prefetch + window if self.options.prefetch else 0
        if self.buffers is None:  # kept for the next epochs: fresh memory costs the kernel a zero-fill
            self.buffers = fetch.BufferPool(keep=ahead + 2 + window)
            self.position_buffers = fetch.BufferPool(keep=ahead + 2 + window)
        pending: deque = deque()
        try:
            for span in spans:
                pending.append((span, submit(self.load, span, self.buffers)))
                if len(pending) > ahead:
                    yield from self.span_samples(*pending.popleft())
            while pending:
                yield from self.span_samples(*pending.popleft())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def load(self, span: Span, buffers: fetch.BufferPool) -> LoadedSpan:
        """A prefetch thread's part of a span: the shard's bytes, its index (the writer's, else a
        walk over its tar headers), the decoding plan and the position ids."""
        stage = self.stages[span.stage]
        shard = stage.shards[span.shard]
        cache = Path(self.options.cache_dir) if self.options.cache_dir else None
        location = fetch.join(stage.location, shard["name"])
        if "index" in shard and not buffers.warm:  # shards come from disk: have the index read meanwhile
            fetch.will_need(fetch.join(stage.location, shard["index"]["name"]))
        buffer = fetch.load_shard(location, shard, cache, self.options.verify, buffers, self.options.mmap)
        index = self.load_index(stage, shard, location, cache) or walk_index(buffer, location, span.stop)
        if index.more and span.stop == shard["samples"]:  # the walk met a sample the manifest does not list
            index.error = ShardError(f"{location}: holds more than the {shard['samples']} samples the manifest "
                                     "lists: replaced, or the manifest edited; rewrite the stage")
        plan = plan_span(buffer, index, span.start, span.stop)
        if self.options.fields is not None:
            plan.columns = {s: c for s, c in plan.columns.items() if member_field(s) in self.options.fields}
        options = self.options
        positions = span_positions(plan, self.position_buffers) if options.position_ids else None
        rows = span_rows(buffer, plan, options.position_ids, positions) if options.batch_size and not options.shuffle \
            else None
        return LoadedSpan(buffer, index, plan, positions, rows)

    def load_index(self, stage: Stage, shard: dict[str, Any], location: str, cache: Path | None) -> ShardIndex | None:
        """The shard's index; None, so that its tar headers are walked, when it has none or a bad one
        (the samples are the same either way: an index only saves time)."""
        entry = shard.get("index")
        if entry is None:
            return None
        try:
            data = fetch.load_shard(fetch.join(stage.location, entry["name"]), entry, cache, self.options.verify)
            return parse_index(memoryview(data), location, shard)
        except ShardError as err:
            log.warning("reading a shard by its tar headers: %s", err)
            return None

    def span_samples(self, span: Span, future) -> Iterator[list]:
        stage = self.stages[span.stage]
        location = fetch.join(stage.location, stage.shards[span.shard]["name"])
        produced = 0
        try:
            loaded = future.result()
            if loaded.rows is not None:
                produced = len(loaded.plan.keys)
                yield loaded.rows
            else:
                samples = decode_samples(loaded.buffer, loaded.plan, location)
                finish_samples(samples, self.options.position_ids, self.position_buffers, loaded.positions, location)
                produced = len(samples)
                yield samples
            if loaded.index.error is not None:
                raise loaded.index.error
            if produced < span.stop - span.start:
                raise ShardError(f"{location}: has {span.start + produced} samples, the manifest says "
                                 f"{stage.shards[span.shard]['samples']}: replaced or damaged; rewrite it")
        except ShardError as err:
            if self.options.on_error == "raise":
                raise
            log.warning("skipping the rest of a shard: %s", err)
            self.skipped.append(location)
            yield [None] * (span.stop - span.start - produced)


def resolve_buffer(options: StreamOptions, stages: list[Stage]) -> StreamOptions:
    """Fill in the default shuffle window: WINDOW_BYTES of the largest samples, 16 to 8192 of them."""
    if options.buffer is not None:
        return options
    sample_bytes = max(sum(s["bytes"] for s in stage.shards) / max(1, stage.samples) for stage in stages)
    return replace(options, buffer=int(min(8192, max(16, WINDOW_BYTES // max(1, sample_bytes)))))


def shards_per_window(stages: list[Stage], options: StreamOptions) -> int:
    """How many shards one shuffle window spans at most: their buffers stay alive together (0 unshuffled)."""
    if not options.shuffle:
        return 0
    smallest = min((shard["samples"] for stage in stages for shard in stage.shards), default=1)
    return min(64, -(-options.buffer // max(1, smallest)) + 1)


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
    """The samples of a stage or run folder (path or URL) for `rank` of `world_size`; see StreamOptions."""
    return Stream(source, rank=rank, world_size=world_size, **options)


def check_options(options: StreamOptions, place: Placement, stages: list[Stage]) -> None:
    if not 0 <= place.rank < place.world_size:
        raise ValueError(f"rank {place.rank} is outside world_size {place.world_size}")
    if not 0 <= place.worker < place.num_workers:
        raise ValueError(f"worker {place.worker} is outside num_workers {place.num_workers}")
    if options.buffer < 1:
        raise ValueError(f"buffer {options.buffer}: the shuffle window holds at least 1 sample")
    if options.on_error not in ON_ERROR:
        raise ValueError(f"on_error {options.on_error!r}; allowed: {', '.join(ON_ERROR)}")
    if options.batch_size is not None and options.batch_size < 1:
        raise ValueError(f"batch_size {options.batch_size}: a batch holds at least 1 sample (None: no batches)")
    if isinstance(options.fields, str):
        raise ValueError(f"fields={options.fields!r}: give a tuple of names, e.g. fields=('tokens', 'loss_mask')")
    if options.verify and (unsigned := [s.name for s in stages if any("sha256" not in x for x in s.shards)]):
        raise ValueError(f"verify=True, but the manifest of stage(s) {', '.join(unsigned)} gives no sha256 for some "
                         "shards (written by another tool?): rewrite them with datapipe, or read with verify=False")
    if options.fields is not None and options.position_ids and not {"tokens", "doc_lens"} <= set(options.fields):
        raise ValueError(f"position_ids come from doc_lens and tokens, which fields={options.fields!r} leaves out: "
                         "add them, or pass position_ids=False")


def load_stages(source: str | Path | list[str | Path]) -> list[Stage]:
    """A run folder's curriculum (run.json), one stage folder (manifest.json), or a list of stage folders."""
    if isinstance(source, (list, tuple)):
        return [stage for location in source for stage in load_stages(location)]
    location = str(source)
    run = fetch.read_text(fetch.join(location, RUN_MANIFEST))
    if run is not None:
        return [load_stage(fetch.join(location, entry["name"]), entry.get("token_budget"))
                for entry in run_phases(json.loads(run))]
    return [load_stage(location, None)]


def load_stage(location: str, token_budget: int | None) -> Stage:
    text = fetch.read_text(fetch.join(location, MANIFEST))
    if text is None:
        raise FileNotFoundError(f"{location}: neither run.json (a run folder) nor manifest.json (a stage folder); "
                                "a run that did not finish has neither: run it again with `datapipe run`")
    manifest = json.loads(text)
    return Stage(phase_name(manifest, location), location, tuple(manifest["shards"]), token_budget)


def data_fingerprint(stages: list[Stage]) -> str:
    digest = hashlib.sha256()
    for stage in stages:
        digest.update(f"{stage.name}:{stage.token_budget}:".encode())
        for shard in stage.shards:
            digest.update(f"{shard['name']}:{shard['samples']}:{shard.get('sha256', '')};".encode())
    return digest.hexdigest()[:16]
