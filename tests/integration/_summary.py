"""The checks on an example's ``--summary`` (train_pipeline.py's format) that the end-to-end
emulation tests share."""

from __future__ import annotations


def check_errors(s: dict) -> None:
    """Every measured time and energy within 2 % of its prediction; a failure shows the run's
    host overruns (a late host, not the plan)."""
    for key, value in s["errors"].items():
        context = (s["predicted"], s["measured"], s["allmax"], s.get("overruns"))
        assert abs(value) <= 0.02, (key, value, *context)


def check_summary(s: dict) -> None:
    """The one check every example's summary passes."""
    assert set(s["predicted"]) == {"time_s", "energy_j"}
    assert set(s["allmax"]) == {"predicted", "measured"}
    check_errors(s)
    saving = s["saving"]
    assert saving["predicted"] > 0.03  # the fastest plan removes real intrinsic bloat
    assert abs(saving["measured"] - saving["predicted"]) <= 0.01, saving
