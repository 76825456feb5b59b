"""Malformed spec files fail with the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.errors import SpecError
from kvbench.specs.model import load_model_spec, model_names

GOOD = (
    "spec_version: 1\nname: m\ndescription: d\nfamily: qwen3\ndtype: bfloat16\n"
    "source:\n  kind: hub\n  repo: a/b\n"
)


def test_every_builtin_model_spec_validates() -> None:
    assert {"smollm2-135m", "tiny-qwen3", "qwen3-4b", "qwen3-14b", "qwen3-32b", "phi-4-reasoning"} <= set(
        model_names()
    )
    for name in model_names():
        assert load_model_spec(name).name == name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("family: qwen3\n", ""), r"field `family`: Field required \(add this field\)"),
        (GOOD + "temperature: 0.6\n", r"field `temperature`: Extra inputs are not permitted \(remove it"),
        (
            GOOD.replace("family: qwen3", "family: qwen4"),
            r"field `family`: Input should be 'qwen3', 'phi4-reasoning'",
        ),
        (GOOD.replace("kind: hub", "kind: ftp"), r"field `source`: .*'gguf-package', 'hub', 'random-qwen3'"),
        (GOOD.replace("  repo: a/b\n", ""), r"field `source.hub.repo`: Field required"),
        ("name: [unclosed\n", r"not valid YAML at line 2, column 1: expected .,. or .\]."),
        ("- a\n- b\n", r"expected a mapping of fields at the top level, found list"),
    ],
)
def test_malformed_model_spec_names_file_field_and_fix(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=expected) as caught:
        load_model_spec(path)
    assert str(path) in str(caught.value)


def test_a_missing_spec_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"model spec file .*nope.yaml does not exist"):
        load_model_spec(tmp_path / "nope.yaml")


def test_a_protocol_identity_records_mixed_precision_only_where_a_protocol_sets_it() -> None:
    from kvbench.specs.protocol import load_protocol

    plain = load_protocol("protect-prompt")
    identity = plain.identity()
    assert "precision" not in identity and "unit" not in identity["budget"]
    # everything else as before the option existed, so that no stored run id moved
    # margin is out of the identity at its default
    dumped = plain.model_dump(mode="json", exclude={"description", "precision", "margin"})
    del dumped["budget"]["unit"]
    assert identity == dumped
    mixed = load_protocol("mixed-4bit").identity()
    assert mixed["precision"] == {"bits": 4, "group": 32, "high_precision": 32, "demote": "oldest"}
    assert mixed["budget"] == {"ratio": 4.0, "fixed": None, "unit": "bytes"}
    schedule = load_protocol("mixed-4bit").schedule(256, from_ratio=True)
    assert schedule.budget_unit == "bytes" and schedule.precision is not None
    assert schedule.precision.high_precision == 32


def test_a_precision_without_its_bits_or_with_a_bad_group_is_refused(tmp_path: Path) -> None:
    from kvbench.specs.protocol import load_protocol

    text = (Path(__file__).parents[1] / "suite" / "protocols" / "mixed-4bit.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("  bits: 4\n", "  bits: 3\n"))
    with pytest.raises(SpecError, match="bits"):
        load_protocol(bad)
    bad.write_text(text.replace("  group: 32\n", "  group: 12\n"))
    with pytest.raises(SpecError, match="group"):
        load_protocol(bad)
