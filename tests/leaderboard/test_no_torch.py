"""The leaderboard reads results only: its process never imports torch (nor any policy module), and the
policy documentation it shows is the one saved with the runs, not the installed code's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb

import kvbench.leaderboard

APP = str(Path(kvbench.leaderboard.__file__).with_name("app.py"))

SESSION = """
import json, os, sys
from streamlit.testing.v1 import AppTest
app = AppTest.from_file({app!r}, default_timeout=120).run()
assert not app.exception, app.exception
app.selectbox(key="policy").set_value("snapkv").run()
assert not app.exception, app.exception
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "kvbench.policies")))
print(json.dumps({{"heavy": heavy, "text": [t.value for t in app.text]}}))
"""


def test_the_app_process_never_imports_torch(board_db: Path, tmp_path: Path) -> None:
    env = {"KVBENCH_LEADERBOARD_DB": str(board_db), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", SESSION.format(app=APP)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["heavy"] == []
    # what the policy page showed is what the newest snapkv run stored
    con = duckdb.connect(str(board_db), read_only=True)
    (stored,) = con.execute(
        "SELECT policy_doc FROM runs WHERE policy = 'snapkv' ORDER BY created DESC LIMIT 1"
    ).fetchone()
    con.close()
    doc = json.loads(stored)
    assert doc["module"] == "kvbench.policies.snapkv" and "SnapKV" in doc["summary"]
    assert any(doc["summary"] in t for t in seen["text"])  # as plain text (st.text), never Markdown
    assert doc["module_doc"].strip() in [t.strip() for t in seen["text"]]
