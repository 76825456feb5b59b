"""`kvbench accept`: the genuine bundle lands on the board; each forgery is refused by the rule it breaks,
and nothing is written; `kvbench withdraw` takes a submission back."""

from __future__ import annotations

import json
import shutil
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
from kvbench.submissions.board import record_verification


def test_the_genuine_bundle_is_accepted_and_its_scores_reach_the_board(
    submission: Path, tmp_path: Path
) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    db = tmp_path / "board.duckdb"
    done = cli("accept", str(bundle), "--db", str(db), "--by", "maintainer", cwd=tmp_path)
    assert "accepted" in done.stdout
    ids = {c["run_id"] for c in cells(bundle)}
    assert len(ids) == 9  # the policy, the null and the full cache on passkey, fidelity and gpqa-diamond
    sha = _sha256(bundle)
    policy_run = board_run_id(run_of(bundle, "passkey", "keys-norm"), sha)
    with duckdb.connect(str(tmp_path / "board.snapshot.duckdb"), read_only=True) as con:
        # each run under the board's own id: its identity, then its submission's
        assert {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()} == {
            f"{i}-{sha[:12]}" for i in ids
        }
        assert {r[0] for r in con.execute("SELECT identity FROM submission_runs").fetchall()} == ids
        submitter, by, withdrawn = con.execute(
            "SELECT submitter, accepted_by, withdrawn_at FROM submissions"
        ).fetchone()
        stored = dict(
            con.execute(
                "SELECT problem_id, avg(metric) FROM samples WHERE run_id = ? GROUP BY 1", [policy_run]
            ).fetchall()
        )
        budget = con.execute("SELECT budget FROM runs WHERE run_id = ?", [policy_run])
        budget = budget.fetchone()[0]
    assert (submitter, by, withdrawn) == ("tests <t@example.org>", "maintainer", None)
    # the scores the board computes are those of the submitter's own shards, read here with pyarrow alone
    shards = (submission / "runs" / "shards" / run_of(bundle, "passkey", "keys-norm")).glob("*.parquet")
    rows = [r for s in shards for r in pq.read_table(s).to_pylist()]
    by_problem: dict[str, list[float]] = {}
    for r in rows:
        by_problem.setdefault(r["problem_id"], []).append(r["metric"])
    expected = {p: sum(v) / len(v) for p, v in by_problem.items()}
    assert stored == pytest.approx(expected)
    table = queries.leaderboard(
        tmp_path / "board.snapshot.duckdb", "tiny-qwen3", "protect-prompt", queries.Compression(4.0, None)
    )
    row = table.frame.set_index("policy").loc["keys-norm"]
    assert row["passkey"].startswith(f"{sum(expected.values()) / len(expected):.3f}")
    assert budget > 0
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
    assert f"withdrew {digest[:16]}: 9 run(s) removed" in done.stdout
    with duckdb.connect(str(tmp_path / "board.snapshot.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM samples").fetchone() == (0,)
        reason, withdrawn = con.execute("SELECT withdrawn_reason, withdrawn_at FROM submissions").fetchone()
    assert reason == "wrong model revision" and withdrawn is not None
    again = cli("accept", str(bundle), "--db", str(db), cwd=tmp_path, check=False)
    assert again.returncode == 2 and "already withdrawn" in again.stderr


BOARD = {
    "runs": "SELECT * FROM runs ORDER BY ALL",
    "samples": "SELECT run_id, problem_id, sample, metric FROM samples ORDER BY ALL",
    "submissions": "SELECT * FROM submissions ORDER BY ALL",
    "submission_runs": "SELECT * FROM submission_runs ORDER BY ALL",
    "verifications": "SELECT * FROM verifications ORDER BY ALL",
}


def _board(database: Path) -> dict[str, list[tuple]]:
    """Everything a board holds, table by table."""
    with duckdb.connect(str(database), read_only=True) as con:
        return {table: con.execute(query).fetchall() for table, query in BOARD.items()}


def _truncate(database: Path) -> None:
    with database.open("r+b") as handle:
        handle.truncate(database.stat().st_size // 2)


def test_a_damaged_board_is_named_and_rebuilt_from_its_bundles(submission: Path, tmp_path: Path) -> None:
    bundle = submission / "bundle.kvbench.tar.gz"
    db = tmp_path / "board" / "kvbench.duckdb"
    cli("accept", str(bundle), "--db", str(db), "--by", "maintainer", cwd=tmp_path)
    digest = _sha256(bundle)
    run_id = run_of(bundle, "passkey", "keys-norm")
    outcome = {"run_id": run_id, "outcome": "verified", "method": "identical outputs", "problems": 2}
    record_verification(db, digest, [{**outcome, "machine": {"cpu": "c"}, "detail": "ok", "seed": 7}])
    before = _board(db)
    _truncate(db)
    fix = f"`kvbench accept --rebuild --db {db}`"
    for args in (["withdraw", digest[:10], "--reason", "r"], ["accept", str(bundle)]):
        refused = cli(*args, "--db", str(db), cwd=tmp_path, check=False)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert refused.stderr.startswith(f"kvbench: {db} cannot be read: it is damaged"), refused.stderr
        assert fix in refused.stderr and "Traceback" not in refused.stderr
    rebuilt = cli("accept", "--rebuild", "--db", str(db), cwd=tmp_path)
    assert "from 1 accepted bundle(s) (0 withdrawn): 9 runs" in rebuilt.stdout
    assert _board(db) == before  # who accepted it and when, its runs, samples and verifications
    assert _board(db.with_name("kvbench.snapshot.duckdb")) == before
    cli("withdraw", digest[:10], "--db", str(db), "--reason", "wrong model revision", cwd=tmp_path)
    withdrawn = _board(db)
    db.unlink()  # even with no database at all
    cli("accept", "--rebuild", "--db", str(db), cwd=tmp_path)
    assert _board(db) == withdrawn and withdrawn["runs"] == []
    assert withdrawn["submissions"][0][-1] == "wrong model revision"


def test_a_verification_lands_in_its_columns_on_a_board_that_orders_them_otherwise(tmp_path: Path) -> None:
    """A board made by an earlier kvbench may hold a table's columns in another order: verifications are
    written, and kept in the submission's record, by column name."""
    from kvbench.store.ingest import SCHEMA
    from kvbench.submissions.board import SUBMISSION_TABLES, VERIFICATION_COLUMNS

    db, sha = tmp_path / "board.duckdb", "ab" * 32
    reordered = SUBMISSION_TABLES.replace(
        "bundle_sha256 VARCHAR, run_id VARCHAR, outcome VARCHAR, method VARCHAR, problems INTEGER,\n"
        "    machine JSON, verified_at DOUBLE, detail VARCHAR",
        "detail VARCHAR, verified_at DOUBLE, machine JSON, problems INTEGER, method VARCHAR,\n"
        "    outcome VARCHAR, run_id VARCHAR, bundle_sha256 VARCHAR",
    )
    assert reordered != SUBMISSION_TABLES
    with duckdb.connect(str(db)) as con:
        con.execute(SCHEMA + reordered)
        con.execute("INSERT INTO submissions (bundle_sha256, accepted_at) VALUES (?, 1.0)", [sha])
    outcome = {"run_id": "r1", "outcome": "reproduced", "method": "greedy", "problems": 3,
               "machine": {"cpu": "x"}, "detail": "3 of 3", "seed": 7}  # fmt: skip
    record_verification(db, sha, [outcome])
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("SELECT run_id, outcome, method, problems, detail FROM verifications").fetchone()
    assert row == ("r1", "reproduced", "greedy", 3, "3 of 3 (draw seed 7)")
    kept = json.loads((tmp_path / "submissions" / f"{sha}.json").read_text())["verifications"]
    assert dict(zip(VERIFICATION_COLUMNS.split(", "), kept[0], strict=True))["outcome"] == "reproduced"


def test_a_board_from_before_runs_were_scoped_is_refused_with_how_to_rebuild_it(tmp_path: Path) -> None:
    """A board whose submission_runs has no identity column (an earlier kvbench stored each run once for
    every submission holding it) is never written to: the error says how to rebuild it."""
    from kvbench.errors import PrerequisiteError
    from kvbench.submissions.board import withdraw

    database = tmp_path / "board.duckdb"
    with duckdb.connect(str(database)) as con:
        con.execute("CREATE TABLE submission_runs (bundle_sha256 VARCHAR, run_id VARCHAR)")
    with pytest.raises(PrerequisiteError, match=r"written by an earlier kvbench.*accept --rebuild"):
        withdraw(database, "0" * 8, "superseded")
