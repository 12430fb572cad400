"""The corpus covers at least 200 malformed inputs, each with its own id."""

from __future__ import annotations

from . import test_flags, test_plan_files, test_profiles_configs


def test_corpus_is_large_and_ids_unique() -> None:
    cases = test_flags.CASES + test_profiles_configs.CASES + test_plan_files.CASES
    assert len(cases) >= 200
    assert len({c.id for c in cases}) == len(cases), "duplicate case ids"
