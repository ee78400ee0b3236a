import json

import pytest

from raytf._internal.driver.topology import (
    WorkerAddress,
    assign_ranks,
    build_tf_config,
    format_host_port,
    worker_list,
)


def addr(node: str, port: int, ip: str = "10.0.0.1") -> WorkerAddress:
    return WorkerAddress(node_id=node, node_ip=ip, port=port)


def test_workers_on_one_node_get_contiguous_ranks_in_bundle_order():
    # Bundles land on nodes a, b, a, b: node a's actors must be ranks 0 and 1.
    addresses = [addr("a", 1000), addr("b", 2000, "10.0.0.2"), addr("a", 1001), addr("b", 2001, "10.0.0.2")]
    ranks = assign_ranks(addresses)
    assert [r.world_rank for r in ranks] == [0, 2, 1, 3]
    assert [r.local_rank for r in ranks] == [0, 0, 1, 1]
    assert [r.node_rank for r in ranks] == [0, 1, 0, 1]
    assert {r.local_world_size for r in ranks} == {2}
    assert {(r.world_size, r.num_nodes) for r in ranks} == {(4, 2)}


def test_uneven_nodes():
    addresses = [addr("b", 1), addr("a", 2), addr("a", 3)]
    ranks = assign_ranks(addresses)
    assert [(r.world_rank, r.node_rank, r.local_rank, r.local_world_size) for r in ranks] == [
        (0, 0, 0, 1),
        (1, 1, 0, 2),
        (2, 1, 1, 2),
    ]


def test_worker_list_is_indexed_by_world_rank_and_tf_config_points_at_own_entry():
    addresses = [addr("a", 1000), addr("b", 2000, "10.0.0.2"), addr("a", 1001)]
    ranks = assign_ranks(addresses)
    workers = worker_list(addresses, ranks)
    assert workers == ["10.0.0.1:1000", "10.0.0.1:1001", "10.0.0.2:2000"]
    for address, rank in zip(addresses, ranks):
        tf_config = json.loads(build_tf_config(workers, rank.world_rank))
        assert tf_config["cluster"] == {"worker": workers}
        assert tf_config["task"] == {"type": "worker", "index": rank.world_rank}
        assert workers[tf_config["task"]["index"]] == address.host_port


def test_ipv6_addresses_are_bracketed():
    assert format_host_port("fe80::1", 5) == "[fe80::1]:5"
    assert format_host_port("10.1.2.3", 5) == "10.1.2.3:5"
    assert addr("a", 7, ip="::1").host_port == "[::1]:7"


def test_duplicate_address_is_rejected():
    with pytest.raises(ValueError, match="same address"):
        assign_ranks([addr("a", 1000), addr("a", 1000)])


def test_rank_outside_cluster_is_rejected():
    with pytest.raises(ValueError, match="outside"):
        build_tf_config(["h:1"], 1)


def test_every_role_is_in_one_cluster_spec_and_the_evaluator_outside_it():
    cluster = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"], "evaluator": ["e:1"]}
    config = json.loads(build_tf_config(cluster, 1, task_type="worker"))
    assert config == {"cluster": {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1"]},
                      "task": {"type": "worker", "index": 1}}
    evaluator = json.loads(build_tf_config(cluster, 0, task_type="evaluator"))
    assert "evaluator" not in evaluator["cluster"] and evaluator["task"] == {"type": "evaluator", "index": 0}
    with pytest.raises(ValueError, match="role 'ps' is outside"):
        build_tf_config(cluster, 1, task_type="ps")


def _tf_config(ports, index, chief=False):
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    if chief:
        cluster = {"chief": [cluster["worker"][0]], "worker": cluster["worker"][1:]}
        return json.dumps({"cluster": cluster, "task": {"type": "chief" if index == 0 else "worker",
                                                          "index": 0 if index == 0 else index - 1}})
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def test_a_peer_waits_for_the_coordination_leader_to_listen_before_connecting():
    import socket
    import threading
    import time

    from raytf._internal.worker.strategy import wait_for_leader

    leader = socket.socket()
    leader.bind(("127.0.0.1", 0))  # bound, not listening: what a reserved port looks like
    port = leader.getsockname()[1]
    # The leader itself (worker 0, or the chief where there is one) never waits.
    assert wait_for_leader(_tf_config([port, 1], 0), timeout_s=5) == 0.0
    assert wait_for_leader(_tf_config([port, 1], 0, chief=True), timeout_s=5) == 0.0
    # A peer waits until the leader's server listens, and no longer.
    threading.Timer(0.5, leader.listen).start()
    started = time.monotonic()
    waited = wait_for_leader(_tf_config([port, 1], 1), timeout_s=10)
    assert 0.4 <= waited < 5 and time.monotonic() - started < 5
    leader.close()
    # A leader that never listens: the peer gives up after timeout_s and leaves it to TensorFlow.
    assert 0.3 <= wait_for_leader(_tf_config([port, 1], 1, chief=True), timeout_s=0.3) < 3
