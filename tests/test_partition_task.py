"""A partition run start to finish in one task (datapipe.pipeline.partition_task), in this process:
which recipes qualify, and a stage that fails half-way on a block, which the task retries one record
at a time on the block as the stage got it, replayed from the block it saved."""
import sys
import types
from typing import ClassVar

import pytest

from datapipe.pipeline import registry
from datapipe.pipeline.apply import apply_stage
from datapipe.pipeline.partition_task import Pass, fits_partition_tasks, most_at_once, run_stages, split_passes
from datapipe.pipeline.partitions import numbered
from datapipe.schema import docs_from_table, docs_to_table, new_document
from datapipe.stage import StageConfig
from datapipe.text.normalize import Config as NormalizeConfig
from renderers.stage import Config as RenderConfig
from tokenizer.stage import Config as TokenizeConfig


class Config(StageConfig):
    """A stage for this test: upper-cases texts and adds "!" in place (twice on the same text would show), and
    fails on "boom" after changing the others."""

    actor: ClassVar[bool] = False


def make_stage(cfg: Config):
    def shout(docs):
        for doc in docs:
            doc["text"] = doc["text"].upper() + "!"
        if any("BOOM" in doc["text"] for doc in docs):
            raise ValueError("cannot shout at boom")
        return docs

    return shout


@pytest.fixture
def shout(monkeypatch):
    monkeypatch.setitem(registry.STAGES, "shout", __name__)
    return Config(stage="shout")


def block_of(texts):
    return numbered([new_document("s", str(i), text) for i, text in enumerate(texts)], partition=3, start=0)


def test_a_stage_failing_half_way_is_retried_on_the_block_as_it_got_it(shout):
    """normalize, then shout: the one-by-one retry gets the block normalized but not yet shouted (the
    failed attempt had changed every text), and the records are those of the operator plan."""
    stages = (NormalizeConfig(stage="normalize"), shout)
    texts = ["ﬁne day", "boom", "ﬂat"]  # ligatures that NFKC (normalize) unfolds
    docs = run_stages(block_of(texts), stages)
    assert [(doc["text"], doc["reject"]) for doc in docs] == [("FINE DAY!", ""), ("BOOM!", "shout.error"), ("FLAT!", "")]
    assert docs[0]["transforms"] == ["normalize", "shout"] and docs[1]["transforms"] == ["normalize"]
    table = docs_to_table(block_of(texts))
    for cfg in stages:
        table = apply_stage(registry.stage_module(cfg.stage).make_stage(cfg), cfg.stage, table)
    assert [(d["text"], d["reject"], d["transforms"]) for d in docs_from_table(table)] == \
        [(d["text"], d["reject"], d["transforms"]) for d in docs]


def test_global_stages_cut_a_recipe_into_passes(shout, monkeypatch):
    normalize, tokenize = NormalizeConfig(stage="normalize"), TokenizeConfig(stage="tokenize")
    dedup = registry.stage_config_class("dedup")(stage="dedup")
    assert split_passes([normalize, tokenize]) == [Pass(0, None, (normalize, tokenize), None)]
    assert split_passes([normalize, dedup, shout, dedup, tokenize]) == [
        Pass(0, None, (normalize,), (1, dedup)), Pass(1, (1, dedup), (shout,), (3, dedup)),
        Pass(2, (3, dedup), (tokenize,), None)]
    assert split_passes([dedup]) == [Pass(0, None, (), (0, dedup)), Pass(1, (0, dedup), (), None)]
    whole = types.ModuleType("whole")  # a global stage without a partition form: transform_dataset alone
    whole.Config, whole.make_stage, whole.transform_dataset = Config, make_stage, lambda dataset, cfg, context: dataset
    monkeypatch.setitem(sys.modules, "whole", whole)
    monkeypatch.setitem(registry.STAGES, "whole", "whole")
    assert not fits_partition_tasks([normalize, Config(stage="whole")])


def test_which_recipes_run_as_partition_tasks(shout):
    normalize, tokenize = NormalizeConfig(stage="normalize"), TokenizeConfig(stage="tokenize")
    assert fits_partition_tasks([normalize, tokenize, shout])
    assert not fits_partition_tasks([normalize, RenderConfig(stage="render")])  # a warm browser: an actor pool
    dedup = registry.stage_config_class("dedup")(stage="dedup")
    assert fits_partition_tasks([normalize, dedup, tokenize])  # a global stage with a partition form: in passes
    assert not fits_partition_tasks([normalize, dedup.model_copy(update={"num_cpus": 2})])
    assert not fits_partition_tasks([tokenize.model_copy(update={"num_gpus": 1})])
    assert not fits_partition_tasks([tokenize.model_copy(update={"resources": {"node2": 1}})])
    assert not fits_partition_tasks([normalize.model_copy(update={"num_cpus": 2})])
    assert most_at_once([normalize, tokenize]) is None
    assert most_at_once([normalize.model_copy(update={"concurrency": (1, 3)}), tokenize.model_copy(update={"concurrency": 2})]) == 2
