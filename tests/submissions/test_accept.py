"""`kvbench accept`: the genuine bundle lands on the board; each forgery is refused by the rule it breaks,
and nothing is written; `kvbench withdraw` takes a submission back."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
import yaml
from submitting import cells, cli, run_of
from tampering import (
    add_symlink,
    add_text,
    edit_cell,
    edit_manifest,
    edit_samples,
    forged,
    reidentified,
)

from kvbench.leaderboard import queries
from kvbench.store.board_tables import board_run_id
from kvbench.submissions.board import recomputed_folder
from kvbench.submissions.publish import record
from kvbench.submissions.recompute import RECOMPUTED, Outcome


def test_the_genuine_bundle_is_accepted_pending_and_scored_nowhere(submission: Path, tmp_path: Path) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    db = tmp_path / "board.duckdb"
    done = cli("accept", str(bundle), "--db", str(db), "--by", "maintainer", cwd=tmp_path)
    sha = _sha256(bundle)
    assert f"accepted {sha[:16]}: 9 runs, 42 samples, pending" in done.stdout, done.stdout
    assert f"`kvbench verify {sha[:16]} --db {db}`" in " ".join(done.stdout.split())
    ids = {c["run_id"] for c in cells(bundle)}
    assert len(ids) == 9  # the policy, the null and the full cache on passkey, fidelity and gpqa-diamond
    snapshot = tmp_path / "board.snapshot.duckdb"
    with duckdb.connect(str(snapshot), read_only=True) as con:
        # each run waits under the board's own id (its identity, then its submission's), with its claim
        found = con.execute("SELECT identity, run_id, state, claimed_outputs FROM submission_runs").fetchall()
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM samples").fetchone() == (0,)
        submitter, by, withdrawn = con.execute(
            "SELECT submitter, accepted_by, withdrawn_at FROM submissions"
        ).fetchone()
    assert {(i, r, s) for i, r, s, _ in found} == {(i, board_run_id(i, sha), "pending") for i in ids}
    claims = {c["run_id"]: c["output_digest"] for c in cells(bundle)}
    assert {i: claimed for i, _, _, claimed in found} == claims
    assert (submitter, by, withdrawn) == ("tests <t@example.org>", "maintainer", None)
    table = queries.leaderboard(snapshot, "tiny-qwen3", "protect-prompt", queries.Compression(4.0, None))
    assert table.frame.empty
    (pending,) = queries.trust_notices(snapshot).pending.itertuples()
    assert (pending.bundle, pending.pending, pending.runs) == (sha[:12], 9, 9)
    assert (tmp_path / "submissions" / f"{sha}.tar.gz").is_file()


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _drop_run(run_id: str):
    def edit(folder: Path) -> None:
        shutil.rmtree(folder / "runs" / run_id)
        manifest = json.loads((folder / "bundle.json").read_text())
        manifest["cells"] = [c for c in manifest["cells"] if c["run_id"] != run_id]
        (folder / "bundle.json").write_text(json.dumps(manifest))

    return edit


def _edit_score(run_id: str):
    return lambda folder: edit_samples(folder, run_id, lambda row: row.update(metric=1.0, correct=True))


def _add_private_text(run_id: str):
    return lambda folder: edit_samples(
        folder, run_id, lambda row: row.update(output="The answer is (B) because")
    )


def _edit_suite(folder: Path) -> None:
    path = folder / "suites" / "quick.yaml"
    suite = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**suite, "limit": 1}))


def _edit_scorer(folder: Path) -> None:
    path = folder / "scorers" / "keys-norm.py"
    path.write_text(path.read_text().replace("norm(dim=-1)", "norm(dim=-1) * 0 + 1"))


def _gpqa_made_public(bundle: Path):
    def edit(folder: Path) -> None:
        for arm in ("snapkv", "random", "full"):
            run_id = run_of(bundle, "gpqa-diamond", arm)
            edit_manifest(folder, run_id, lambda run: run["spec"]["task"].update(visibility="public"))
            edit_samples(folder, run_id, lambda row: row.update(output="The answer is (B) because"))
        reidentified(folder)

    return edit


def _spec_edited(bundle: Path, task: str, change):
    """Every run of one task with its spec changed by ``change``, identities and digests following, as a
    forger would: the policy, its null and its full cache stay a consistent family."""

    def edit(folder: Path) -> None:
        for arm in ("keys-norm", "random", "full"):
            edit_manifest(folder, run_of(bundle, task, arm), lambda run: change(run["spec"]))
        reidentified(folder)

    return edit


def _alias_bomb(folder: Path) -> None:
    """A "billion laughs": nine levels of ten aliases each, a billion elements once expanded (a 30 kB
    bundle held accept for minutes and GBs while its error message printed the list)."""
    path = folder / "protocols" / "protect-prompt.yaml"
    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    path.write_text(path.read_text() + "\n".join(levels) + "\n")


def _claim_ratio_32(spec: dict) -> None:
    spec["n_avg"] = 32.0 * spec["budget"] if spec["budget"] else 8192.0
    if spec["ratio"] is not None:
        spec["ratio"] = 32.0


def _forged_null(run_id: str):
    def edit(folder: Path) -> None:
        edit_manifest(folder, run_id, lambda run: run.update(role="null"))
        edit_cell(folder, run_id, lambda cell: cell.update(role="null"))

    return edit


def _edit_protocol(folder: Path) -> None:
    path = folder / "protocols" / "protect-prompt.yaml"
    path.write_text(path.read_text().replace("buffer: 64", "buffer: 32"))


def _drop_a_sample(run_id: str):
    def edit(folder: Path) -> None:
        shard = sorted((folder / "runs" / run_id).glob("*.parquet"))[0]
        table = pq.read_table(shard)
        pq.write_table(table.slice(1), shard)

    return edit


def _edit_without_redigest(run_id: str):
    return lambda folder: edit_samples(folder, run_id, lambda row: row.update(generated_tokens=99))


FORGERIES = {
    # name: (the edit, forgery options, the rules that refuse it, the member (or run) they name)
    "an edited score": (
        lambda b: _edit_score(run_of(b, "passkey", "keys-norm")),
        {},
        {"output-digest"},
        lambda b: f"runs/{run_of(b, 'passkey', 'keys-norm')}",
    ),
    "a missing null arm": (
        lambda b: _drop_run(run_of(b, "fidelity", "random")),
        {},
        {"baselines"},
        lambda b: f"runs/{run_of(b, 'fidelity', 'keys-norm')}",
    ),
    "GPQA text added": (
        lambda b: _add_private_text(run_of(b, "gpqa-diamond", "snapkv")),
        {"output_digests": True},
        {"private-text"},
        lambda b: f"runs/{run_of(b, 'gpqa-diamond', 'snapkv')}",
    ),
    "a wrong suite hash": (lambda b: _edit_suite, {}, {"suite"}, lambda b: "suites/quick.yaml"),
    "a changed scorer source": (lambda b: _edit_scorer, {}, {"scorer"}, lambda b: "scorers/keys-norm.py"),
    "GPQA made public (identities recomputed)": (
        _gpqa_made_public,
        {"output_digests": True},
        {"identity"},
        lambda b: "runs/",
    ),
    "a policy run passed off as the null": (
        lambda b: _forged_null(run_of(b, "passkey", "keys-norm")),
        {},
        {"identity"},
        lambda b: f"runs/{run_of(b, 'passkey', 'keys-norm')}",
    ),
    "other seeds for the null": (
        lambda b: (
            lambda folder: edit_samples(
                folder, run_of(b, "passkey", "random"), lambda row: row.update(seed=row["seed"] + 1)
            )
        ),
        {},
        {"seeds", "baselines"},
        lambda b: f"runs/{run_of(b, 'passkey', 'random')}",
    ),
    "an edited protocol": (
        lambda b: _edit_protocol,
        {},
        {"protocol"},
        lambda b: "protocols/protect-prompt.yaml",
    ),
    "a sample dropped": (
        lambda b: _drop_a_sample(run_of(b, "gpqa-diamond", "random")),
        {"output_digests": True},
        {"sample-counts", "baselines"},
        lambda b: f"runs/{run_of(b, 'gpqa-diamond', 'random')}",
    ),
    "a malformed secondary field": (
        lambda b: (
            lambda folder: edit_samples(
                folder, run_of(b, "passkey", "random"), lambda row: row.update(secondary="not json")
            )
        ),
        {},
        {"sample-counts", "output-digest", "baselines"},
        lambda b: f"runs/{run_of(b, 'passkey', 'random')}",
    ),
    "an edit without new digests": (
        lambda b: _edit_without_redigest(run_of(b, "passkey", "random")),
        {"member_digests": False},
        {"digest", "output-digest"},
        lambda b: f"runs/{run_of(b, 'passkey', 'random')}",
    ),
    "a built-in task edited under its own name": (
        lambda b: _spec_edited(b, "fidelity", lambda spec: spec["task"]["source"].update(length=64)),
        {"output_digests": True},
        {"known-spec"},
        lambda b: "runs/",
    ),
    "a built-in model with another source": (
        lambda b: _spec_edited(b, "passkey", lambda spec: spec["model"]["source"].update(seed=1)),
        {"output_digests": True},
        {"known-spec"},
        lambda b: "runs/",
    ),
    # K kept, every run listed as 32 times smaller than it is: an N_avg of 32 K that K = N_avg/32 follows
    "an N_avg and a ratio that put K under another compression": (
        lambda b: _spec_edited(b, "passkey", _claim_ratio_32),
        {"output_digests": True},
        {"budget"},
        lambda b: "runs/",
    ),
    "a ratio that K does not follow": (
        lambda b: _spec_edited(
            b, "passkey", lambda spec: spec["ratio"] and spec.update(ratio=spec["ratio"] * 8)
        ),
        {"output_digests": True},
        {"budget"},
        lambda b: "runs/",
    ),
    # K = N_avg/3.9999999 is K = N_avg/4: the board would show it as "4x", a second table under that label
    "a ratio that a board shows as another": (
        lambda b: _spec_edited(b, "passkey", lambda spec: spec["ratio"] and spec.update(ratio=3.9999999)),
        {"output_digests": True},
        {"budget"},
        lambda b: "runs/",
    ),
    "an alias bomb in the shipped protocol": (
        lambda b: _alias_bomb,
        {},
        {"protocol"},
        lambda b: "protocols/protect-prompt.yaml",
    ),
    "a limit far past the problems held": (
        lambda b: _spec_edited(b, "passkey", lambda spec: spec.update(limit=1_000_000)),
        {"output_digests": True},
        {"sample-counts"},
        lambda b: "runs/",
    ),
    "a run that does not state its problems": (
        lambda b: _spec_edited(b, "passkey", lambda spec: spec.update(limit=None)),
        {"output_digests": True},
        {"sample-counts"},
        lambda b: "runs/",
    ),
    "a ../ member": (
        lambda b: lambda folder: None,
        # from the extraction folder (TMPDIR/tmpXXXX/members) four steps up is the test's own folder
        {"extra": lambda archive: add_text(archive, "runs/../../../../escaped.txt", b"x")},
        {"member-path"},
        lambda b: "runs/../../../../escaped.txt",
    ),
    "a symlink": (
        lambda b: lambda folder: None,
        {"extra": lambda archive: add_symlink(archive, "suites/link.yaml", "/etc/passwd")},
        {"member-link"},
        lambda b: "suites/link.yaml",
    ),
}


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_each_forgery_is_refused_by_its_rule_and_nothing_is_written(
    submission: Path, tmp_path: Path, forgery: str
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    make_edit, options, rules, named = FORGERIES[forgery]
    forged_bundle = forged(bundle, tmp_path / "forged.tar.gz", make_edit(bundle), **options)
    db = tmp_path / "board.duckdb"
    (tmp_path / "tmp").mkdir()
    done = cli(
        "accept", str(forged_bundle), "--db", str(db), cwd=tmp_path, check=False, tmpdir=tmp_path / "tmp"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    failures = [line.strip() for line in done.stdout.splitlines() if line.startswith("  ")]
    # one line per failure, "member: [rule] why"; the forgery breaks its rules and no other
    found = {line.split("[", 1)[1].split("]", 1)[0] for line in failures}
    assert found == rules, done.stdout
    assert any(line.startswith(named(bundle)) for line in failures), done.stdout
    assert not db.exists() and not (tmp_path / "board.snapshot.duckdb").exists()
    assert not (tmp_path / "escaped.txt").exists()


def test_the_forgeries_cover_the_rules_the_issue_names() -> None:
    covered = set().union(*(rules for _, _, rules, _ in FORGERIES.values()))
    assert {
        "output-digest",
        "baselines",
        "private-text",
        "suite",
        "member-path",
        "member-link",
        "scorer",
    } <= covered


def test_a_withdrawn_submission_leaves_the_board_and_cannot_come_back(
    submission: Path, tmp_path: Path
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    db = tmp_path / "board.duckdb"
    cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    digest = _sha256(bundle)
    done = cli("withdraw", digest[:10], "--db", str(db), "--reason", "wrong model revision", cwd=tmp_path)
    assert f"withdrew {digest[:16]}: 0 run(s) removed" in done.stdout  # pending: none was published
    with duckdb.connect(str(tmp_path / "board.snapshot.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM submission_runs").fetchone() == (9,)
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM samples").fetchone() == (0,)
        reason, withdrawn = con.execute("SELECT withdrawn_reason, withdrawn_at FROM submissions").fetchone()
    assert reason == "wrong model revision" and withdrawn is not None
    again = cli("accept", str(bundle), "--db", str(db), cwd=tmp_path, check=False)
    assert again.returncode == 2 and "already withdrawn" in again.stderr
    # given as a file, verify refuses it before computing anything (it used to compute every run first)
    verify = cli("verify", str(bundle), "--db", str(db), "--quiet", cwd=tmp_path, check=False)
    assert verify.returncode == 2 and f"submission {digest[:16]} was withdrawn" in verify.stderr
    assert "re-computing" not in verify.stdout and not list((tmp_path / "submissions").glob("*.recomputed"))


BOARD = {
    "runs": "SELECT * FROM runs ORDER BY ALL",
    "samples": "SELECT run_id, problem_id, sample, metric FROM samples ORDER BY ALL",
    "submissions": "SELECT * FROM submissions ORDER BY ALL",
    "submission_runs": "SELECT * FROM submission_runs ORDER BY ALL",
}


def _board(database: Path) -> dict[str, list[tuple]]:
    """Everything a board holds, table by table."""
    with duckdb.connect(str(database), read_only=True) as con:
        return {table: con.execute(query).fetchall() for table, query in BOARD.items()}


def _truncate(database: Path) -> None:
    """Every block after DuckDB's three headers gone: the catalog and the data with them."""
    with database.open("r+b") as handle:
        handle.truncate(3 * 4096)


def _published(db: Path, bundle: Path, digest: str, run_id: str) -> None:
    """One run of the bundle recorded as re-computed here: its files copied where `kvbench verify --db`
    computes (what it computed on this machine is what the submitter computed on this machine), and
    recorded as that command records it."""
    with tarfile.open(bundle) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(f"runs/{run_id}/")]
        archive.extractall(tmp := db.parent / "unpacked", members=members, filter="data")
    shards = recomputed_folder(db, digest) / "shards"
    shards.mkdir(parents=True)
    shutil.move(tmp / "runs" / run_id, shards / run_id)
    outcome = Outcome(run_id, "cell", RECOMPUTED, "matches", 3, 3, 1.0, "", run_id, "d", {"cpu": "c"})
    assert record(db, digest, [outcome]) == [board_run_id(run_id, digest)]


def test_a_damaged_board_is_named_and_rebuilt_from_its_bundles(submission: Path, tmp_path: Path) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    db = tmp_path / "board" / "kvbench.duckdb"
    cli("accept", str(bundle), "--db", str(db), "--by", "maintainer", cwd=tmp_path)
    digest = _sha256(bundle)
    _published(db, bundle, digest, run_of(bundle, "passkey", "keys-norm"))
    before = _board(db)
    assert len(before["runs"]) == 1 and len(before["samples"]) == 3
    _truncate(db)
    fix = f"`kvbench accept --rebuild --db {db}`"
    for args in (["withdraw", digest[:10], "--reason", "r"], ["accept", str(bundle)]):
        refused = cli(*args, "--db", str(db), cwd=tmp_path, check=False)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.startswith(f"kvbench: {db} cannot be read: it is damaged"), refused.stderr
        assert fix in refused.stderr and "Traceback" not in refused.stderr
    rebuilt = cli("accept", "--rebuild", "--db", str(db), cwd=tmp_path)
    assert "from 1 accepted bundle(s) (0 withdrawn): 1 runs" in rebuilt.stdout
    assert _board(db) == before  # who accepted it and when, each run's state, the published run's samples
    assert _board(db.with_name("kvbench.snapshot.duckdb")) == before
    cli("withdraw", digest[:10], "--db", str(db), "--reason", "wrong model revision", cwd=tmp_path)
    withdrawn = _board(db)
    db.unlink()  # even with no database at all
    cli("accept", "--rebuild", "--db", str(db), cwd=tmp_path)
    assert _board(db) == withdrawn and withdrawn["runs"] == []
    assert withdrawn["submissions"][0][-1] == "wrong model revision"


def test_a_board_from_before_runs_were_scoped_is_refused_with_how_to_rebuild_it(tmp_path: Path) -> None:
    """A board whose submission_runs has no identity column (an earlier kvbench stored each run once for
    every submission holding it) is never written to: the error says how to rebuild it."""
    from kvbench.errors import PrerequisiteError
    from kvbench.submissions.withdraw import withdraw

    database = tmp_path / "board.duckdb"
    with duckdb.connect(str(database)) as con:
        con.execute("CREATE TABLE submission_runs (bundle_sha256 VARCHAR, run_id VARCHAR)")
    with pytest.raises(PrerequisiteError, match=r"written by an earlier kvbench.*accept --rebuild"):
        withdraw(database, "0" * 8, "superseded")
