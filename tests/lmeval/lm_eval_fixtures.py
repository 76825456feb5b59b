"""The lm-eval fixtures, ready to load: tests/fixtures/lm_eval copied to a folder whose task YAMLs name
the copy's dataset by absolute path (lm-eval resolves dataset_path against the working directory)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent.parent / "fixtures" / "lm_eval"


def render(target: Path) -> Path:
    """A copy of the lm-eval fixtures under ``target``, with the dataset path filled in."""
    shutil.copytree(FIXTURES, target)
    for task in (target / "lm_eval_tasks").glob("*.yaml"):
        task.write_text(task.read_text().replace("@FIXTURES@", str(target)))
    return target


def letter_overlap(answer: str, word: str) -> float:
    """kvb_echo's metric, written again here: the share of the word's distinct letters in the answer."""
    letters = set(word)
    return sum(1 for letter in letters if letter in answer.strip()) / len(letters)


def read_output(folder: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """lm-eval's results JSON and its sample logs per task, from an --output_path folder."""
    (results_file,) = folder.rglob("results_*.json")
    samples = {}
    for log in folder.rglob("samples_*.jsonl"):
        task = log.name.removeprefix("samples_").rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in log.read_text().splitlines()]
    return json.loads(results_file.read_text()), samples
