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
    assert provider.name == name and isinstance(provider.cluster_yaml, bool)
    # Same methods with the same parameters as the protocol (isinstance only checks names).
    for method in ("check", "start", "sweep", "down", "status"):
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
