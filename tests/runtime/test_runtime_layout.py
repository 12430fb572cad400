"""The runtime's structure: no import cycles, one engine protocol, one version check."""

from __future__ import annotations

import inspect
import sys
import types

import pytest

from perseus.errors import ConfigError
from perseus.runtime.engines.base import EngineAdapter, ManualEngine, check_engine_version
from perseus.schedule import build_schedule


def _import_cycles(package: str) -> list[list[str]]:
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the dev extra)")
    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    modules = sorted(graph.modules)
    state: dict[str, int] = {}
    cycles: list[list[str]] = []
    stack: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for dep in sorted(graph.find_modules_directly_imported_by(module)):
            if not dep.startswith(package + ".") and dep != package:
                continue
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[module] = 2

    for module in modules:
        if module not in state:
            visit(module)
    return cycles


def test_no_import_cycles_in_the_runtime():
    """Imports inside functions count (grimp sees them); package __init__ files that import
    their submodules lazily by name do not form edges."""
    cycles = [c for c in _import_cycles("perseus") if any("runtime" in m for m in c)]
    assert cycles == []


def test_every_adapter_follows_the_one_protocol():
    from perseus.runtime.engines import deepspeed, megatron, torch_pp

    for cls in (torch_pp.TorchPipelining, megatron.MegatronEngine, deepspeed.DeepSpeedEngine):
        for member in ("schedule", "rank", "group", "step_call", "attach"):
            # a method, a property or an attribute the constructor sets (annotated on the class)
            assert hasattr(cls, member) or member in inspect.get_annotations(cls), (cls, member)
    manual = ManualEngine(build_schedule("1f1b", 2, 4), 1)
    assert isinstance(manual, EngineAdapter)
    assert manual.attach(lambda a: None, lambda: False)() is None  # type: ignore[arg-type,return-value,func-returns-value]


def test_version_check_names_every_missing_attribute_path(monkeypatch):
    fake = types.ModuleType("fake_engine")
    fake.__version__ = "1.4.0"  # type: ignore[attr-defined]
    fake.Engine = type("Engine", (), {"run": lambda self: None})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_engine", fake)
    (mod,) = check_engine_version(
        "fake_engine", (1, 2), "pip install fake", ("fake_engine",), [(0, "Engine.run")], "1.x"
    )
    assert mod is fake
    with pytest.raises(ConfigError, match=r"lacks fake_engine\.Engine\._step, fake_engine\.gone"):
        check_engine_version(
            "fake_engine",
            (1, 2),
            "pip install fake",
            ("fake_engine",),
            [(0, "Engine.run"), (0, "Engine._step"), (0, "gone")],
            "1.x",
        )
    with pytest.raises(ConfigError, match=r"fake_engine 1\.4\.0 is not supported"):
        check_engine_version("fake_engine", (1, 5), "pip install fake", ("fake_engine",), [], "1.x")
    monkeypatch.setitem(sys.modules, "fake_engine", None)
    with pytest.raises(ConfigError, match="install it with `pip install fake`"):
        check_engine_version("fake_engine", (1, 2), "pip install fake", ("fake_engine",), [], "1.x")


def test_plan_sources_are_checked_when_built():
    from perseus.io import load_profile
    from perseus.runtime.planning import OfflineProfile, OnlineProfile, PlanFile, plan_source

    profile = load_profile("a100")
    with pytest.raises(ConfigError, match="patience must be an integer >= 1"):
        OnlineProfile(patience=0)
    with pytest.raises(ConfigError, match="sample_period_s must be > 0"):
        OnlineProfile(sample_period_s=0.0)
    with pytest.raises(ConfigError, match="layers_per_stage must be >= 1"):
        OfflineProfile(profile, layers_per_stage=0)
    with pytest.raises(ConfigError, match="plan= takes a plan source"):
        plan_source(None)  # type: ignore[arg-type]
    assert plan_source(profile) == OfflineProfile(profile)
    assert plan_source("plan.json") == PlanFile("plan.json")
    assert plan_source(PlanFile("plan.json", profile)) == PlanFile("plan.json", profile)
    assert plan_source(OnlineProfile()) == OnlineProfile()
