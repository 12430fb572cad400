"""A phase-level profile's stage holds at most the layers a job can plan with (1,024)."""

from __future__ import annotations

import pytest

from perseus.errors import ProfileError
from perseus.io.profile_files import read_phase_profile, read_profile
from perseus.job import make_job
from perseus.validate import MAX_LAYERS_PER_STAGE

HEADER = "stage,instruction,frequency,time,energy,first_layer,last_layer\n"


def _two_phases(layers: int) -> str:
    k = layers // 3
    rows = [
        f"0,{kind},{freq},{t * share!r},{10 * t * share!r},{first},{last}"
        for kind, t in (("forward", 0.1), ("backward", 0.2))
        for freq, slow in ((1410, 1.0), (1200, 1.2))
        for first, last, share in ((0, k - 1, slow / 3), (k, layers - 1, 2 * slow / 3))
    ]
    return HEADER + "\n".join(rows) + "\n"


def test_a_stage_of_more_layers_than_a_job_plans_is_refused_naming_the_field(tmp_path):
    path = tmp_path / "phases.csv"
    path.write_text(_two_phases(2000))  # read before as 2000 layers, which make_job refuses
    for read in (read_phase_profile, read_profile):
        with pytest.raises(ProfileError) as e:
            read(path)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"{path}:3: last_layer '1999'")
        assert f"0..{MAX_LAYERS_PER_STAGE - 1}" in msg


def test_a_stage_of_the_most_layers_plans(tmp_path):
    path = tmp_path / "phases.csv"
    path.write_text(_two_phases(MAX_LAYERS_PER_STAGE))
    pp = read_phase_profile(path)
    assert pp.layers_per_stage == (MAX_LAYERS_PER_STAGE,)
    job = make_job(
        pp.profile,
        "1f1b",
        1,
        2,
        blocking_power_w=70.0,
        layers_per_stage=pp.layers_per_stage,
        layer_time_fractions=pp.layer_time_fractions,
    )
    assert job.spec.layers_per_stage == (MAX_LAYERS_PER_STAGE,)
