"""Bad arguments to the public library API raise a perseus error naming the parameter."""

from __future__ import annotations

import pytest

from perseus import ConfigError, PerseusError, load_profile, make_job

HUGE = "<10**5000>"  # stands for the int (whose str() raises ValueError: 4,300-digit limit)


def _value(value: object) -> object:
    return 10**5000 if value == HUGE else value


@pytest.fixture(scope="module")
def profile():
    return load_profile("a100")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("stages", HUGE),
        ("stages", "8"),
        ("microbatches", None),
        ("microbatches", 1.5),
        ("microbatches", True),
        ("microbatches", float("nan")),
        ("virtual_stages", HUGE),
        ("blocking_power_w", float("nan")),
        ("blocking_power_w", "80"),
        ("blocking_power_w", HUGE),
        ("p2p_latency_s", float("inf")),
        ("p2p_latency_s", -1),
        ("backward_split", None),
        ("switch_latency_s", "x"),
        ("switch_stall_s", float("nan")),
        ("switch_energy_j", []),
    ],
)
def test_make_job_refuses_a_bad_number_naming_it(profile, name, value) -> None:
    args = {"stages": 8, "microbatches": 4, "blocking_power_w": 80.0, name: _value(value)}
    stages, microbatches = args.pop("stages"), args.pop("microbatches")
    with pytest.raises(ConfigError, match=f"`{name}` must be an? (integer|number) in "):
        make_job(profile, "zb", stages, microbatches, **args)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"profile": None}, "`profile` must be a Profile"),
        ({"schedule": ["1f1b"]}, "`schedule` must be a name"),
        ({"schedule": HUGE}, "`schedule` must be a name"),
        ({"profile_name": 3}, "`profile_name` must be a string"),
        ({"layers_per_stage": 1.5}, "`layers_per_stage` must be an integer"),
        ({"layers_per_stage": [[2]]}, "`layers_per_stage` must be an integer"),
        ({"layers_per_stage": 2, "layer_time_fractions": 0.5}, "`layer_time_fractions` must be"),
        ({"layers_per_stage": 2, "layer_time_fractions": [1] * 8}, "`layer_time_fractions` must"),
        (
            {"layers_per_stage": 1, "layer_time_fractions": [["1"]] * 8},
            r"layer_time_fractions\[0\]",
        ),
        ({"microbatches": 10_000_000}, "job too large to plan"),  # not minutes of building
    ],
)
def test_make_job_refuses_bad_objects(profile, args, match) -> None:
    args = {name: _value(value) for name, value in args.items()}
    call = {"profile": profile, "schedule": "1f1b", "stages": 8, "microbatches": 4, **args}
    with pytest.raises(PerseusError, match=match):
        make_job(blocking_power_w=80.0, **call)


def test_make_job_still_takes_numpy_numbers(profile) -> None:
    import numpy as np

    job = make_job(profile, "1f1b", np.int64(8), np.int64(4), blocking_power_w=np.float64(80))
    assert job.spec.microbatches == 4


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"time_quantum_s": "0.1"}, "`time_quantum_s` must be a number in"),
        ({"time_quantum_s": HUGE}, "`time_quantum_s` must be a number in"),
        ({"time_quantum_s": float("nan")}, "`time_quantum_s` must be a number in"),
        ({"min_gap_fraction": None}, "`min_gap_fraction` must be a number in"),
        ({"min_gap_fraction": HUGE}, "`min_gap_fraction` must be a number in"),
        ({"min_gap_fraction": -1}, "`min_gap_fraction` must be a number in"),
        ({"progress": "bar"}, "`progress` must be a function"),
        ({"job": "job"}, "`job` must be a PlanningJob"),
    ],
)
def test_trace_frontier_refuses_bad_arguments(profile, args, match) -> None:
    from perseus import trace_frontier

    args = {name: _value(value) for name, value in args.items()}
    job = args.pop("job", None) or make_job(profile, "1f1b", 8, 4, blocking_power_w=80.0)
    with pytest.raises(ConfigError, match=match):
        trace_frontier(job, **args)
