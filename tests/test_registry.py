"""Resolving --policy: built-in names, module names, files, entry points, parameters and identities."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from kvbench.errors import SpecError, UnknownNameError
from kvbench.registry import (
    find_policy,
    known_policies,
    make_policy,
    parse_policy_arg,
    policy_record,
)

BUILTINS = {
    "full",
    "random",
    "streaming",
    "h2o",
    "snapkv",
    "rkv",
    "rkv-official",
    "curdkv",
    "vase-dkv",
    "vase-attnv",
    "triattention",
    "evict-range",
}


def test_every_builtin_policy_is_registered() -> None:
    assert set(known_policies()) >= BUILTINS


def test_parse_policy_arg() -> None:
    assert parse_policy_arg("rkv:lam=0.1,window=32") == ("rkv", None, {"lam": "0.1", "window": "32"})
    assert parse_policy_arg("snapkv") == ("snapkv", None, {})
    assert parse_policy_arg("dir/my.py:Mine:alpha=2") == ("dir/my.py", "Mine", {"alpha": "2"})
    with pytest.raises(SpecError, match="needs a class"):
        parse_policy_arg("dir/my.py")
    with pytest.raises(SpecError, match="not key=value"):
        parse_policy_arg("rkv:lam")


def test_parameters_are_validated_typed_and_recorded() -> None:
    policy = make_policy("rkv:lam=0.1,window=32")
    assert policy.lam == 0.1 and policy.window == 32
    assert policy_record(policy) == {"name": "rkv", "params": {"lam": 0.1, "window": 32}}
    assert policy_record(policy) == policy_record(make_policy("rkv", lam=0.1, window=32))
    assert policy_record(policy) != policy_record(make_policy("rkv"))
    with pytest.raises(
        SpecError, match=r"policy 'rkv': bad parameters \(alpha: .*\)\. Its parameters: lam, window"
    ):
        make_policy("rkv:alpha=1")
    with pytest.raises(SpecError, match="pool"):
        make_policy("snapkv:pool=avg3")
    with pytest.raises(SpecError, match="lam"):
        make_policy("rkv:lam=lots")


def test_unknown_name_lists_the_known_ones_and_suggests() -> None:
    with pytest.raises(UnknownNameError) as caught:
        make_policy("rvk")
    message = str(caught.value)
    assert "Did you mean 'rkv'" in message
    assert all(name in message for name in BUILTINS)


def test_a_module_name_resolves_to_its_policy() -> None:
    assert find_policy("random_attention").cls.name == "random"
    assert find_policy("vase_attnv").cls.name == "vase-attnv"


SCORER = textwrap.dedent(
    '''
    """A user's scorer, in a file of its own."""
    from kvbench import EvictionView, Policy, policy

    @policy("keys-norm")
    class KeysNorm(Policy):
        """Keep the keys with the largest norm."""

        power: float = 2.0

        def score(self, view: EvictionView):
            return view.keys.float().norm(dim=-1) ** self.power
    '''
)


def test_a_file_and_class_resolve(tmp_path: Path) -> None:
    path = tmp_path / "mine.py"
    path.write_text(SCORER)
    policy = make_policy(f"{path}:KeysNorm:power=1")
    assert policy.name == "keys-norm" and policy.power == 1.0
    assert find_policy(str(path), "KeysNorm").source == f"file {path}"
    with pytest.raises(SpecError, match=r"no policy class 'Nope'.*KeysNorm"):
        make_policy(f"{path}:Nope")
    with pytest.raises(SpecError, match="no file"):
        make_policy(f"{tmp_path / 'missing.py'}:KeysNorm")


def test_an_installed_entry_point_resolves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real distribution on sys.path (dist-info with entry_points.txt), as pip would install it."""
    (tmp_path / "thirdparty_scorer.py").write_text(SCORER)
    info = tmp_path / "thirdparty_scorer-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-scorer\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kvbench.policies]\nkeys-norm = thirdparty_scorer:KeysNorm\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    policy = make_policy("keys-norm:power=3")
    assert policy.power == 3.0
    assert find_policy("keys-norm").source == "entry point thirdparty_scorer:KeysNorm"
    assert "keys-norm" in known_policies()
    sys.modules.pop("thirdparty_scorer", None)
