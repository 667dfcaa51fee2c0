"""The local provider's cluster config: one Ray node type per instance type and market."""

import pytest

from rubberband.errors import SpecError
from rubberband.profiles.cloud import CloudCatalog
from rubberband.providers.base import cluster_node_types
from rubberband.providers.local import autoscaling_config

CATALOG = "cloud_profiles/local/local.yaml"


def test_a_two_type_cluster_offers_each_type_with_its_gpus_price_and_room(tmp_path):
    catalog = CloudCatalog.load(CATALOG)
    one, two = catalog.get("local.1gpu"), catalog.get("local.2gpu")
    cfg = autoscaling_config("rb-x", [one, two], {"local.1gpu": 3, "local.2gpu": 1}, 6380, str(tmp_path), 1.0, 0, 1.0)
    workers = {k: v for k, v in cfg["available_node_types"].items() if k != "ray.head.default"}
    assert {k: (v["resources"]["GPU"], v["max_workers"], v["node_config"]["InstanceType"]) for k, v in workers.items()} == \
        {"local_1gpu": (1, 3, "local.1gpu"), "local_2gpu": (2, 1, "local.2gpu")}
    assert workers["local_1gpu"]["resources"]["rb-slot-local_1gpu"] == 1
    assert workers["local_2gpu"]["resources"]["rb-slot-local_2gpu"] == 1
    assert cfg["provider"]["node_types"] == {
        "local_1gpu": {"instance_type": "local.1gpu", "market": "on-demand", "price_usd_per_hour": 1.006},
        "local_2gpu": {"instance_type": "local.2gpu", "market": "on-demand", "price_usd_per_hour": 2.0}}
    assert cfg["max_workers"] == 3          # one type is released before the next is launched
    assert [t.name for t in cluster_node_types([one, two])] == ["local.1gpu", "local.2gpu"]


def test_one_type_is_the_cluster_it_always_was(tmp_path):
    two = CloudCatalog.load(CATALOG).get("local.2gpu")
    assert autoscaling_config("rb-x", two, 2, 6380, str(tmp_path), 1.0, 0, 1.0) == \
        autoscaling_config("rb-x", [two], {"local.2gpu": 2}, 6380, str(tmp_path), 1.0, 0, 1.0)


def test_a_type_without_a_room_is_one_line(tmp_path):
    catalog = CloudCatalog.load(CATALOG)
    with pytest.raises(SpecError, match=r"^cluster: no instance count for local.2gpu; say how many the cluster may hold$"):
        autoscaling_config("rb-x", [catalog.get("local.1gpu"), catalog.get("local.2gpu")], {"local.1gpu": 1}, 6380,
                           str(tmp_path), 1.0, 0, 1.0)
