"""A hub task whose dataset is neither in the cache nor reachable fails with the commands that fetch it."""

from __future__ import annotations

import ast
import os
import shlex
import subprocess
import sys
from pathlib import Path

from kvbench.specs.task import HubDataset, load_task
from kvbench.specs.task_data import fetch_advice

KVBENCH = str(Path(sys.executable).parent / "kvbench")


def _offline(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``command`` in a new process with the hub out of reach (the test run's caches are empty)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def _load_call(message: str) -> dict[str, object]:
    """The arguments of the datasets.load_dataset call in the message's `python -c` command."""
    (line,) = [x for x in message.splitlines() if x.strip().startswith("python -c ")]
    (call,) = [
        node
        for node in ast.walk(ast.parse(shlex.split(line)[2]))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "datasets.load_dataset"
    ]
    (path,) = call.args
    return {"path": ast.literal_eval(path)} | {k.arg: ast.literal_eval(k.value) for k in call.keywords}


def _as_kvbench_loads(source: HubDataset) -> dict[str, object]:
    """What task_data._load passes to datasets.load_dataset for the hub (None: an argument not given)."""
    given = {"path": source.dataset, "name": source.config, "split": source.split}
    given |= {"revision": source.revision, "data_files": source.data_files}
    return {key: value for key, value in given.items() if value is not None}


def test_an_offline_hub_task_names_the_commands_that_fetch_its_dataset(tmp_path: Path) -> None:
    source = load_task("gsm8k").dataset
    run = [KVBENCH, "run", "--model", "tiny-qwen3", "--task", "gsm8k", "--policy", "streaming"]
    result = _offline([*run, "--limit", "1", "--quiet"], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"task 'gsm8k' ({source.dataset} at revision {source.revision}) is not available offline" in (
        result.stderr
    )
    assert _load_call(result.stderr) == _as_kvbench_loads(source)  # the call that fills the datasets cache

    # both commands run as printed: offline, each fails for want of the hub, on this dataset and revision
    (python,) = [x for x in result.stderr.splitlines() if x.strip().startswith("python -c ")]
    loaded = _offline([sys.executable, *shlex.split(python)[1:]], tmp_path)
    error = loaded.stderr.strip().splitlines()[-1]  # a valid call that wants the hub, not a TypeError
    assert loaded.returncode == 1 and error.startswith("ConnectionError") and source.dataset in error, error
    (hf,) = [x for x in result.stderr.splitlines() if x.strip().startswith("hf download ")]
    words = shlex.split(hf)
    assert words[1:7] == ["download", "--repo-type", "dataset", source.dataset, "--revision", source.revision]
    folder = words[words.index("--local-dir") + 1]
    assert f"pass it with --data {folder}" in result.stderr
    downloaded = _offline([sys.executable, "-m", "huggingface_hub.cli.hf", *words[1:]], tmp_path)
    assert downloaded.returncode == 1 and "offline mode is enabled" in downloaded.stderr  # not a usage error
    assert f"datasets/{source.dataset}/tree/{source.revision}" in downloaded.stderr


def test_a_tasks_config_and_data_files_are_in_the_load_command() -> None:
    for task in ("gpqa-diamond", "lcb-v6"):
        source = load_task(task).dataset
        assert _load_call(fetch_advice(source)) == _as_kvbench_loads(source), task
