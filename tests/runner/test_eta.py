"""The ETA weighs each remaining unit by what its kind (task, full or evicting arm) has cost so far, and
a kind not seen yet by its tokens at the pace of its arm kind: fed known unit times, it gives the sums."""

from __future__ import annotations

import pytest

from kvbench.runner.eta import Eta, UnitKind

PASSKEY_FULL = UnitKind("passkey", evicts=False, tokens=1024)
PASSKEY_EVICTING = UnitKind("passkey", evicts=True, tokens=1024)
FIDELITY_FULL = UnitKind("fidelity", evicts=False, tokens=512)
FIDELITY_EVICTING = UnitKind("fidelity", evicts=True, tokens=512)


def test_nothing_is_known_before_a_unit_finishes() -> None:
    eta = Eta([PASSKEY_FULL, PASSKEY_EVICTING])
    assert eta.left() is None
    eta.skipped(PASSKEY_FULL)  # stored already: it costs nothing and says nothing of the pace
    assert eta.left() is None


def test_each_remaining_unit_costs_its_kinds_mean() -> None:
    """Two cheap full units and a costly evicting one done, three evicting ones left: 3 × 100 s, where one
    pace for all units (114 s over 3 units) would say 114 s."""
    eta = Eta([PASSKEY_FULL] * 2 + [PASSKEY_EVICTING] * 4)
    for kind, seconds in [(PASSKEY_FULL, 6.0), (PASSKEY_FULL, 8.0), (PASSKEY_EVICTING, 100.0)]:
        eta.finished(kind, seconds)
    assert eta.left() == pytest.approx(300.0)
    eta.finished(PASSKEY_EVICTING, 140.0)  # the mean moves with every unit: (100 + 140) / 2 each
    assert eta.left() == pytest.approx(240.0)


def test_a_kind_not_seen_yet_costs_its_tokens_at_its_arm_kinds_pace() -> None:
    """One evicting passkey unit of 1024 tokens took 102.4 s: 0.1 s a token for evicting arms. An evicting
    fidelity unit (512 tokens) is then 51.2 s; a full unit, while no full arm has run, 0.1 s a token too."""
    eta = Eta([PASSKEY_EVICTING] * 2 + [FIDELITY_EVICTING] * 2 + [FIDELITY_FULL, PASSKEY_FULL])
    eta.finished(PASSKEY_EVICTING, 102.4)
    assert eta.left() == pytest.approx(102.4 + 2 * 51.2 + 51.2 + 102.4)
    # a full passkey unit of 1024 tokens took 10.24 s: full arms run at 0.01 s a token from now on
    eta.finished(PASSKEY_FULL, 10.24)
    assert eta.left() == pytest.approx(102.4 + 2 * 51.2 + 5.12)
    eta.finished(FIDELITY_EVICTING, 30.0)  # seen now: its own mean replaces the prior
    assert eta.left() == pytest.approx(102.4 + 30.0 + 5.12)


def test_the_estimate_follows_the_wall_clock_of_units_run_side_by_side() -> None:
    """Two workers: 40 s of unit time in 20 s of wall time, so the 3 units left (20 s each) take 30 s."""
    eta = Eta([FIDELITY_FULL] * 5)
    eta.finished(FIDELITY_FULL, 20.0)
    eta.finished(FIDELITY_FULL, 20.0)
    assert eta.left() == pytest.approx(60.0)
    assert eta.left(wall=20.0) == pytest.approx(30.0)


def test_a_unit_not_planned_leaves_the_others_as_they_were() -> None:
    eta = Eta([FIDELITY_FULL] * 2)
    eta.finished(FIDELITY_FULL, 4.0)
    eta.skipped(PASSKEY_FULL)
    assert eta.left() == pytest.approx(4.0)
    eta.skipped(FIDELITY_FULL)
    assert eta.left() == 0.0


def test_before_any_unit_finishes_earlier_runs_paces_give_the_time() -> None:
    """Stored: an evicting passkey unit took 100 s for 1024 tokens and a full fidelity unit 5 s for 512. A
    run of 2 evicting passkey units, 1 full fidelity unit and 1 evicting fidelity unit (no pace of its own:
    the evicting arms' stored 100 s per 1024 tokens, 50 s for 512) is 200 + 5 + 50 s before it starts."""
    prior = {("passkey", True): (100.0, 1024.0), ("fidelity", False): (5.0, 512.0)}
    eta = Eta([PASSKEY_EVICTING] * 2 + [FIDELITY_FULL, FIDELITY_EVICTING], prior)
    assert eta.from_prior()
    assert eta.left() == pytest.approx(255.0)
    eta.finished(PASSKEY_EVICTING, 60.0)  # this run's own pace replaces the stored one for its kind
    assert not eta.from_prior()
    assert eta.left() == pytest.approx(60.0 + 5.0 + 30.0)


def test_a_kind_with_no_pace_here_or_stored_leaves_the_time_unknown() -> None:
    eta = Eta([PASSKEY_EVICTING, FIDELITY_FULL], {("passkey", True): (100.0, 0.0)})
    assert eta.left() is None  # the full arm has no pace, and the stored one has no tokens to scale by
