"""Policy names: what ``@policy`` accepts (kvbench.core.contract.POLICY_NAME), everywhere a name is made
(the decorator, a scorer file that renames its class afterwards, `kvbench new-policy`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvbench.core.contract import POLICY_NAME, Policy, policy
from kvbench.errors import SpecError
from kvbench.isolation.host import IsolatedPolicy
from kvbench.registry import builtin_policies, load_file_policy
from kvbench.scaffold import write_template
from support import needs_sandbox

ESCAPES = "x\x1b]0;pwned\x07\x1b[2J"
"""An OSC sequence that retitles a terminal and a CSI one that clears it."""
ISSUE = "x[/]'; DROP TABLE runs;--<img src=x onerror=alert(1)>\x1b[31m"
"""The name issue 45 found accepted and stored."""


def _declared(name: str) -> type[Policy]:
    @policy(name)
    class Named(Policy):
        """A scorer under test."""

    return Named


def _refusal(name: str) -> str:
    with pytest.raises(ValueError) as raised:
        _declared(name)
    return str(raised.value)


def test_an_escape_sequence_in_a_name_is_refused_with_the_name_the_rule_and_an_example() -> None:
    message = _refusal(ESCAPES)
    assert "\x1b" not in message and "\x07" not in message  # the name is shown by its escapes
    assert r"'x\x1b]0;pwned\x07\x1b[2J'" in message, message
    assert "a lower-case letter, then at most 63 lower-case letters, digits, '-' or '_'" in message
    example = re.search(r"e\.g\. '([^']+)'", message)
    assert example is not None and _declared(example.group(1)).name == example.group(1)


@pytest.mark.parametrize(
    "name",
    [ISSUE, "x[red]y", "x\x9by", "x\u202ey", "My-Scorer", "x y", "x.py", "1x", "", "a" * 65],
    ids=["issue", "markup", "c1-csi", "bidi", "upper-case", "space", "dot", "digit-first", "empty", "65"],
)
def test_a_name_outside_the_rule_is_refused(name: str) -> None:
    assert "is not allowed" in _refusal(name)


def test_the_longest_name_and_every_character_the_rule_allows_are_accepted() -> None:
    for name in ("a" * 64, "k", "my-scorer_2", "vase-attnv"):
        assert _declared(name).name == name


def test_every_built_in_policy_and_the_template_have_names_the_rule_accepts(tmp_path: Path) -> None:
    names = {ref.cls.name for ref in builtin_policies().values()}
    assert len(names) > 10 and all(POLICY_NAME.fullmatch(n) for n in names), sorted(names)
    path, _ = write_template("my-scorer", tmp_path)
    assert load_file_policy(str(path), "MyScorer").cls.name == "my-scorer"
    with pytest.raises(SpecError, match=r"kvbench new-policy: policy name 'my\.scorer' is not allowed"):
        write_template("my.scorer", tmp_path)


def _renamed(folder: Path) -> Path:
    """A scorer file that renames its class after the decorator checked the name."""
    path = folder / "renamed.py"
    path.write_text(
        "from kvbench import Policy, policy\n\n\n"
        "@policy('honest')\nclass Renamed(Policy):\n    '''Renamed after the check.'''\n\n\n"
        "Renamed.name = 'x\\x1b]0;pwned\\x07'\n"
    )
    return path


def test_a_scorer_file_that_renames_its_class_after_the_decorator_is_refused(tmp_path: Path) -> None:
    # what the decorator checked is not what the file ends with: the loader checks the name again
    with pytest.raises(SpecError) as raised:
        load_file_policy(str(_renamed(tmp_path)), "Renamed")
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'renamed.py'}:Renamed: policy name 'x\\x1b]0;pwned\\x07' is not")
    assert "\x1b" not in message


@needs_sandbox
def test_an_isolated_scorers_process_cannot_name_it_outside_the_rule(tmp_path: Path) -> None:
    """The name an isolated scorer's process reports is its own say: the host checks it again."""
    with pytest.raises(SpecError) as raised:
        IsolatedPolicy(_renamed(tmp_path), "Renamed", {})
    assert r"policy name 'x\x1b]0;pwned\x07' is not allowed" in str(raised.value), raised.value
