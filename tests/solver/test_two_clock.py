"""Two-clock plans: exact figures (recomputed independently), no slowdown, near the LP floor."""

from __future__ import annotations

import json

import networkx as nx
import pytest

from perseus.errors import ConfigError, PlanError
from perseus.io import load_profile
from perseus.job import make_job
from perseus.plan import SCHEMA_VERSION, Frontier
from perseus.profile import build_profile
from perseus.schedule import Kind
from perseus.solver import trace
from perseus.solver.lp_bound import lp_energy_floor_j

POWER = {"a100": 83.64, "a40": 70.38}
_KINDS = list(Kind)


def _independent_figures(job, point, latency_s, switch_j, fractions=None):
    """Time and energy of a plan point from the raw profile, without perseus's evaluator."""
    g = job.graph
    ops = [op for rank in point.freqs_mhz for op in rank]
    durations, energies = [], []
    for i, op in enumerate(ops):
        stage, kind = int(g.stage[i]), _KINDS[int(g.kind[i])]
        rows = {o.freq_mhz: (o.time_s, o.energy_j) for o in job.profile.op(stage, kind).options}
        if isinstance(op, int):
            t, e = rows[op]
        else:
            fa, fb, k = op
            layers = job.spec.layers_per_stage[stage]
            w = fractions[stage] if fractions else [1.0] * layers
            share = sum(w[:k]) / sum(w)
            (ta, ea), (tb, eb) = rows[fa], rows[fb]
            x = min(1.0, share + latency_s / ta)
            t = x * ta + (1 - x) * tb
            e = x * ea + (1 - x) * eb + switch_j
        durations.append(t)
        energies.append(e)
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(ops)))
    for u, v, lat in zip(g.edge_src, g.edge_dst, g.edge_latency_s, strict=True):
        dag.add_edge(int(u), int(v), lat=float(lat))
    finish: dict[int, float] = {}
    for v in nx.topological_sort(dag):
        begin = max((finish[u] + dag[u][v]["lat"] for u in dag.predecessors(v)), default=0.0)
        finish[v] = begin + durations[v]
    makespan = max(finish.values())
    idle = g.num_ranks * makespan - sum(durations)
    return makespan, sum(energies) + job.blocking_power_w * idle


@pytest.mark.parametrize(
    "latency_s,switch_j,fractions",
    [(0.005, 0.0, None), (0.02, 1.5, [[1.0 + (j % 3) for j in range(12)]] * 4)],
)
def test_every_two_clock_point_is_exact(latency_s, switch_j, fractions):
    a40 = load_profile("a40")
    rows = [
        (s, k, o.freq_mhz, o.time_s, o.energy_j)
        for (s, k), op in a40.ops.items()
        if s < 4
        for o in op.options
    ]
    job = make_job(
        build_profile(rows, source="a40 stages 0-3"),
        "1f1b",
        4,
        6,
        blocking_power_w=POWER["a40"],
        layers_per_stage=12,
        layer_time_fractions=fractions,
        switch_latency_s=latency_s,
        switch_energy_j=switch_j,
    )
    frontier = trace(job).frontier
    assert any(p.num_two_clock_ops for p in frontier.points)
    for p in frontier.points:
        t, e = _independent_figures(job, p, latency_s, switch_j, fractions)
        assert t == pytest.approx(p.time_s, rel=1e-9)
        assert e == pytest.approx(p.energy_j, rel=1e-9)
        ev = job.evaluate(job.flat(p))
        assert (ev.time_s, ev.energy_j) == (p.time_s, p.energy_j)


@pytest.mark.parametrize("profile", ["a100", "a40"])
def test_no_slowdown_two_clock_plan_reaches_the_lp_limit(profile):
    job = make_job(
        load_profile(profile), "1f1b", 8, 12, blocking_power_w=POWER[profile], layers_per_stage=12
    )
    result = trace(job)
    base = result.frontier.baseline
    plan = result.frontier.cheapest_within(base.time_s)
    assert plan.time_s <= base.time_s
    assert result.frontier.fastest.time_s <= base.time_s
    assert plan.num_two_clock_ops > 0
    floor = lp_energy_floor_j(job, base.time_s)
    saving = 100 * (1 - plan.energy_j / base.energy_j)
    limit = 100 * (1 - floor / base.energy_j)
    assert limit - 0.1 <= saving <= limit + 1e-9
    one_clock = trace(job, max_clocks_per_op=1).frontier
    assert plan.energy_j < one_clock.cheapest_within(base.time_s).energy_j
    assert all(p.num_two_clock_ops == 0 for p in one_clock.points)


def test_two_clock_plans_round_trip_and_version_1_reads():
    job = make_job(
        load_profile("a100"),
        "1f1b",
        8,
        8,
        blocking_power_w=POWER["a100"],
        layers_per_stage=[12] * 8,
    )
    frontier = trace(job).frontier
    text = frontier.model_dump_json()
    data = json.loads(text)
    assert data["schema_version"] == SCHEMA_VERSION
    ops = [op for p in data["points"] for rank in p["freqs_mhz"] for op in rank]
    assert any(isinstance(op, list) and len(op) == 3 for op in ops)
    assert any(isinstance(op, int) for op in ops)
    assert Frontier.model_validate_json(text) == frontier
    # A version-1 file (one clock per op, no two-clock fields) still reads and checks.
    plain = make_job(load_profile("a100"), "1f1b", 8, 8, blocking_power_w=POWER["a100"])
    old = json.loads(trace(plain).frontier.model_dump_json())
    old["schema_version"] = 1
    for field in (
        "layers_per_stage",
        "layer_time_fractions",
        "switch_latency_s",
        "switch_energy_j",
    ):
        old["job"].pop(field)
    read = Frontier.model_validate_json(json.dumps(old))
    read.check_job(plain.spec)
    read.check_job(job.spec)  # one-clock plans do not depend on the layer count
    frontier.check_job(job.spec)
    with pytest.raises(PlanError, match="layers_per_stage"):
        frontier.check_job(plain.spec)


def test_two_clock_ops_are_checked():
    job = make_job(
        load_profile("a100"), "1f1b", 8, 4, blocking_power_w=POWER["a100"], layers_per_stage=12
    )
    plain = make_job(load_profile("a100"), "1f1b", 8, 4, blocking_power_w=POWER["a100"])
    ops = [[f, f, 0] for f in job.allmax().tolist()]
    ops[3] = [1410, 1200, 12]
    with pytest.raises(PlanError, match=r"layers_at_a must be in 1\.\.11"):
        job.evaluate(ops)
    ops[3] = [1410, 1200, 6]
    with pytest.raises(PlanError, match="no layers_per_stage"):
        plain.evaluate(ops)
    assert job.evaluate(ops).energy_j < job.evaluate(job.allmax()).energy_j


def test_bad_two_clock_settings_are_config_errors():
    profile = load_profile("a100")
    with pytest.raises(ConfigError, match="layers_per_stage has 3 entries"):
        make_job(profile, "1f1b", 8, 4, blocking_power_w=83.64, layers_per_stage=[12, 12, 12])
    with pytest.raises(ConfigError, match="layer_time_fractions"):
        make_job(
            profile,
            "1f1b",
            8,
            4,
            blocking_power_w=83.64,
            layers_per_stage=2,
            layer_time_fractions=[[1.0]],
        )
    with pytest.raises(ConfigError, match="switch_latency_s"):
        make_job(
            profile, "1f1b", 8, 4, blocking_power_w=83.64, layers_per_stage=2, switch_latency_s=-1.0
        )
    with pytest.raises(ConfigError, match=r"`max_clocks_per_op`=1"):
        trace(make_job(profile, "1f1b", 8, 4, blocking_power_w=83.64), max_clocks_per_op=2)


def test_phased_tables_over_the_limit_are_refused_before_pricing(monkeypatch):
    from perseus.solver import cost_model

    # 64 layers x 4 clocks: 10.7 million options (minutes and GBs); here 12 layers x 3 clocks
    # against a small limit, so the test is quick either way.
    job = make_job(load_profile("a100"), "1f1b", 8, 8, blocking_power_w=83.64, layers_per_stage=12)
    priced = []
    monkeypatch.setattr(cost_model, "phased_cost", lambda *a: priced.append(a) or (1.0, 1.0))
    monkeypatch.setattr(cost_model, "MAX_PHASED_OPTIONS", 1000)
    with pytest.raises(
        ConfigError, match=r"`max_clocks_per_op`=3 with up to 12 layers per stage: "
    ):
        cost_model.build_cost_model(job, 0.0, 3)
    assert priced == []  # refused before any is priced
    cost_model.build_cost_model(job, 0.0, 1)  # one clock per op: no phased option


def test_cli_flags_and_toml_config_give_two_clock_plans(tmp_path, capsys):
    from perseus.cli.main import main

    out = tmp_path / "f.json"
    args = ["frontier", "a100", "--microbatches", "4", "-o", str(out)]
    assert main([*args, "--layers-per-stage", "12"]) == 0
    assert "mid-op switches per iteration" in capsys.readouterr().out
    frontier = Frontier.model_validate_json(out.read_text())
    assert frontier.job.layers_per_stage == (12,) * 8
    assert any(p.num_two_clock_ops for p in frontier.points)
    assert main([*args, "--layers-per-stage", "12", "--max-clocks-per-op", "1"]) == 0
    one = Frontier.model_validate_json(out.read_text())
    assert not any(p.num_two_clock_ops for p in one.points)
    assert main([*args, "--max-clocks-per-op", "2"]) == 2
    assert "--layers-per-stage" in capsys.readouterr().err
    config = tmp_path / "job.toml"
    config.write_text(
        'profile = "a100"\nmicrobatches = 4\nlayers_per_stage = 12\nswitch_latency_s = 0.01\n'
    )
    assert main(["frontier", "--config", str(config), "-o", str(out)]) == 0
    from_config = Frontier.model_validate_json(out.read_text())
    assert from_config.job.switch_latency_s == 0.01
    assert any(p.num_two_clock_ops for p in from_config.points)
