"""A phase packed by groups of partitions keeps what a single pass over the corpus gave: the budget
and the mixture to within a document per source and group, every document at most once, full
sequences, and the same figures when everything fits in one group."""
from __future__ import annotations

import numpy as np
import pytest

from datapipe.packing.corpus import corpus_from_documents, corpus_from_tables, pack_reasons, piece_table
from datapipe.packing.curriculum import (
    CurriculumPhase,
    pack_group,
    pack_phase,
    phase_targets,
    select_group,
    supply_of,
    whole_corpus_targets,
)
from datapipe.packing.groups import plan_groups
from tests.test_packing import IDS, make_docs

SOURCES = ["web", "books"]


def partitioned(n_partitions: int = 12):
    """Web and books documents over partitions (each a source's file), as committed pieces."""
    docs = make_docs(21, 6000, media_every=0, source="web") + make_docs(22, 900, media_every=0, max_len=2000,
                                                                        source="books", log_median=6.0)
    tables = []
    for partition in range(n_partitions):
        part = [{**doc, "partition": partition, "position": i << 12} for i, doc in enumerate(docs[partition::n_partitions])]
        tables.append(piece_table(part, pack_reasons(part, IDS)))
    return tables


def packed_in_groups(phase: CurriculumPhase, tables: list, seed: int = 0):
    """What the runner does: supplies per partition, targets over all, groups, one pack per group."""
    corpora = [corpus_from_tables([table], SOURCES) for table in tables]
    supplies = [supply_of(phase, corpus, seed) for corpus in corpora]
    everything = corpus_from_tables(tables, SOURCES)
    targets = phase_targets(phase, SOURCES, np.sum(supplies, axis=0), everything.total_tokens)
    groups = plan_groups(phase, supplies, [corpus.total_tokens for corpus in corpora], targets)
    results = []
    for number, members in enumerate(groups):
        corpus = corpus_from_tables([tables[i] for i in members], SOURCES)
        selection, sequences, samples = pack_group(phase, corpus, seed, IDS, targets, number)
        results.append((corpus, selection, list(samples)))
    return targets, groups, results


@pytest.mark.parametrize("phase", [
    CurriculumPhase(name="p", seq_len=128, tokens=200_000, mixture={"web": 3, "books": 1}, group_tokens=40_000),
    CurriculumPhase(name="p", seq_len=256, fraction=0.6, group_tokens=60_000),
    CurriculumPhase(name="p", seq_len=128, tokens="1B", mixture={"web": 1, "books": 1}, group_tokens=50_000),
    CurriculumPhase(name="p", seq_len=256, upsample_long={"min_tokens": 300, "factor": 2.5}, group_tokens=100_000),
])
def test_groups_keep_the_budget_the_mixture_and_the_fill(phase):
    tables = partitioned()
    targets, groups, results = packed_in_groups(phase, tables)
    assert len(groups) > 2
    assert sorted(i for members in groups for i in members) == list(range(len(tables)))
    single = whole_corpus_targets(phase, corpus_from_tables(tables, SOURCES), 0)
    assert (targets.budget, targets.limited_by) == (single.budget, single.limited_by)
    assert np.allclose(targets.weights, single.weights)
    tokens = np.zeros(len(SOURCES))
    ids_seen = []
    for corpus, selection, samples in results:
        tokens += np.bincount(corpus.source[selection.docs], weights=selection.lengths, minlength=len(SOURCES))
        ids_seen += sorted(set(corpus.ids[row] for row in selection.docs.tolist()))
        assert all(len(sample["tokens"]) == phase.seq_len for sample in samples)
        used = sum(phase.seq_len - sample["num_pad"] for sample in samples)
        assert used / (len(samples) * phase.seq_len) >= 0.99  # each group's own fill
    assert len(ids_seen) == len(set(ids_seen))  # a document belongs to one group
    longest = max(table.column("tokens").combine_chunks().value_lengths().to_numpy().max() for table in tables)
    wanted = targets.budget * targets.weights
    assert np.all(np.abs(tokens - wanted) <= len(groups) * longest * 2.5), (tokens, wanted)


def test_a_phase_in_one_group_packs_as_the_single_pass():
    docs = make_docs(5, 2000, media_every=5)
    corpus = corpus_from_documents(docs, IDS, ["web"])
    phase = CurriculumPhase(name="p", seq_len=128, upsample_long={"min_tokens": 100, "factor": 1.5})
    expected = [sample["doc_ids"] for sample in pack_phase(phase, corpus, 7, IDS)[2]]
    targets = whole_corpus_targets(phase, corpus, 7)
    assert plan_groups(phase, [supply_of(phase, corpus, 7)], [corpus.total_tokens], targets) == [[0]]
    assert [sample["doc_ids"] for sample in pack_group(phase, corpus, 7, IDS, targets, 0)[2]] == expected
    assert select_group(phase, corpus, 7, targets, 1).docs.tolist() != select_group(phase, corpus, 7, targets, 0).docs.tolist()


def test_upsampling_copies_do_not_depend_on_the_grouping():
    tables = partitioned(6)
    phase = CurriculumPhase(name="p", seq_len=256, upsample_long={"min_tokens": 300, "factor": 1.5})
    whole = corpus_from_tables(tables, SOURCES)
    parts = [corpus_from_tables([table], SOURCES) for table in tables]
    assert np.allclose(supply_of(phase, whole, 3), np.sum([supply_of(phase, part, 3) for part in parts], axis=0))
