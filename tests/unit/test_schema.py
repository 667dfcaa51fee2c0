"""schema: the YAML loader every rubberband file goes through refuses a key given twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from rubberband import CloudCatalog, ModelProfile, SpecError, load_experiment
from rubberband.providers.aws import load_cluster_config
from rubberband.schema import load_yaml

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "profiles" / "resnet101_cifar10_p3.yaml"
AWS = ROOT / "cloud_profiles" / "aws" / "us-east-1.yaml"

EXPERIMENT = f"""\
name: t
sha: {{num_trials: 8, min_iters: 1, max_iters: 9, eta: 3}}
model_profile: {MODEL}
cloud: {{profile: {AWS}, instance_type: p3.8xlarge}}
deadline: 20m
policy: optimal
deadline: 30m
"""

MODEL_PROFILE = """\
name: m
iter_latency_s:
  1: {dist: constant, value: 4.0}
  2: {dist: constant, value: 2.5}
  1: {dist: constant, value: 3.0}
"""

CLOUD_PROFILE = """\
provider: aws
region: us-east-1
instance_types:
  p3.2xlarge: {gpus_per_instance: 1, price_usd_per_hour: 3.06}
  p3.8xlarge: {gpus_per_instance: 4, price_usd_per_hour: 12.24, price_usd_per_hour: 1.0}
"""

CLUSTER = """\
cluster_name: rb
provider: {type: aws, region: us-east-1}
available_node_types:
  head: {node_config: {InstanceType: m5.large, ImageId: ami-1}}
  worker:
    node_config: {InstanceType: p3.8xlarge, ImageId: ami-1}
    max_workers: 4
head_node_type: head
provider: {type: aws, region: us-west-2}
"""


@pytest.mark.parametrize(
    ("content", "load", "pattern"),
    [
        (EXPERIMENT, load_experiment, r"line 7, column 1: duplicate key `deadline` \(first given at line 5\)"),
        (MODEL_PROFILE, ModelProfile.load, r"line 5, column 3: duplicate key `1` \(first given at line 3\)"),
        (CLOUD_PROFILE, CloudCatalog.load, r"line 5, .*duplicate key `price_usd_per_hour` \(first given at line 5\)"),
        (CLUSTER, load_cluster_config, r"line 9, column 1: duplicate key `provider` \(first given at line 2\)"),
    ],
    ids=["experiment", "model-profile", "cloud-profile", "cluster-yaml"],
)
def test_a_key_given_twice_is_an_error_naming_it_and_both_lines(tmp_path, content, load, pattern):
    path = tmp_path / "file.yaml"
    path.write_text(content)
    with pytest.raises(SpecError, match=rf"^{path}: not valid YAML at {pattern}; keep one of them$"):
        load(path)


def test_merge_keys_may_be_overridden(tmp_path):
    # `<<` brings keys in that the mapping then overrides: YAML's own way, not a duplicate.
    path = tmp_path / "anchors.yaml"
    path.write_text("base: &b {mean: 1, std: 2}\nother:\n  <<: *b\n  std: 3\n")
    assert load_yaml(path) == {"base": {"mean": 1, "std": 2}, "other": {"mean": 1, "std": 3}}


def test_the_same_key_in_different_mappings_is_fine(tmp_path):
    path = tmp_path / "nested.yaml"
    path.write_text("a: {x: 1}\nb: {x: 2}\n")
    assert load_yaml(path) == {"a": {"x": 1}, "b": {"x": 2}}
