"""A bounded fuzz campaign: every mutant decomposes cleanly or is rejected with a
DecomposerError; none crashes or hangs. scripts/fuzz.py runs the long campaign."""

from __future__ import annotations

from fuzz import campaign, make_mutants


def test_mutants_are_reproducible():
    assert make_mutants(50, seed=7) == make_mutants(50, seed=7)


def test_bounded_campaign_has_no_crash_or_hang():
    counts, problems = campaign(count=400, seed=2026, timeout=20.0)
    print(dict(counts))
    assert counts["mutants"] == 400
    assert counts["crash"] == 0 and counts["hang"] == 0, problems[:5]
    # The campaign is only meaningful if it exercises both outcomes.
    assert counts["decomposed"] > 10 and counts["rejected"] > 10
