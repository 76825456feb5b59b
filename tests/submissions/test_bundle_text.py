"""Text from a bundle is data on every path: `kvbench accept` refuses malformed text (a lone surrogate, a
control character in a one-line field, a string over its field's bound) and a bundle with no runs, naming
the field, never with a traceback; `kvbench verify` prints a spec's names escaped, piped or on a terminal.

Every bundle here is the genuine one (conftest.py), unpacked, edited and sealed again as a forger would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
import yaml
from streamlit.testing.v1 import AppTest
from submitting import HUB, KVBENCH, cli
from tampering import edit_manifest, edit_samples, forged, reidentified

import kvbench.leaderboard
from kvbench.leaderboard.app import DATABASE_ENV
from kvbench.specs.model import load_model_spec
from kvbench.submissions.text import (
    DESCRIPTION_CHARS,
    OUTPUT_CHARS,
    PARAMETER_CHARS,
    PROBLEM_ID_CHARS,
    SUBMITTER_CHARS,
)

ESCAPES = "\x1b]0;pwned\x07\x1b[2J"
"""OSC 0 retitles the terminal, CSI 2J clears it."""
RIGHT_TO_LEFT = "\u202e"
"""RIGHT-TO-LEFT OVERRIDE: a format character, not a control one, which a terminal or a page would show
the rest of the line reversed by: the text rule refuses it, kvbench.printable escapes it."""
MODEL = f"tiny[/]{RIGHT_TO_LEFT}qwen3"
"""A model name (from a local model file: a board accepts only kvbench's own models) that Rich would read as
markup (a closing tag with nothing open)."""
MODEL_SHOWN = r"tiny[/]\u202eqwen3"
BLANK_LINE_MODEL = "tiny-qwen3\n\n# heading **bold** [link](http://example.com)\n\n"
APP = str(Path(kvbench.leaderboard.__file__).with_name("app.py"))


def _bundle_json(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        manifest = json.loads((folder / "bundle.json").read_text())
        change(manifest)
        (folder / "bundle.json").write_text(json.dumps(manifest))

    return edit


def _every_spec(change: Callable[[dict], None], roles: tuple[str, ...] = ("policy", "null", "reference")):
    """Change the resolved spec of every run of ``roles``, each run then under the identity it hashes to."""

    def edit(folder: Path) -> None:
        for cell in json.loads((folder / "bundle.json").read_text())["cells"]:
            if cell["role"] in roles:
                edit_manifest(folder, cell["run_id"], lambda run: change(run["spec"]))
        reidentified(folder)

    return edit


def _policy_parameter(value: str) -> Callable[[Path], None]:
    return _every_spec(lambda spec: spec["policy"]["params"].update(note=value), roles=("policy",))


def _first_label(value: str) -> Callable[[Path], None]:
    return _bundle_json(lambda manifest: manifest["cells"][0].update(label=value))


def _samples(field: str, value: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        run_id = json.loads((folder / "bundle.json").read_text())["cells"][0]["run_id"]
        edit_samples(folder, run_id, lambda row: row.update({field: value}))

    return edit


MALFORMED = {
    "a lone surrogate in a label": (
        _first_label("tiny-qwen3/passkey\ud800"),
        "bundle.json: [text] cells[0].label holds a lone surrogate (U+D800)",
    ),
    "a lone surrogate in a policy parameter": (
        _policy_parameter("a\udfff"),
        "/manifest.json: [text] spec.policy.params.note holds a lone surrogate (U+DFFF)",
    ),
    "escape sequences in a task name": (
        _every_spec(lambda spec: spec["task"].update(name=f"passkey{ESCAPES}")),
        "/manifest.json: [text] spec.task.name holds the control character U+001B: a name is text",
    ),
    "a bell in the submitter": (
        _bundle_json(lambda manifest: manifest.update(submitter="Mallory\x07")),
        "bundle.json: [text] submitter holds the control character U+0007",
    ),
    "a right-to-left override in the submitter": (
        _bundle_json(lambda manifest: manifest.update(submitter=f"Mallory {RIGHT_TO_LEFT}gpj.exe")),
        "bundle.json: [text] submitter holds the control character U+202E",
    ),
    # renders as another group's name, with a message spelt in variation selectors after it
    "invisible default-ignorable characters in the submitter": (
        _bundle_json(
            lambda manifest: manifest.update(submitter="Google\u034f DeepMind\u17b4\ufe01\U000e0101")
        ),
        "bundle.json: [text] submitter holds the control character U+034F",
    ),
    "a zero-width space in a policy parameter": (
        _policy_parameter("ab\u200bcd"),
        "/manifest.json: [text] spec.policy.params.note holds the control character U+200B",
    ),
    "a carriage return in a description": (
        _bundle_json(lambda manifest: manifest.update(description="line\rover")),
        "bundle.json: [text] description holds the control character U+000D other than a newline or a tab",
    ),
    "a submitter over its bound": (
        _bundle_json(lambda manifest: manifest.update(submitter="m" * (SUBMITTER_CHARS + 1))),
        f"bundle.json: [text] submitter {SUBMITTER_CHARS + 1:,} characters, over the {SUBMITTER_CHARS:,} "
        "the submitter may have (SUBMITTER_CHARS)",
    ),
    "a description over its bound": (
        _bundle_json(lambda manifest: manifest.update(description="d\n" * DESCRIPTION_CHARS)),
        f"bundle.json: [text] description {2 * DESCRIPTION_CHARS:,} characters, over the "
        f"{DESCRIPTION_CHARS:,} the description may have (DESCRIPTION_CHARS)",
    ),
    "a parameter over its bound": (
        _policy_parameter("p" * (PARAMETER_CHARS + 1)),
        f"[text] spec.policy.params.note {PARAMETER_CHARS + 1:,} characters, over the {PARAMETER_CHARS:,} "
        "a parameter may have (PARAMETER_CHARS)",
    ),
    "a problem id over its bound": (
        _samples("problem_id", "q" * (PROBLEM_ID_CHARS + 1)),
        f"[text] problem_id (sample 0) {PROBLEM_ID_CHARS + 1:,} characters, over the {PROBLEM_ID_CHARS:,} "
        "a problem id may have (PROBLEM_ID_CHARS)",
    ),
    "an output over its bound": (
        _samples("output", "o" * (OUTPUT_CHARS + 1)),
        f"(sample 0) {OUTPUT_CHARS + 1:,} characters, over the {OUTPUT_CHARS:,} an output may have "
        "(OUTPUT_CHARS)",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_text_is_refused_at_accept_naming_the_field(
    case: str, submission: Path, tmp_path: Path
) -> None:
    edit, refusal = MALFORMED[case]
    bundle = forged(
        submission / "bundle.kvbench.tar.gz", tmp_path / "forged.tar.gz", edit, output_digests=True
    )
    done = cli("accept", str(bundle), "--db", str(tmp_path / "board.duckdb"), cwd=tmp_path, check=False)
    shown = done.stdout + done.stderr
    assert done.returncode == 1, shown
    assert "refused" in done.stdout and refusal in done.stdout, shown
    assert "Traceback" not in shown and "\x1b" not in shown and "\x07" not in shown, shown
    assert not (tmp_path / "board.duckdb").exists()


def test_a_bundle_without_runs_is_refused_by_accept_and_verify(submission: Path, tmp_path: Path) -> None:
    def emptied(folder: Path) -> None:
        _bundle_json(lambda manifest: manifest.update(cells=[]))(folder)
        shutil.rmtree(folder / "runs")

    bundle = forged(submission / "bundle.kvbench.tar.gz", tmp_path / "empty.tar.gz", emptied)
    for command in ("accept", "verify"):
        done = cli(command, str(bundle), "--db", str(tmp_path / "board.duckdb"), cwd=tmp_path, check=False)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "bundle.json: [runs] lists no runs" in done.stdout, done.stdout + done.stderr
        assert not (tmp_path / "board.duckdb").exists()


@pytest.fixture(scope="module")
def renamed_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seeded tiny Qwen3 under the name MODEL, as a model file. A board refuses a model that is not
    kvbench's own (the known-spec rule), so a name like this reaches the runner's progress from a local
    model file; the progress is the one `kvbench run` and `kvbench verify` share (run_cells)."""
    spec = load_model_spec("tiny-qwen3").model_dump(mode="json") | {"name": MODEL}
    path = tmp_path_factory.mktemp("renamed") / "model.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True))
    return path


RUN = ("run", "--task", "passkey", "--limit", "1", "--policy", "snapkv", "--out", "out")


def test_the_progress_prints_a_models_name_escaped(renamed_model: Path, tmp_path: Path) -> None:
    done = cli(*RUN, "--model", str(renamed_model), cwd=tmp_path, check=False)
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown
    # piped, the progress is one line per unit computed
    assert f"] {MODEL_SHOWN}/passkey/random@K=" in done.stdout, shown
    assert RIGHT_TO_LEFT not in shown and "\x1b" not in shown, shown


def test_the_progress_on_a_terminal_runs_a_model_whose_name_reads_as_markup(
    renamed_model: Path, tmp_path: Path
) -> None:
    """On a terminal the progress is a bar, whose description names the model: Rich read "[/]" in it as
    markup and every unit ended in MarkupError."""
    env = {**os.environ, "TTY_COMPATIBLE": "1", "COLUMNS": "200"}
    done = subprocess.run(
        [KVBENCH, *RUN, "--model", str(renamed_model)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        env=env,
    )
    shown = done.stdout + done.stderr
    assert done.returncode == 0 and "MarkupError" not in shown, shown
    assert RIGHT_TO_LEFT not in shown, shown
    assert "\x1b]0;" not in shown and "\x1b[2J" not in shown  # only Rich's own styles and cursor moves


def test_a_model_name_with_a_blank_line_stays_inside_the_pages_code_span(
    submission: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A board accepted before the text rule held such a name (and `accept --rebuild` keeps it): the
    Efficiency view names the model in a code span of a command to run, which a blank line would close,
    the rest of the name then read as Markdown (a heading, emphasis, a link)."""
    bundle, db = submission / "bundle.kvbench.tar.gz", tmp_path / "board.duckdb"
    cli("accept", str(bundle), "--db", str(db), cwd=tmp_path)
    cli(
        "verify",
        str(bundle),
        "--db",
        str(db),
        "--data",
        f"gpqa-diamond={HUB / 'Idavidrein/gpqa'}",
        cwd=tmp_path,
    )
    snapshot = tmp_path / "board.snapshot.duckdb"
    with duckdb.connect(str(snapshot)) as con:
        con.execute("UPDATE runs SET model = ?", [BLANK_LINE_MODEL])
    monkeypatch.setenv(DATABASE_ENV, str(snapshot))
    app = AppTest.from_file(APP, default_timeout=120)
    app.run()
    assert not app.exception, app.exception
    (efficiency,) = [t for t in app.tabs if t.label == "Efficiency"]
    hint = next(i.value for i in efficiency.info if "No decode benchmarks" in i.value)
    assert "\n" not in hint, hint  # one paragraph: the span closes where it was opened
    command = " ".join(f"kvbench bench decode --model {BLANK_LINE_MODEL} --out runs".splitlines())
    assert f"` {command} `" in hint, hint
