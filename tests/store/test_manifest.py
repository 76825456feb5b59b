"""The typed run manifest (kvbench.store.manifest.RunManifest): a manifest written by an earlier kvbench
(the store-v4 fixture's) reads back with its run id and role, and a manifest with a field of the wrong
type is refused naming its file and the field, by the reader and by `kvbench ingest`."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from invoke import kvbench

from kvbench.errors import SpecError
from kvbench.specs.resolved import Role
from kvbench.store.manifest import RunManifest

V4 = Path(__file__).resolve().parents[1] / "fixtures" / "store-v4"
OLD = sorted((V4 / "shards").glob("*/manifest.json"))


def spec_hash(spec: dict) -> str:
    """A run id as kvbench has always made it, written out here: sha256 of the spec's sorted JSON."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("path", OLD, ids=lambda p: p.parent.name)
def test_an_old_manifest_reads_with_its_run_id_and_role(path: Path, tmp_path: Path) -> None:
    stored = json.loads(path.read_text())
    manifest = RunManifest.read(path)
    assert manifest.run_id == path.parent.name == spec_hash(stored["spec"])
    assert manifest.spec.identity == manifest.run_id  # the run id follows from the typed spec unchanged
    assert manifest.role == Role(stored["role"]) == manifest.spec.role
    assert manifest.label == stored["label"] and manifest.git is not None
    assert manifest.git.sha == stored["git"]["sha"]
    # fields this old manifest never had read as None
    assert [manifest.policy_doc, manifest.suite, manifest.thinking, manifest.executor] == [None] * 4
    # written again, it holds what it held: the same fields and values, the same spec
    manifest.write(tmp_path / "manifest.json")
    assert json.loads((tmp_path / "manifest.json").read_text()) == stored


WRONG = {
    "role": ("judge", "role"),
    "created": ("yesterday", "created"),
    "git": ({"sha": 7, "dirty": False}, "git.sha"),
    "spec": (None, "spec"),
}


@pytest.mark.parametrize("field", WRONG)
def test_a_manifest_with_a_wrong_field_is_refused_naming_its_file(field: str, tmp_path: Path) -> None:
    value, where = WRONG[field]
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({**json.loads(OLD[0].read_text()), field: value}))
    with pytest.raises(SpecError) as refused:
        RunManifest.read(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: not a RunManifest (") and f"{where}: " in message, message


def test_ingest_names_the_manifest_with_a_wrong_role_and_ingests_nothing(tmp_path: Path) -> None:
    shutil.copytree(V4 / "shards", tmp_path / "runs" / "shards")
    path = tmp_path / "runs" / "shards" / OLD[0].parent.name / "manifest.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "role": "judge"}))
    done = kvbench("ingest", cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"{path.relative_to(tmp_path)}: not a RunManifest (role: Input should be" in done.stderr
    assert "spec.role" not in done.stderr  # the role is named once, where it is stored
    assert "nothing was ingested" in done.stderr
