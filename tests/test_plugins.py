"""One registry for every plug-in kind: a third-party package, installed with pip, adds a grader and a task
source through entry points, and `kvbench run` runs a task that names them, with no edit to kvbench."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from kvbench.adapters.base import ADAPTERS
from kvbench.errors import UnknownNameError
from kvbench.graders.registry import GRADERS
from kvbench.plugins import Registry
from kvbench.registry import POLICIES
from kvbench.runner.sources import TASK_SOURCES

WORDS = ["apple", "river", "candle"]

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "kvbench-words"
version = "0.1"

[project.entry-points."kvbench.graders"]
letter-overlap = "kvbench_words:LetterOverlap"

[project.entry-points."kvbench.task_sources"]
word-list = "kvbench_words:WordList"
"""

MODULE = '''
"""A task source whose problems are the words its task lists, and a grader that gives partial credit."""
from kvbench.errors import SpecError
from kvbench.graders.registry import Grader, GraderVerdict
from kvbench.runner.generation_units import HubSource
from kvbench.specs.task_data import Problem


class WordList(HubSource):
    local_data = False

    def resolve(self, task):
        words = getattr(task.source, "words", None)
        if not words or not all(isinstance(w, str) for w in words):
            raise SpecError(f"task {task.name!r}: a word-list source needs `words`, a list of words")
        return task

    def problems(self, task, backend, limit, data, fingerprint):
        words = task.source.words[:limit]
        return [Problem(f"w{i}", f"Repeat the word: {w}", {"word": w}) for i, w in enumerate(words)]


class LetterOverlap(Grader):
    def grade(self, output, gold, task, *, thinking):
        letters = set(gold["word"])
        share = sum(1 for letter in letters if letter in output) / len(letters)
        return GraderVerdict(share == 1.0, not output.strip(), None, "letter-overlap 0.1", metric=share)
'''

TASK = """
spec_version: 1
name: word-echo
description: repeat a word; its letters found in the answer are its score
source: {kind: %s, words: %s}
metric: letter_overlap
grader: letter-overlap
max_new_tokens: 64
"""


def letters_found(output: str, word: str) -> float:
    """The grader's metric, computed here from the stored output: the share of the word's letters in it."""
    return len([letter for letter in set(word) if letter in output]) / len(set(word))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package, built and installed by pip into a folder of its own (put on PYTHONPATH)."""
    package = tmp_path_factory.mktemp("kvbench-words")
    (package / "pyproject.toml").write_text(PYPROJECT)
    (package / "kvbench_words.py").write_text(MODULE)
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    done = subprocess.run([*pip, "--target", str(target), str(package)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (target / "kvbench_words-0.1.dist-info" / "entry_points.txt").is_file()
    return target


def kvbench_with(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`kvbench ARGS` in a new interpreter that finds the installed package (never kvbench's own files)."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    command = [sys.executable, "-m", "kvbench", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


@pytest.mark.slow
def test_an_installed_grader_and_task_source_run_a_task(site: Path, tmp_path: Path) -> None:
    task = tmp_path / "word-echo.yaml"
    task.write_text(TASK % ("word-list", json.dumps(WORDS)))
    args = ["run", "--task", str(task), "--model", "tiny-qwen3", "--policy", "snapkv", "--budget", "128"]
    done = kvbench_with(site, tmp_path, *args, "--no-baselines", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    con = duckdb.connect(str(tmp_path / "runs" / "kvbench.duckdb"), read_only=True)
    landed = con.execute(
        "SELECT r.task, r.policy, s.problem_id, s.metric, s.correct, s.grader_version, s.output "
        "FROM samples s JOIN runs r USING (run_id) ORDER BY s.problem_id"
    ).fetchall()
    con.close()
    assert [(t, p, problem) for t, p, problem, *_ in landed] == [
        ("word-echo", "snapkv", f"w{i}") for i in range(len(WORDS))
    ]
    for (*_, metric, correct, version, output), word in zip(landed, WORDS, strict=True):
        assert metric == pytest.approx(letters_found(output, word)) and correct == (metric == 1.0)
        assert version == "letter-overlap 0.1"
    assert len({m for *_, m, _, _, _ in landed}) > 1  # a score per output, not one value for all
    # read back where the package is not installed: a stored task was checked when its run was planned
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [sys.executable, "-m", "kvbench", "compare", "--format", "json"]
    shown = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)
    assert (row["task"], row["policy"]) == ("word-echo", "snapkv")
    assert row["score"] == pytest.approx(sum(m for *_, m, _, _, _ in landed) / len(WORDS))


@pytest.mark.slow
def test_an_unknown_task_source_names_the_installed_ones(site: Path, tmp_path: Path) -> None:
    task = tmp_path / "word-echo.yaml"
    task.write_text(TASK % ("word-lists", json.dumps(WORDS)))
    done = kvbench_with(site, tmp_path, "run", "--task", str(task), "--model", "tiny-qwen3", "--quiet")
    assert done.returncode == 2
    known = "Known task sources: hub-dataset, lm-eval, probe, word-list."
    assert f"unknown task source 'word-lists'. Did you mean 'word-list'? {known}" in done.stderr


@pytest.mark.parametrize(
    ("registry", "name", "says"),
    [
        (POLICIES, "snapkvv", "unknown policy 'snapkvv'. Did you mean 'snapkv'? Known policies: curdkv,"),
        (GRADERS, "maths", "unknown grader 'maths'. Did you mean 'math'? Known graders: choice, code,"),
        (ADAPTERS, "vlm", "unknown adapter 'vlm'. Did you mean 'vllm'? Known adapters: hf, vllm."),
        (TASK_SOURCES, "probes", "unknown task source 'probes'. Did you mean 'probe'? Known task sources:"),
    ],
)
def test_every_kind_refuses_an_unknown_name_with_the_one_error(
    registry: Registry, name: str, says: str
) -> None:
    with pytest.raises(UnknownNameError) as caught:
        registry.get(name)
    assert str(caught.value).startswith(says)
    assert name not in registry and all(known in str(caught.value) for known in registry.names())


def test_a_plugin_registered_in_this_process_is_found_after_the_builtins() -> None:
    numbers: Registry[int] = Registry("number", "kvbench.tests.numbers", {"one": 1, "pi": "math:pi"})
    numbers.register("two", 2)
    numbers.register("one", 11)  # a built-in's name stays the built-in's
    assert [numbers.get(n) for n in numbers.names()] == [1, 3.141592653589793, 2]
