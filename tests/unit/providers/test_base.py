"""The provider registry: lookup by name, one-line errors, and every provider fits the seam."""

import inspect

import pytest

from rubberband.errors import SpecError
from rubberband.providers import base
from rubberband.providers.base import Provider


def test_an_unknown_provider_is_one_line_naming_the_valid_ones():
    with pytest.raises(SpecError, match=r"^--provider: unknown provider 'gcp'; choose one of local, aws, sim$"):
        base.get("gcp", "--provider")


def test_a_misspelt_provider_suggests_the_closest():
    with pytest.raises(SpecError, match=r"unknown provider 'lcoal' \(did you mean `local`\?\); choose one of local, aws, sim"):
        base.get("lcoal")


@pytest.mark.parametrize("name", base.names())
def test_every_registered_provider_implements_the_protocol(name):
    provider = base.get(name)
    assert isinstance(provider, Provider)
    assert provider.name == name
    assert all(isinstance(getattr(provider, f), bool) for f in ("cluster_yaml", "starts_cluster", "emulates_spot"))
    # Same methods with the same parameters as the protocol (isinstance only checks names).
    for method in ("load_cluster_yaml", "node_types", "spot_emulation", "describe", "check", "start", "sweep", "down",
                   "status"):
        want = list(inspect.signature(getattr(Provider, method)).parameters)[1:]
        assert list(inspect.signature(getattr(provider, method)).parameters) == want, f"{name}.{method}"


def test_local_and_aws_are_registered_and_a_third_provider_is_one_line(monkeypatch):
    assert base.names()[:2] == ("local", "aws")
    monkeypatch.setattr(base, "_REGISTRY", dict(base._REGISTRY))
    monkeypatch.setattr(base, "_LOADED", {})

    class Sim:
        name, cluster_yaml = "sim", False

    base.register("sim", Sim)
    assert isinstance(base.get("sim"), Sim) and base.get("sim") is base.get("sim")
    assert "sim" in base.names()


def test_a_cluster_yaml_goes_only_to_a_provider_that_launches_from_one():
    local, aws = base.get("local"), base.get("aws")
    assert base.cluster_yaml_for(local, None, "experiment.yaml") is None     # the experiment's is for aws
    assert base.cluster_yaml_for(aws, None, "experiment.yaml") == "experiment.yaml"
    assert base.cluster_yaml_for(aws, "given.yaml", "experiment.yaml") == "given.yaml"
    with pytest.raises(SpecError, match=r"^--cluster: the local provider takes no Ray cluster YAML; drop it, or run "
                                        r"on a provider that launches from one \(aws\)$"):
        base.cluster_yaml_for(local, "given.yaml")
    with pytest.raises(SpecError, match=r"^cluster_config: the aws provider needs a Ray cluster YAML .*pass --cluster PATH"):
        base.cluster_yaml_for(aws, None, where="cluster_config")


def test_each_provider_says_what_it_offers():
    offers = {name: (p.starts_cluster, p.cluster_yaml, p.emulates_spot) for name in base.names() for p in [base.get(name)]}
    assert offers == {"local": (True, False, True), "aws": (True, True, False), "sim": (False, False, False)}


def _spot_cloud():
    from rubberband.profiles.cloud import CloudProfile

    return CloudProfile.load("cloud_profiles/aws/us-east-1.yaml", "p3.2xlarge")


def test_a_provider_that_emulates_reclaims_builds_its_emulation_and_describes_it():
    local = base.get("local")
    emulation = local.spot_emulation("rate=2/h,notice=20s", _spot_cloud(), (1, 0), seed=3)
    assert (emulation.rate_per_hour, emulation.notice_s, emulation.seed) == (2.0, 20.0, 3)
    assert local.spot_emulation(emulation, _spot_cloud(), (1,), seed=0) is emulation      # already built
    assert local.describe(emulation) == "spot emulation: 2 reclaims per instance-hour, 20s notice"
    assert local.describe(None) is None


@pytest.mark.parametrize("name", ["aws", "sim"])
def test_a_provider_that_emulates_no_reclaims_refuses_the_flag_naming_one_that_does(name):
    provider = base.get(name)
    msg = (rf"^--spot-emulation: only the local provider emulates reclaims \(the {name} provider's spot instances are "
           r"reclaimed by the cloud, or by its own model\); drop the flag or run with --provider local$")
    with pytest.raises(SpecError, match=msg):
        base.require_spot_emulation(provider)
    with pytest.raises(SpecError, match=msg):
        provider.spot_emulation("rate=2/h", _spot_cloud(), (1,), seed=0)
    base.require_spot_emulation(base.get("local"))      # no error


def test_a_cluster_yaml_is_read_by_the_provider_that_launches_from_one(tmp_path):
    from tests.conftest import write_cluster_yaml

    path = write_cluster_yaml(tmp_path / "c.yaml", instance_type="g5.xlarge", max_workers=3)
    cfg = base.load_cluster_yaml(path, "g5.xlarge")
    assert (cfg.instance_type, cfg.region, cfg.max_workers) == ("g5.xlarge", "us-east-1", 3)
    with pytest.raises(SpecError, match=r"p3\.2xlarge"):
        base.load_cluster_yaml(path, "p3.2xlarge")


def test_a_cluster_offers_each_type_on_demand_and_on_spot_where_it_has_a_spot_price():
    from dataclasses import replace

    spot = _spot_cloud()
    no_spot = replace(spot, instance_type="x.1gpu", spot_price_usd_per_hour=None)
    assert [t.name for t in base.get("aws").node_types([spot, no_spot])] == ["p3.2xlarge", "p3.2xlarge.spot", "x.1gpu"]
