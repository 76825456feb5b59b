"""A bundle whose runs carry a policy name @kvbench.policy would refuse (one made by a kvbench without the
rule, or edited) is refused by the bundle rules (``policy-name``), and the refusal prints the name by its
escapes."""

from __future__ import annotations

from pathlib import Path

import pytest
from submitting import cli, run_of
from tampering import edit_manifest, forged, reidentified

HOSTILE = "x\x1b]0;pwned\x07\x1b[2J"


def _documented_as(run_id: str):
    """The run's policy documentation names another policy (it is outside the run's identity)."""
    return lambda folder: edit_manifest(folder, run_id, lambda run: run["policy_doc"].update(name=HOSTILE))


def _renamed(run_ids: list[str]):
    """The scorer's runs under the hostile name, their identities recomputed, as a submitter whose kvbench
    took any name would have made them."""

    def edit(folder: Path) -> None:
        for run_id in run_ids:

            def rename(run: dict) -> None:
                run["spec"]["policy"]["name"] = run["policy_doc"]["name"] = HOSTILE

            edit_manifest(folder, run_id, rename)
        reidentified(folder)

    return edit


FORGERIES = {
    # name: (the edit, the rules that refuse it, the member the policy-name failure names)
    "a hostile name in the policy documentation": (
        lambda b: _documented_as(run_of(b, "passkey", "keys-norm")),
        {"policy-name", "text"},  # the escape sequences in a name break the text rule too
        lambda b: f"runs/{run_of(b, 'passkey', 'keys-norm')}/manifest.json: ",
    ),
    # its scorer member would be scorers/<name>.py, which no bundle may hold: the scorer rule fails too
    "a hostile name in the runs' specs": (
        lambda b: _renamed([run_of(b, task, "keys-norm") for task in ("passkey", "fidelity")]),
        {"policy-name", "scorer", "text"},
        lambda b: "runs/",  # under the identities the renamed specs hash to
    ),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_a_bundle_carrying_a_name_outside_the_rule_is_refused(
    submission: Path, tmp_path: Path, forgery: str
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    make_edit, rules, member = FORGERIES[forgery]
    bad = forged(bundle, tmp_path / "named.tar.gz", make_edit(bundle), output_digests=True)
    db = tmp_path / "board.duckdb"
    done = cli("accept", str(bad), "--db", str(db), cwd=tmp_path, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    failures = [line.strip() for line in done.stdout.splitlines() if line.startswith("  ")]
    assert {line.split("[", 1)[1].split("]", 1)[0] for line in failures} == rules, done.stdout
    named = [line for line in failures if "[policy-name]" in line]
    assert named and all(line.startswith(member(bundle)) for line in named), named
    assert all(r"policy name 'x\x1b]0;pwned\x07\x1b[2J' is not allowed" in line for line in named), named
    assert "\x1b" not in done.stdout + done.stderr
    assert not db.exists()
