from __future__ import annotations

import json

import pytest

from perseus.errors import InfeasibleError, PlanError
from perseus.io import load_profile, read_frontier, write_frontier
from perseus.job import make_job


@pytest.fixture(scope="module")
def job():
    return make_job(load_profile("a100"), "1f1b", 8, 4, blocking_power_w=83.64, profile_name="a100")


def _clock_plan(job, freq):
    flat = job.allmax().copy()
    flat[:] = freq
    return job.point(flat)


def test_round_trip_and_shape(tmp_path, job):
    points = [job.point(job.allmax()), _clock_plan(job, 1200), _clock_plan(job, 1050)]
    frontier = job.frontier(points)
    path = tmp_path / "f.json"
    write_frontier(frontier, path)
    again = read_frontier(path)
    assert again.model_copy(update={"points_sha256": None}) == frontier
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 3
    assert len(doc["points_sha256"]) == 64
    assert doc["stage_ops"][0][:3] == ["F0", "F1", "F2"]
    assert len(doc["points"][0]["freqs_mhz"][7]) == 8
    assert [p["time_s"] for p in doc["points"]] == sorted(p["time_s"] for p in doc["points"])


def test_write_refuses_what_read_refuses(tmp_path, job, monkeypatch):
    """What write_frontier writes, read_frontier reads: a frontier over the read limit (a job
    near the 1M-op maximum: ~5 bytes per op per point, so ~13 points fit in 64 MB) is refused
    in one line before anything is written, not written and then refused on read."""
    from perseus.io import frontier_files

    frontier = job.frontier([job.point(job.allmax()), _clock_plan(job, 1200)])
    fits = tmp_path / "fits.json"
    write_frontier(frontier, fits)
    size = fits.stat().st_size
    monkeypatch.setattr(frontier_files, "MAX_FILE_BYTES", size)
    write_frontier(frontier, tmp_path / "again.json")
    assert read_frontier(tmp_path / "again.json").points == frontier.points
    monkeypatch.setattr(frontier_files, "MAX_FILE_BYTES", size - 1)
    with pytest.raises(PlanError, match=r"more than perseus reads back") as e:
        write_frontier(frontier, tmp_path / "big.json")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{tmp_path / 'big.json'}: ")
    assert "2 points x 64 ops" in msg and "nothing was written" in msg
    assert not (tmp_path / "big.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again.json", "fits.json"]
    with pytest.raises(PlanError, match=r"larger than \d+ bytes, the most perseus reads"):
        read_frontier(fits)


def test_pick(job):
    frontier = job.frontier(
        [job.point(job.allmax()), _clock_plan(job, 1200), _clock_plan(job, 1080)]
    )
    assert frontier.cheapest_within(frontier.fastest.time_s) == frontier.fastest
    assert frontier.cheapest_within(1e9) == frontier.min_energy
    with pytest.raises(InfeasibleError, match="fastest takes"):
        frontier.cheapest_within(frontier.fastest.time_s * 0.5)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d.update(schema_version=4), "field schema_version"),
        (lambda d: d.update(schema_version=2), "field points_sha256: missing"),
        (lambda d: d.update(schema_version=3), "field points_sha256: missing"),
        (lambda d: d["job"].pop("ranks"), "field job.ranks"),
        # read_frontier itself checks that the job describes stage_ops, for every reader
        (lambda d: d["job"].update(microbatches=5), "stage_ops"),
        (lambda d: d["points"][0]["freqs_mhz"][0].pop(), "freqs_mhz does not fit stage_ops"),
        (lambda d: d["points"].reverse(), "sorted by time_s"),
        (lambda d: d.update(code="__import__('os')"), "field code: Extra inputs"),
        (lambda d: d["points"][0].update(time_s=-1), r"field points\.0\.time_s"),
    ],
)
def test_bad_frontier_files(tmp_path, job, mutate, match):
    frontier = job.frontier([job.point(job.allmax()), _clock_plan(job, 1200)])
    doc = json.loads(frontier.model_dump_json())
    doc["schema_version"] = 1
    doc.pop("points_sha256")
    mutate(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlanError, match=match):
        read_frontier(path)


def test_empty_and_missing(tmp_path):
    (tmp_path / "e.json").write_text("")
    with pytest.raises(PlanError, match="empty"):
        read_frontier(tmp_path / "e.json")
    with pytest.raises(PlanError, match="not found"):
        read_frontier(tmp_path / "x.json")


def test_check_job_rejects_other_jobs(job):
    frontier = job.frontier([job.point(job.allmax())])
    other = make_job(load_profile("a100"), "gpipe", 8, 4, blocking_power_w=83.64)
    with pytest.raises(PlanError, match=r"job\.schedule: plan has '1f1b', run has 'gpipe'"):
        other.check_frontier(frontier)
