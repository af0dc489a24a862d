"""Pool sizes and placement checks on clusters described as Ray describes them (datapipe.pipeline.sizing)."""
from datapipe.pipeline.sizing import demand, held_problems, placement_problems, pool_bounds
from datapipe.text.normalize import Config as Normalize
from renderers.dedup import Config as RenderDedup
from renderers.stage import Config as Render
from tokenizer.stage import Config as Tokenize

GiB = 1 << 30
HEAD = {"CPU": 1.0, "memory": 4.0 * GiB, "object_store_memory": 1.0 * GiB, "node:10.0.0.1": 1.0,
        "node:__internal_head__": 1.0}
RENDER_NODE = {"CPU": 8.0, "memory": 24.0 * GiB, "object_store_memory": 8.0 * GiB, "node:10.0.0.2": 1.0, "chromium": 2.0}
GPU_NODE = {"CPU": 16.0, "GPU": 4.0, "memory": 100.0 * GiB, "node:10.0.0.3": 1.0}


def totals(*nodes: dict) -> dict:
    return {name: sum(node.get(name, 0.0) for node in nodes) for node in nodes for name in node}


def test_an_unset_pool_grows_to_what_the_whole_cluster_holds_for_one_actor():
    cluster = totals(HEAD, RENDER_NODE, GPU_NODE)  # 25 CPUs, 4 GPUs, 2 chromium
    assert pool_bounds(Tokenize(stage="tokenize"), cluster) == (1, 25)
    assert pool_bounds(Tokenize(stage="tokenize", num_cpus=0.5), cluster) == (1, 50)
    assert pool_bounds(Tokenize(stage="tokenize", num_gpus=1), cluster) == (1, 4)  # and 1 CPU each: GPUs bound it
    assert pool_bounds(Render(stage="render", resources={"chromium": 1}), cluster) == (1, 2)
    assert pool_bounds(Render(stage="render", reserved_memory_mb=20 << 10), cluster) == (1, 6)  # 128 GiB / 20 GiB
    assert pool_bounds(Tokenize(stage="tokenize", resources={"tpu_pod": 1}), cluster) == (1, 1)  # at least min


def test_concurrency_bounds_the_pool_and_one_actor_stages_stay_one():
    cluster = totals(HEAD, RENDER_NODE)
    assert pool_bounds(Tokenize(stage="tokenize", concurrency=4), cluster) == (1, 4)
    assert pool_bounds(Tokenize(stage="tokenize", concurrency=[2, 64]), cluster) == (2, 64)  # an autoscaler may add nodes
    assert pool_bounds(RenderDedup(stage="render_dedup"), cluster) == (1, 1)


def test_demand_is_in_rays_resource_names_with_its_defaults():
    assert demand(Normalize(stage="normalize")) == {"CPU": 1.0}  # Ray Data's default, tasks and actors alike
    assert demand(RenderDedup(stage="render_dedup")) == {"CPU": 0.1}
    stage = Render(stage="render", num_cpus=2, num_gpus=0.5, reserved_memory_mb=512, resources={"chromium": 1})
    assert demand(stage) == {"CPU": 2.0, "GPU": 0.5, "memory": 512.0 * (1 << 20), "chromium": 1.0}


def test_a_stage_that_fits_on_no_node_is_refused_with_every_nodes_resources():
    stages = [Normalize(stage="normalize"), Render(stage="render", resources={"chromium": 1}),
              Tokenize(stage="tokenize", num_gpus=1)]
    problems = placement_problems(stages, [HEAD, RENDER_NODE])
    assert [problem.split(" needs")[0] for problem in problems[:-1]] == ["stages[2] (tokenize)"]
    assert "needs CPU 1, GPU 1 for each task or actor, and no node has GPU" in problems[0]
    assert problems[-1] == ("the cluster's nodes: [CPU 1, memory 4 GiB]; [CPU 8, chromium 2, memory 24 GiB]")
    assert placement_problems(stages, [HEAD, RENDER_NODE, GPU_NODE]) == []


def test_a_custom_resource_no_node_has_says_how_to_start_one():
    problems = placement_problems([Render(stage="render", resources={"chromium": 1})], [HEAD, GPU_NODE])
    assert "no node has chromium" in problems[0]
    assert """ray start --address HEAD:PORT --resources '{"chromium": 1}'""" in problems[0]


def test_what_each_node_has_matters_not_the_sum():
    """16 + 8 CPUs in all, but no node has 20: Ray would wait for one forever."""
    problems = placement_problems([Tokenize(stage="tokenize", num_cpus=20)], [RENDER_NODE, GPU_NODE])
    assert "no single node has all of that" in problems[0]


def test_minimum_pools_must_leave_a_cpu_for_the_reads():
    stages = [Normalize(stage="normalize"), Tokenize(stage="tokenize", concurrency=[2, 4])]
    (problem,) = held_problems(stages, {"CPU": 2.0})
    assert problem.startswith("actor stages hold CPU 2 from start to end (tokenize 2 x 1: minimum actors x each), "
                              "and reading or a task stage needs CPU 1 more, but the cluster has CPU 2")
    assert "set ray.num_cpus to at least 3" in problem
    assert held_problems(stages, {"CPU": 3.0}) == []
    unset = [Normalize(stage="normalize"), Tokenize(stage="tokenize"), Tokenize(stage="tokenize", concurrency=2)]
    assert held_problems(unset, {"CPU": 3.0}) == []  # maxima are Ray Data's to share out, not held


def test_a_task_stage_needing_a_resource_the_pools_hold_is_refused():
    stages = [Render(stage="render", resources={"chromium": 1}, concurrency=[2, 2]),
              Normalize(stage="normalize", resources={"chromium": 1})]
    (problem,) = held_problems(stages, {"CPU": 8.0, "chromium": 2.0})
    assert "hold chromium 2" in problem and "needs chromium 1 more" in problem and "ray.num_cpus" not in problem
    assert held_problems(stages, {"CPU": 8.0, "chromium": 3.0}) == []
