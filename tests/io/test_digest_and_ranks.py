"""Points digest (schema 2), version-1 files, and multi-rank profile aggregation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perseus.errors import PlanError, ProfileError
from perseus.io import read_frontier, write_frontier
from perseus.io.profile_files import read_profile
from perseus.plan import SCHEMA_VERSION, points_sha256

from ..corpus.conftest import A100, small_frontier


@pytest.fixture
def frontier_path(tmp_path: Path) -> Path:
    _job, frontier = small_frontier()
    path = tmp_path / "f.json"
    write_frontier(frontier, path)
    return path


def test_written_files_carry_the_digest(frontier_path: Path) -> None:
    doc = json.loads(frontier_path.read_text())
    assert doc["schema_version"] == SCHEMA_VERSION == 3
    f = read_frontier(frontier_path)
    assert doc["points_sha256"] == points_sha256(f.points)


def test_an_edited_point_is_refused_with_how_to_regenerate(frontier_path: Path) -> None:
    doc = json.loads(frontier_path.read_text())
    doc["points"][1]["energy_j"] *= 0.8  # a "better" plan, typed in by hand
    frontier_path.write_text(json.dumps(doc))
    with pytest.raises(
        PlanError, match=r"f\.json: field points: .*edited or corrupted.*perseus frontier"
    ):
        read_frontier(frontier_path)


def test_whitespace_and_key_order_do_not_matter(frontier_path: Path) -> None:
    doc = json.loads(frontier_path.read_text())
    frontier_path.write_text(json.dumps(dict(reversed(list(doc.items()))), indent=4))
    assert read_frontier(frontier_path).points_sha256 == doc["points_sha256"]


def test_version_1_files_are_still_read(frontier_path: Path, tmp_path: Path) -> None:
    doc = json.loads(frontier_path.read_text())
    doc["schema_version"] = 1
    del doc["points_sha256"]
    old = tmp_path / "v1.json"
    old.write_text(json.dumps(doc))
    f = read_frontier(old)
    assert f.schema_version == 1 and f.points_sha256 is None
    # rewritten as the current version with its digest
    write_frontier(f, tmp_path / "v2.json")
    again = json.loads((tmp_path / "v2.json").read_text())
    assert again["schema_version"] == SCHEMA_VERSION and again["points_sha256"] == doc_digest(doc)


def doc_digest(doc: dict) -> str:  # type: ignore[type-arg]
    text = json.dumps(doc["points"], sort_keys=True, separators=(",", ":"))
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


def _multi_rank_csv(path: Path, tp: int, dp: int, skew: float = 0.1) -> None:
    """A Zeus/Merak-style profile: every (stage, op, clock) once per (dp, tp) rank; rank k's
    time is the truth times (1 + skew*k/(n-1)) and its energy the truth times (1 - skew/2 + ...)."""
    lines = ["rank,dp_rank,pp_rank,tp_rank,stage,instruction,frequency,time,energy"]
    n = tp * dp
    for (stage, kind), op in A100.ops.items():
        for o in op.options:
            for k in range(n):
                d, t = divmod(k, tp)
                f = k / (n - 1) if n > 1 else 0.0
                rank = stage * n + k
                lines.append(
                    f"{rank},{d},{stage},{t},{stage},{kind.profile_name},{o.freq_mhz},"
                    f"{o.time_s * (1 + skew * f)!r},{o.energy_j * (1 + skew * (f - 0.5))!r}"
                )
    path.write_text("\n".join(lines) + "\n")


def test_multi_rank_csv_aggregates_max_time_mean_energy(tmp_path: Path) -> None:
    path = tmp_path / "merak.csv"
    _multi_rank_csv(path, tp=2, dp=2)
    prof = read_profile(path)
    assert prof.num_stages == A100.num_stages
    for key, op in A100.ops.items():
        got = prof.ops[key]
        for a, b in zip(op.options, got.options, strict=True):
            assert b.freq_mhz == a.freq_mhz
            assert b.time_s == pytest.approx(a.time_s * 1.1)  # the slowest rank
            assert b.energy_j == pytest.approx(a.energy_j)  # the mean over ranks


def test_multi_rank_csv_single_rank_per_stage_equals_plain(tmp_path: Path) -> None:
    path = tmp_path / "pp.csv"
    _multi_rank_csv(path, tp=1, dp=1, skew=0.0)
    assert read_profile(path).sha256 == A100.sha256


def test_multi_rank_csv_missing_rank_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "merak.csv"
    _multi_rank_csv(path, tp=2, dp=1)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    with pytest.raises(ProfileError, match=r"merak\.csv: stage 0 .* no row for rank"):
        read_profile(path)
