"""The provider seam holds: outside ``rubberband/providers/`` code reaches a provider only
through ``providers.base`` (the registry and the ``Provider`` it returns), Ray's private node
provider is touched by one adapter module, and an instance's name is spelt in one place."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "rubberband"
PROVIDERS = PACKAGE / "providers"
SEAM = {"rubberband.providers", "rubberband.providers.base"}     # what the rest of rubberband may import
RAY_PRIVATE_PROVIDER = "ray.autoscaler._private"
# Known, and to go: the CLI's truth check reaches the sim backend's module directly; it should
# ask the registry's provider. (The rehearsal itself runs the executor's driver on the
# virtual-clock ports in ``rubberband.executor.sim``.)
KNOWN: set[tuple[str, str]] = set()


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, lazily or not (``from a import b`` counts ``a`` and ``a.b``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _provider_modules() -> set[str]:
    return {f"rubberband.providers.{p.stem}" for p in PROVIDERS.glob("*.py") if p.stem != "__init__"}


def test_nothing_outside_providers_imports_a_concrete_provider():
    concrete = _provider_modules() - SEAM
    assert {"rubberband.providers.local", "rubberband.providers.aws", "rubberband.providers.spot_emulation",
            "rubberband.providers.local_node_provider", "rubberband.providers.aws_node_provider"} <= concrete
    leaks = {(str(p.relative_to(ROOT)), m) for p in _sources() if PROVIDERS not in p.parents
             for m in _imports(p) if m in concrete}
    assert leaks - KNOWN == set(), "import these through rubberband.providers.base (the registry) instead"


def test_the_known_leaks_are_still_there():
    # Once one is gone, drop it from KNOWN so that it cannot come back unnoticed.
    for source, module in KNOWN:
        assert module in _imports(ROOT / source), f"{source} no longer imports {module}: remove it from KNOWN"


def test_only_the_node_provider_adapter_touches_rays_private_node_provider():
    touching = [str(p.relative_to(ROOT)) for p in _sources()
                if any(m.startswith(RAY_PRIVATE_PROVIDER) for m in _imports(p))]
    assert touching == ["rubberband/providers/node_provider.py"]


def test_local_and_aws_node_providers_each_specialise_the_one_base():
    from rubberband.providers.aws_node_provider import AwsNodeProvider
    from rubberband.providers.local_node_provider import LocalNodeProvider
    from rubberband.providers.node_provider import RubberbandNodeProvider

    assert AwsNodeProvider.__bases__ == (RubberbandNodeProvider,)
    assert LocalNodeProvider.__bases__ == (RubberbandNodeProvider,)


def test_an_instance_name_is_spelt_in_one_place():
    spelt = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("rb-instance-"):
                spelt.append(str(path.relative_to(ROOT)))
    assert spelt == ["rubberband/nodes.py"]
