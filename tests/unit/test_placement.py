from raytf._internal.driver.preflight import data_starvation, placement_timeout_message, unfit_worker

NODES = [
    {"CPU": 8.0, "memory": 1e9, "node:10.0.0.1": 1.0},
    {"CPU": 4.0, "GPU": 2.0, "node:10.0.0.2": 1.0},
]


def test_a_worker_some_node_can_hold_fits():
    assert unfit_worker({"CPU": 4.0, "GPU": 2.0}, NODES) is None
    assert unfit_worker({"CPU": 8.0}, NODES) is None


def test_more_gpus_than_any_node_is_explained():
    message = unfit_worker({"CPU": 1.0, "GPU": 4.0}, NODES)
    assert "ScalingConfig.gpus_per_worker=4, but the largest node has 2 GPU" in message
    assert "check_resources=False" in message
    assert "node:" not in message  # internal resources are not shown


def test_resources_must_fit_on_one_node_not_in_total():
    # 8 CPUs exist on one node and 2 GPUs on another, never together.
    message = unfit_worker({"CPU": 8.0, "GPU": 1.0}, NODES)
    assert message is not None and "no node in the cluster can hold one worker" in message


def test_custom_resource_names_the_setting():
    message = unfit_worker({"CPU": 1.0, "tpu": 1.0}, NODES)
    assert "resources_per_worker['tpu']=1, but the largest node has 0 tpu" in message


def test_placement_timeout_message_says_what_was_asked_and_what_exists():
    message = placement_timeout_message(
        {"CPU": 2.0}, 3, "STRICT_SPREAD", 5.0, {"CPU": 12.0}, {"CPU": 1.0}, NODES
    )
    assert "3 x {CPU: 2}" in message
    assert "placement=STRICT_SPREAD" in message
    assert "2 node(s)" in message and "{CPU: 1} free" in message
    assert "placement_timeout_s" in message


def test_lazy_datasets_need_a_cpu_outside_the_worker_group():
    assert data_starvation([], 2.0, 2.0) is None
    assert data_starvation(["train"], 4.0, 2.0) is None
    message = data_starvation(["train", "val"], 2.0, 2.0)
    assert "'train', 'val' must run Ray Data tasks" in message
    assert "takes 2 of the cluster's 2 CPUs" in message and ".materialize()" in message


def test_a_local_storage_path_some_node_cannot_see_is_refused():
    from raytf._internal.driver.preflight import unseen_storage

    assert unseen_storage("/data/results", {"10.0.0.1": True, "10.0.0.2": True}) is None
    assert unseen_storage("/data/results", {"10.0.0.1": True, "10.0.0.2": None}) is None  # no answer: unknown
    message = unseen_storage("/data/results", {"10.0.0.1": True, "10.0.0.2": False, "10.0.0.3": False})
    assert "RunConfig.storage_path='/data/results'" in message
    assert "10.0.0.2, 10.0.0.3" in message and "s3://" in message


def test_on_an_autoscaling_cluster_a_worker_waits_for_a_node_type_that_fits_or_is_refused_naming_them():
    from raytf._internal.driver.cluster import NodeType
    from raytf._internal.driver.preflight import launchable

    head = [{"CPU": 0.0}]
    types = [NodeType("gpu_1x", {"CPU": 4.0, "GPU": 1.0}, 8), NodeType("gpu_4x", {"CPU": 48.0, "GPU": 4.0}, 2)]
    assert launchable({"CPU": 1.0, "GPU": 1.0}, 4, head, types) == (None, ["gpu_1x", "gpu_4x"])
    assert launchable({"CPU": 8.0, "GPU": 4.0}, 2, head, types) == (None, ["gpu_4x"])
    problem, waits = launchable({"CPU": 1.0, "GPU": 8.0}, 1, head, types)
    assert waits == [] and "no node can hold one worker" in problem
    assert "gpu_1x {CPU: 4, GPU: 1} x8" in problem and "gpu_4x {CPU: 48, GPU: 4} x2" in problem
    problem, _ = launchable({"CPU": 8.0, "GPU": 4.0}, 3, head, types)  # at most 2 nodes of 4 GPUs
    assert "can hold at most 2 workers" in problem and "num_workers=3" in problem
    # A live node that fits: nothing to wait for.
    assert launchable({"CPU": 1.0}, 1, [{"CPU": 2.0}], types) == (None, [])
