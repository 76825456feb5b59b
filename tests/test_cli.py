"""The kvbench command, run as a user runs it: the installed console script in a subprocess."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filesystems import kvbench_line, on_tmpfs, recorded
from synthetic_adapter import SyntheticBackend, synthetic_model

from kvbench.core.schedule import Schedule
from kvbench.registry import known_policies, make_policy, parse_policy_arg

KVBENCH = str(Path(sys.executable).parent / "kvbench")


def kvbench(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([KVBENCH, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_list_policies_one_per_line_with_a_description() -> None:
    result = kvbench("list", "policies")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    names = [line.split("\t")[0] for line in lines]
    assert [n for n in names if not n.startswith("kvpress:")] == list(known_policies())
    assert all(len(line.split("\t")[1]) > 10 for line in lines)


def test_new_policy_writes_a_working_template_and_never_overwrites(tmp_path: Path) -> None:
    result = kvbench("new-policy", "my-scorer", "--dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    path = tmp_path / "my_scorer.py"
    assert path.is_file() and f"--policy {path}:MyScorer" in result.stdout
    policy = make_policy(f"{path}:MyScorer")
    backend = SyntheticBackend(
        policy, Schedule(budget=32, buffer=8), synthetic_model(), prompt_len=4, row_seeds=[0]
    )
    for _ in range(60):
        backend.step()
    assert backend.evictor.stats.events >= 3

    again = kvbench("new-policy", "my-scorer", "--dir", str(tmp_path))
    assert again.returncode == 2 and "exists already" in again.stderr
    taken = kvbench("new-policy", "snapkv", "--dir", str(tmp_path))
    assert taken.returncode == 2 and "exists already" in taken.stderr
    bad = kvbench("new-policy", "My Scorer!", "--dir", str(tmp_path))
    assert bad.returncode == 2 and "lower-case" in bad.stderr


def test_the_templates_parameter_comment_is_a_selector_kvbench_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = kvbench("new-policy", "my-scorer", "--dir", "scorers", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    printed = result.stdout.split("--policy ")[-1].strip()
    comment = re.search(r"--policy (\S+)", (tmp_path / "scorers" / "my_scorer.py").read_text())
    assert comment is not None
    assert comment[1] == f"{printed}:window=32"  # the line new-policy prints, with a parameter
    monkeypatch.chdir(tmp_path)  # the path is as seen from where new-policy ran
    assert parse_policy_arg(comment[1]) == ("scorers/my_scorer.py", "MyScorer", {"window": "32"})
    policy = make_policy(comment[1])
    assert (policy.name, policy.params()) == ("my-scorer", {"window": 32})


def test_new_policy_writes_into_the_current_folder_and_runs_from_there(tmp_path: Path) -> None:
    from importlib import import_module

    package = Path(import_module("kvbench.policies").__path__[0])
    before = sorted(p.name for p in package.iterdir())
    result = kvbench("new-policy", "here-scorer", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "here_scorer.py").is_file()
    assert sorted(p.name for p in package.iterdir()) == before  # kvbench's own source is left untouched
    assert result.stdout.splitlines()[-1].endswith("--policy ./here_scorer.py:HereScorer")
    listed = kvbench("run", "--policy", "./here_scorer.py:HereScorer", "--model", "nope", cwd=tmp_path)
    assert "here_scorer" not in listed.stderr and "unknown model 'nope'" in listed.stderr


def test_bench_evict_reports_ratios_to_random(tmp_path: Path) -> None:
    out = tmp_path / "reports" / "bench.json"  # a folder that does not exist yet is made
    result = kvbench(
        "bench",
        "evict",
        "--policy",
        "snapkv",
        "--policy",
        "streaming",
        "--batch",
        "1",
        "--budget",
        "256",
        "--buffer",
        "32",
        "--min-time",
        "0.01",
        "--keys",
        "random",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    rows = {r["policy"]: r for r in report["results"]}
    assert set(rows) == {"random", "snapkv", "streaming"}
    assert rows["random"]["ratio_to_random"] == 1.0
    assert all(r["ms_per_event"] > 0 for r in rows.values())
    assert report["machine"]["cpu_count"] >= 1 and "× random" in result.stdout
    floor = {line.split("│")[1].strip(): line.split("│")[6].strip() for line in result.stdout.splitlines()
             if line.count("│") > 7 and line.split("│")[1].strip() in rows}  # fmt: skip
    for name, row in rows.items():  # each event over the copy floor, as printed
        assert floor[name] == f"{row['ms_per_event'] / row['copy_floor_ms']:.2f}"
    assert all(r["telemetry_ratio"] is None for r in rows.values())  # timed with it off only when asked


def test_bench_evict_times_the_retention_telemetry_on_and_off(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = kvbench(
        *("bench", "evict", "--policy", "random", "--batch", "2", "--budget", "256", "--buffer", "32"),
        *("--min-time", "0.01", "--telemetry-cost", "--keys", "random", "--json", str(out)),
    )
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(out.read_text())["results"]
    assert row["telemetry_ratio"] > 0 and "telemetry on / off" in result.stdout


def test_bench_evict_records_the_machine_of_the_device_it_timed_on(tmp_path: Path) -> None:
    """--json writes "the machine" that ran: with --device (here cpu:0, the form a cuda:N takes) its
    description names that device, as `kvbench bench decode`'s does, not the default cpu."""
    out = tmp_path / "bench.json"
    result = kvbench(
        *("bench", "evict", "--policy", "random", "--batch", "1", "--budget", "64", "--buffer", "16"),
        *("--min-time", "0.01", "--device", "cpu:0", "--keys", "random", "--json", str(out)),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["machine"]["device"] == "cpu:0"


@pytest.mark.parametrize("args", [["list", "widgets"], ["nonsense"]])
def test_bad_arguments_exit_non_zero_with_usage(args: list[str]) -> None:
    result = kvbench(*args)
    assert result.returncode == 2 and "usage:" in result.stderr


def test_python_dash_m_kvbench() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvbench", "list", "policies"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "random\t" in result.stdout


# What the command line says when something fails: one line naming the file or flag and what to do, a
# non-zero exit, never a traceback and never a silent success.


def scorer(folder: Path, body: str, name: str = "bad") -> str:
    """A user's scorer file whose ``score`` runs ``body``; its --policy argument."""
    (folder / "scorer.py").write_text(
        "from kvbench import EvictionView, Policy, policy\n\n\n"
        f'@policy({name!r})\nclass Scorer(Policy):\n    """A test scorer."""\n\n'
        f"    def score(self, view: EvictionView):\n        {body}\n"
    )
    return f"{folder / 'scorer.py'}:Scorer"


TINY_RUN = ["--model", "tiny-qwen3", "--task", "passkey", "--limit", "1", "--samples", "1", "--quiet"]


def plugin(site: Path, raises: str) -> dict[str, str]:
    """An installed policy plugin (an entry point in group kvbench.policies) whose import raises; the
    environment that puts it on the path."""
    info = site / "badplug-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: badplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kvbench.policies]\nbad = badplug:Bad\n")
    (site / "badplug.py").write_text(f"raise {raises}\n")
    return {**os.environ, "PYTHONPATH": str(site)}


@pytest.mark.parametrize(
    ("raises", "status", "says"),
    [
        ("SystemExit(0)", 1, "`kvbench list` did not finish: code it ran raised SystemExit(0)"),
        ("SystemExit(3)", 3, "`kvbench list` did not finish: code it ran raised SystemExit(3)"),
        ("MemoryError()", 1, "out of memory: `kvbench list` stopped before it finished."),
    ],
)
def test_an_exit_or_memory_error_inside_a_command_is_one_line_and_a_failure(
    tmp_path: Path, raises: str, status: int, says: str
) -> None:
    done = subprocess.run(
        [KVBENCH, "list", "policies"], capture_output=True, text=True, env=plugin(tmp_path, raises)
    )
    assert done.returncode == status
    assert done.stderr.startswith(f"kvbench: {says}"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""


def test_ctrl_c_is_one_line_and_exit_130(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [KVBENCH, "run", "--policy", "snapkv", *TINY_RUN[:4], "--limit", "8", "--quiet"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a SIGINT ignored by whatever started pytest is inherited: the run gets it as under a user's shell
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 300
    while time.time() < deadline and not list((tmp_path / "runs" / "shards").glob("*/*.parquet")):
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    # the signal may land inside a scorer's call (the policy's or the null's, whichever shard runs), which the
    # message then names
    in_scorer = r"( in policy '(snapkv|random)' at layer \d+, eviction event \d+)?"
    assert re.match(rf"kvbench: interrupted{in_scorer}: `kvbench run` stopped before it finished\.", err), err
    assert "run the same command again" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("raises", "status", "says"),
    [
        ("SystemExit(0)", 2, "policy 'quits' at layer 0, eviction event 0 raised SystemExit: 0"),
        (
            "MemoryError('no room')",
            2,
            "policy 'quits' at layer 0, eviction event 0 raised MemoryError: no room",
        ),
        (
            "KeyboardInterrupt",
            130,
            "interrupted in policy 'quits' at layer 0, eviction event 0: `kvbench run` stopped",
        ),
    ],
)
def test_what_a_scorer_raises_mid_run_is_one_line_naming_where(
    tmp_path: Path, raises: str, status: int, says: str
) -> None:
    policy = scorer(tmp_path, f"raise {raises}", name="quits")
    done = kvbench("run", "--policy", policy, *TINY_RUN, "--no-baselines", cwd=tmp_path)
    assert done.returncode == status, done.stderr
    assert done.stderr.startswith(f"kvbench: {says}"), done.stderr
    assert "Traceback" not in done.stderr


def test_error_text_is_printed_as_it_is(tmp_path: Path) -> None:
    done = kvbench("run", "--policy", "x[/]y:thumbs_up:", cwd=tmp_path)
    assert done.returncode == 2
    assert "'x[/]y:thumbs_up:'" in done.stderr and "👍" not in done.stderr, done.stderr


def test_json_into_a_missing_folder_is_made_before_the_run(small_results: Path, tmp_path: Path) -> None:
    shutil.copytree(small_results, tmp_path / "runs")
    target = tmp_path / "reports" / "today" / "run.json"
    done = kvbench("run", "--policy", "streaming", *TINY_RUN, "--json", str(target), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert {row["policy"] for row in json.loads(target.read_text())["rows"]} == {
        "streaming",
        "random",
        "full",
    }


@pytest.mark.parametrize(
    "command",
    [
        ("run", "--policy", "streaming", *TINY_RUN),
        ("calibrate-null", "--model", "tiny-qwen3", "--limit", "1", "--pairs", "1", "--out", "runs"),
    ],
    ids=["run", "calibrate-null"],
)
def test_json_where_no_folder_can_be_made_fails_before_the_run(tmp_path: Path, command: tuple) -> None:
    (tmp_path / "taken").write_text("a file, not a folder")
    started = time.perf_counter()
    done = kvbench(*command, "--json", "taken/run.json", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("kvbench: --json taken/run.json: cannot write in taken"), done.stderr
    assert "give a path you can write to" in done.stderr
    assert not (tmp_path / "runs" / "shards").exists()  # nothing ran
    assert time.perf_counter() - started < 60


def test_a_read_only_results_folder_fails_before_the_run(tmp_path: Path) -> None:
    mount, log = tmp_path / "ro", tmp_path / "log"
    log.mkdir()
    on_tmpfs(
        mount,
        f"mount -o remount,ro {mount}\n"
        + kvbench_line(["run", "--policy", "streaming", *TINY_RUN, "--out", f"{mount}/runs"], log / "ro"),
        size="1m",
    )
    status, out, err = recorded(log / "ro")
    assert status == 2
    # runs/ does not exist yet: the folder it would be made in is the one named
    assert err.startswith(f"kvbench: --out {mount}/runs: cannot write in {mount} "), err
    assert "Read-only file system" in err and "give a path you can write to" in err
    assert out == ""  # no table: it stopped before running


def test_threads_are_set_for_the_run_and_recorded(tmp_path: Path) -> None:
    args = ["run", "--model", "tiny-qwen3", "--task", "passkey", "--policy", "snapkv", "--budget", "256"]
    result = subprocess.run(  # torch would take 2 threads from the environment: --threads wins
        [KVBENCH, *args, "--limit", "1", "--no-baselines", "--quiet", "--threads", "1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    assert result.returncode == 0, result.stderr
    (manifest,) = (tmp_path / "runs" / "shards").glob("*/manifest.json")
    assert json.loads(manifest.read_text())["hardware"]["torch_threads"] == 1
    refused = kvbench(*args, "--threads", "0", cwd=tmp_path)
    assert refused.returncode == 2 and "--threads 0: give at least 1" in refused.stderr


def test_piped_output_gets_one_line_per_finished_unit(tmp_path: Path) -> None:
    """Without a terminal there is no live bar to see: each unit that finishes prints a line with the
    count, the unit, its time, the elapsed time and an ETA, so a log shows progress."""
    import re

    args = ["run", "--model", "tiny-qwen3", "--task", "passkey", "--policy", "snapkv", "--budget", "256"]
    result = kvbench(*args, "--limit", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    pattern = r"^\[(\d)/6\] tiny-qwen3/passkey/(\S+) (\S+): [\d.]+ s; elapsed \d:\d\d:\d\d, ETA \d:\d\d:\d\d$"
    lines = [m.groups() for m in re.finditer(pattern, result.stdout, flags=re.M)]
    assert sorted(int(done) for done, _, _ in lines) == [1, 2, 3, 4, 5, 6]
    assert {arm.split("@")[0] for _, arm, _ in lines} == {"snapkv", "random", "full"}
    again = kvbench(*args, "--limit", "2", cwd=tmp_path)  # everything stored: nothing to report per unit
    assert again.returncode == 0 and not re.search(pattern, again.stdout, flags=re.M)
