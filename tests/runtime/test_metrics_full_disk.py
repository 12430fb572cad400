"""A disk that fills during a run leaves the metrics files ending with a whole record."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The file size limit fails a write past it as a full disk does, after writing what fits (a
# record cut in the middle); SIGXFSZ is ignored so that the write fails instead of the process.
_RUN = textwrap.dedent(
    """
    import logging, resource, signal, sys, warnings
    from pathlib import Path
    from perseus import MetricsSink, RankSession, SimulatedGPU, make_job
    from perseus.io import load_profile
    from perseus.runtime.emulation import scale_profile, take_stages
    from perseus.runtime.session import SessionOptions
    from perseus.schedule import build_schedule

    warnings.simplefilter("ignore")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    tmp, limit = Path(sys.argv[1]), int(sys.argv[2])
    profile = scale_profile(take_stages(load_profile("a100"), 1), 0.1)
    gpu = SimulatedGPU.from_profile(profile, blocking_power_w=83.64, state_dir=tmp / "sim",
                                    set_latency_s=0.0)
    job = make_job(profile, "1f1b", 1, 4, blocking_power_w=83.64)
    session = RankSession(build_schedule("1f1b", 1, 4), 0, gpu=gpu,
                          plan=job.frontier([job.point(job.allmax())]),
                          options=SessionOptions(blocking_power_w=83.64, watchdog=False,
                                                 handle_signals=False))
    sink = MetricsSink(session, jsonl=tmp / "m.jsonl", csv=tmp / "m.csv")
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    with session, sink:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
        for _ in range(12):
            with session.iteration():
                for action in session.schedule.rank_actions[0]:
                    with session.op(action):
                        pass
    print(len(session.history))
    """
)


@pytest.mark.parametrize("limit", [1500, 2600])
def test_a_disk_that_fills_mid_record_leaves_whole_records(tmp_path: Path, limit: int) -> None:
    """The record being written when the disk filled was left cut in the middle (a JSON line
    that no reader parses); now the file is cut back to the last whole record."""
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(tmp_path), str(limit)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["12"]  # the run went on
    assert proc.stderr.count("metrics files: cannot write") == 1, proc.stderr
    jsonl = (tmp_path / "m.jsonl").read_text()
    assert 0 < len(jsonl) <= limit and jsonl.endswith("\n"), jsonl[-80:]
    records = [json.loads(line) for line in jsonl.splitlines()]
    assert [r["iteration"] for r in records] == list(range(len(records)))
    table = (tmp_path / "m.csv").read_text()
    assert table.endswith("\n"), table[-80:]
    rows = list(csv.reader(table.splitlines()))
    assert len({len(row) for row in rows}) == 1 and len(rows) == len(records) + 1
