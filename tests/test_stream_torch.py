"""The torch adapter under torchdata's StatefulDataLoader: exact resume with and without worker processes."""
import copy
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch extra is not installed: pip install 'datapipe[torch]'")
from torchdata.stateful_dataloader import StatefulDataLoader

from datapipe.loader.torch_data import StreamDataset, collate_packed, packed_batch
from tests.test_shards import write_run


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torch") / "main"
    write_run(folder, n_docs=400, per_shard=7)
    return folder


def make_loader(stage, num_workers, rank=0, world_size=1, batched=False, shuffle=True):
    """Batches of 4: collated by the DataLoader, or with `batched` made by the loader (batch_size=4)."""
    options = {"rank": rank, "world_size": world_size, "shuffle": shuffle, "seed": 3, "shuffle_window": 9}
    context = "fork" if num_workers else None
    if batched:
        dataset = StreamDataset(stage, batch_size=4, **options)
        return dataset, StatefulDataLoader(dataset, batch_size=None, num_workers=num_workers, collate_fn=packed_batch,
                                           multiprocessing_context=context)
    dataset = StreamDataset(stage, **options)
    return dataset, StatefulDataLoader(dataset, batch_size=4, num_workers=num_workers, collate_fn=collate_packed,
                                       multiprocessing_context=context)


def batches(dataset, loader, epochs, skip=0):
    """Keys batch by batch over `epochs` epochs (set_epoch at each, as a trainer does)."""
    out = []
    for epoch in epochs:
        dataset.set_epoch(epoch)
        out += [batch["keys"] for batch in loader]
    return out[skip:]


@pytest.mark.parametrize("batched", [False, True])
def test_resume_without_workers_across_epochs(stage, batched):
    reference = batches(*make_loader(stage, 0, batched=batched), range(2))
    for cut in sorted(random.Random(0).sample(range(len(reference)), 6)) + [len(reference) // 2]:
        dataset, loader = make_loader(stage, 0, batched=batched)
        head, epoch = [], 0
        for epoch in range(2):
            dataset.set_epoch(epoch)
            head += [b["keys"] for _, b in zip(range(cut - len(head)), loader)]  # range first: zip pulls no extra batch
            if len(head) == cut:
                break
        state = loader.state_dict()
        dataset, loader = make_loader(stage, 0, batched=batched)
        loader.load_state_dict(state)
        assert head + batches(dataset, loader, range(epoch, 2)) == reference, f"cut after {cut} batches"


@pytest.mark.slow
def test_resume_with_two_workers(stage):
    dataset, loader = make_loader(stage, 2, rank=1, world_size=2)
    reference = batches(dataset, loader, [0])
    assert sorted(k for b in reference for k in b) == sorted(s["key"] for s in dataset.template)
    for cut in (1, 6, len(reference) - 2):
        dataset, loader = make_loader(stage, 2, rank=1, world_size=2)
        iterator = iter(loader)
        head = [next(iterator)["keys"] for _ in range(cut)]
        state = loader.state_dict()
        del iterator
        dataset, loader = make_loader(stage, 2, rank=1, world_size=2)
        loader.load_state_dict(state)
        assert head + [b["keys"] for b in loader] == reference, f"cut after {cut} batches"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """16 samples: rank 1 of 2 reads 8, split 8 / 4+4 / 2+3+3 by 0-1, 2 and 3 workers."""
    folder = tmp_path_factory.mktemp("torch_small") / "main"
    assert len(write_run(folder, n_docs=44, per_shard=3)) == 16
    return folder


def small_loader(stage, num_workers, batch_size, drop_last, batched):
    """Batches collated by the DataLoader, or with `batched` made by the loader; workers forked."""
    options = {"rank": 1, "world_size": 2, "shuffle": True, "seed": 3, "shuffle_window": 3}
    context = "fork" if num_workers else None
    if batched:
        dataset = StreamDataset(stage, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers, **options)
        return dataset, StatefulDataLoader(dataset, batch_size=None, num_workers=num_workers,
                                           collate_fn=packed_batch, multiprocessing_context=context)
    dataset = StreamDataset(stage, **options)
    return dataset, StatefulDataLoader(dataset, batch_size=batch_size, drop_last=drop_last, num_workers=num_workers,
                                       collate_fn=collate_packed, multiprocessing_context=context)


def save_points(dataset, loader, epochs):
    """Keys batch by batch over `epochs`, and a saved state at every point a trainer could save at:
    before the first batch, after each batch, and after each epoch's loop (as (batches so far,
    the epoch a trainer resumes at, state))."""
    keys, points = [], [(0, 0, loader.state_dict())]
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            keys.append(batch["keys"])
            points.append((len(keys), epoch, copy.deepcopy(loader.state_dict())))
        points.append((len(keys), epoch + 1, copy.deepcopy(loader.state_dict())))
    return keys, points


# 4 divides the 8 and 4+4 shares, not 2+3+3; 3 divides only the 3s: every worker count meets a
# short last batch, kept or dropped (with 3 workers and drop_last, batches of 4 leave none at all)
RESUME_CASES = [(3, False, False), (3, True, False), (4, False, False), (4, True, False), (4, True, True)]


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_resume_at_every_save_point_of_two_epochs(small, num_workers):
    """The issue's case: a worker whose share of the epoch is done, restored, was asked for a batch
    and gave the next epoch's (its state said epoch+1, position 0)."""
    for batch_size, drop_last, batched in RESUME_CASES:
        setting = (small, num_workers, batch_size, drop_last, batched)
        reference, points = save_points(*small_loader(*setting), epochs=2)
        for cut, epoch, state in points:
            dataset, loader = small_loader(*setting)
            loader.load_state_dict(state)
            assert reference[:cut] + batches(dataset, loader, range(epoch, 2)) == reference, \
                f"batch_size={batch_size} drop_last={drop_last} batched={batched}: saved after {cut} batches"


@pytest.mark.parametrize("position_ids", [True, False])  # False: collate derives them itself
def test_collate_builds_varlen_attention_inputs(stage, position_ids):
    dataset = StreamDataset(stage, position_ids=position_ids)
    several_docs = (sample for sample in dataset if len(sample["doc_lens"]) > 1)
    samples = [sample for _, sample in zip(range(3), several_docs)]
    assert len(samples) == 3, "the fixture stage needs samples packing several documents"
    batch = collate_packed(samples)
    assert batch["tokens"].shape == (3, 128) and batch["tokens"].dtype == torch.int64
    assert int(batch["cu_seqlens"][-1]) == 3 * 128 and batch["position_ids"].dtype == torch.int32
    all_pieces = []
    for row, sample in enumerate(samples):
        # positions restart at 0 for every document; the padding, if any, counts as one more piece
        pieces = [int(n) for n in sample["doc_lens"]] + ([int(sample["num_pad"])] if sample["num_pad"] else [])
        assert sum(pieces) == 128
        expected = np.concatenate([np.arange(n) for n in pieces])
        assert np.array_equal(batch["position_ids"][row].numpy(), expected), f"row {row}: {pieces}"
        all_pieces += pieces
    assert batch["cu_seqlens"].tolist() == [0] + np.cumsum(all_pieces).tolist()
    assert np.array_equal(batch["tokens"][1].numpy(), samples[1]["tokens"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_batches_equal_the_dataloaders_own(stage, num_workers):
    """Unshuffled, batches the loader makes (views of the shards) equal those collate_packed makes."""
    ours = list(make_loader(stage, num_workers, batched=True, shuffle=False)[1])
    theirs = list(make_loader(stage, num_workers, shuffle=False)[1])
    assert len(ours) == len(theirs) > 3
    for mine, other in zip(ours, theirs):
        assert mine.keys() == other.keys() and mine["keys"] == other["keys"]
        for name in mine.keys() - {"keys"}:
            assert mine[name].dtype == other[name].dtype and torch.equal(mine[name], other[name]), name


@pytest.mark.parametrize("num_workers", [0, 2, 3])
def test_len_counts_the_batches_each_worker_cuts(stage, num_workers):
    dataset = StreamDataset(stage, batch_size=4, num_workers=num_workers)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=num_workers,
                                         multiprocessing_context="fork" if num_workers else None)
    batches = list(loader)
    assert len(loader) == len(dataset) == len(batches)
    assert sum(len(b["key"]) for b in batches) == len(StreamDataset(stage))
    if num_workers == 3:  # 176 samples: shares of 59, 59, 58 each end in a short batch, 45 in all (not 44)
        assert len(batches) > -(-len(StreamDataset(stage)) // 4)


def test_packed_batch_says_what_it_needs(tmp_path):
    from datapipe.loader.batches import collate
    from tests.test_stream import write_curriculum

    write_curriculum(tmp_path)  # a 64-token stage, then a 128-token one
    samples = list(StreamDataset(tmp_path))
    switch = [s["seq_len"] for s in samples].index(128)
    with pytest.raises(ValueError, match="needs samples of one length"):
        collate_packed(samples[switch - 1 : switch + 1])
    with pytest.raises(ValueError, match="add 'doc_lens' to the loader's fields="):
        packed_batch(collate(list(StreamDataset(tmp_path, fields=("tokens",), position_ids=False))[:2]))


def test_a_worker_with_no_batches_keeps_its_state(stage):
    dataset = StreamDataset(stage, batch_size=1000, drop_last=True)  # fewer samples than one batch: len() 0
    assert len(dataset) == 0
    state = dataset.state_dict()
    dataset.load_state_dict({**state, "epoch": 5})
    assert dataset.state_dict()["epoch"] == 5  # the same Stream, not a new one made because len() was 0
