"""The arena: an isolated scorer's large tensors cross through a file both sides map, read in place by the
child, which can neither write the file nor shrink it under the parent, and whose own writes stay its own;
the scores it gives through the arena are those of the same scorer in kvbench's process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from isolated_scorers import hostile, scorer, started_policy, stop_scorers  # noqa: F401 (a fixture)
from synthetic_adapter import synthetic_model

from kvbench.core.schedule import Schedule
from kvbench.errors import ScorerError
from kvbench.isolation.arena import Arena, ArenaReader
from kvbench.isolation.wire import WireError
from kvbench.registry import make_policy
from support import RecordingBackend, needs_sandbox


def tensors(scale: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(scale)
    return {
        "keys": torch.randn(2, 4, 100 * scale, 64, generator=g)[:, :, : 90 * scale],  # a strided slice
        "positions": torch.arange(4 * 90 * scale * 40).view(4, -1),
        "protected": torch.rand(2, 4, 9000 * scale, generator=g) < 0.5,
        "small": torch.ones(3, 5),
        "empty": torch.ones(0, 5),
    }


def test_tensors_cross_in_place_and_empty_ones_stay_in_the_frame() -> None:
    arena, reader = Arena(), ArenaReader()
    try:
        sent = tensors(1)
        layout, left = arena.place(sent)
        assert set(left) == {"empty"} and set(layout["tensors"]) == {
            "keys",
            "positions",
            "protected",
            "small",
        }
        got = reader.tensors({**layout, "folder": str(arena.folder)})
        for name in layout["tensors"]:
            assert got[name].dtype == sent[name].dtype and torch.equal(got[name], sent[name]), name
        first = layout["file"]
        bigger = tensors(3)  # more than the first file holds: a new file, the old one gone
        layout, _ = arena.place(bigger)
        assert layout["file"] != first and not (arena.folder / first).exists()
        got = reader.tensors({**layout, "folder": str(arena.folder)})
        assert torch.equal(got["keys"], bigger["keys"])
        got["keys"].add_(1.0)  # the child's own write: a private copy of the page, not the parent's file
        again = ArenaReader().tensors({**layout, "folder": str(arena.folder)})
        assert torch.equal(again["keys"], bigger["keys"])
    finally:
        arena.close()
    assert not arena.folder.exists()


def test_tensors_held_back_cross_only_when_delivered_and_nothing_else_can_be_asked_for() -> None:
    from types import SimpleNamespace

    from kvbench.isolation.host import ScorerProcess

    arena, reader = Arena(), ArenaReader()
    try:
        sent = tensors(1)
        layout, _ = arena.place(sent, later=frozenset({"keys", "protected"}))
        assert set(layout["tensors"]) == {"positions", "small"} and layout["later"] == ["keys", "protected"]
        process = SimpleNamespace(arena=arena)
        for names in (["small"], ["positions"], ["../1.arena"], "keys"):  # not held back, or not a list
            with pytest.raises(WireError, match="that the request did not hold back"):
                ScorerProcess._delivered(process, {"names": names})  # type: ignore[arg-type]
        delivered = ScorerProcess._delivered(process, {"names": ["keys"]})  # type: ignore[arg-type]
        assert delivered["later"] == ["protected"] and set(delivered["tensors"]) == {"keys"}
        got = reader.tensors({**layout, "folder": str(arena.folder)})
        got |= reader.tensors({**delivered, "folder": str(arena.folder)})
        assert torch.equal(got["keys"], sent["keys"]) and torch.equal(got["positions"], sent["positions"])
        arena.place(tensors(1))  # the next request: what the last one held back can no longer be asked for
        with pytest.raises(WireError, match="did not hold back"):
            ScorerProcess._delivered(process, {"names": ["protected"]})  # type: ignore[arg-type]
    finally:
        arena.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"file": "../../etc/passwd"}, "an arena file name '../../etc/passwd' that is not NUMBER.arena"),
        ({"tensors": {"keys": {"dtype": "object", "shape": [2], "offset": 0}}}, "not {dtype, shape, offset}"),
        ({"tensors": {"keys": {"dtype": "float32", "shape": [1 << 30], "offset": 0}}}, "ends past the data"),
        ({"tensors": {"keys": {"dtype": "float32", "shape": [-4, 2], "offset": 0}}}, "ends past the data"),
        ({"tensors": {"keys": {"dtype": "int64", "shape": [4], "offset": -8}}}, "ends past the data"),
    ],
)
def test_the_child_refuses_an_entry_outside_the_arena(change: dict, message: str) -> None:
    arena = Arena()
    try:
        layout, _ = arena.place(tensors(1))
        with pytest.raises(WireError, match=message.replace("{", r"\{").replace("}", r"\}")):
            ArenaReader().tensors({**layout, "folder": str(arena.folder), **change})
    finally:
        arena.close()


SCORER = """
from kvbench import EvictionView, Policy, policy

@policy("mixed-norms")
class MixedNorms(Policy):
    needs = frozenset({"queries"})

    def score(self, view: EvictionView):
        keys, values = view.keys.float(), view.values.float()
        attention = (view.queries.float()[:, ::2, -1:] @ keys.transpose(-1, -2)).squeeze(2)
        return values.norm(dim=-1) - 0.1 * keys.norm(dim=-1) + attention + 1e-4 * view.positions.float()
"""


@needs_sandbox
def test_scores_through_the_arena_are_the_in_process_scorers(tmp_path: Path) -> None:
    path = scorer(tmp_path, SCORER)
    apart = started_policy(path, "MixedNorms", {})
    here = make_policy(f"{path}:MixedNorms")
    kept = []
    for policy in (here, apart):
        model = synthetic_model(layers=2, q_heads=4, kv_heads=2, head_dim=64)
        backend = RecordingBackend(
            policy, Schedule(budget=256, buffer=32), model, prompt_len=8, row_seeds=[3, 7]
        )  # fmt: skip
        for _ in range(400):
            backend.step()
        assert backend.evictor.stats.events >= 4
        kept.append([layer.positions.clone() for layer in backend.layers])
    assert apart.process is not None and apart.process.arena.files >= 1  # the arena carried them
    for here_positions, apart_positions in zip(*kept, strict=True):
        assert torch.equal(here_positions, apart_positions)


SOMETIMES_VALUES = """
from kvbench import EvictionView, Policy, policy

@policy("sometimes-values")
class SometimesValues(Policy):
    def score(self, view: EvictionView):
        scores = view.keys.float().norm(dim=-1)
        if view.event % 2 == 1:  # the values from the second event on: they cross when it reads them
            scores = scores + view.values.float().norm(dim=-1)
        return scores
"""


@needs_sandbox
def test_a_scorer_is_sent_the_view_tensors_it_reads_and_the_others_when_it_reads_them(tmp_path: Path) -> None:
    path = scorer(tmp_path, SOMETIMES_VALUES)
    apart = started_policy(path, "SometimesValues", {})
    here = make_policy(f"{path}:SometimesValues")
    kept, read = [], []
    for policy in (here, apart):
        model = synthetic_model(layers=2, q_heads=4, kv_heads=2, head_dim=64)
        schedule = Schedule(budget=256, buffer=32)
        backend = RecordingBackend(policy, schedule, model, prompt_len=8, row_seeds=[3, 7])
        for _ in range(400):
            backend.step()
            if policy is apart and backend.evictor.stats.events == 1:  # event 0, both layers: keys only
                read.append(set(apart.read or ()))
        assert backend.evictor.stats.events >= 4
        kept.append([layer.positions.clone() for layer in backend.layers])
    for here_positions, apart_positions in zip(*kept, strict=True):
        assert torch.equal(here_positions, apart_positions)
    assert read[0] == {"keys"} and apart.read == {"keys", "values"}


@needs_sandbox
def test_the_child_can_neither_write_nor_shrink_the_arena(tmp_path: Path) -> None:
    body = """
    import glob, mmap
    said = []
    for path in glob.glob("/arena/*.arena"):
        for what, act in (("open for writing", lambda: open(path, "r+b")),
                          ("truncate", lambda: os.truncate(path, 0)),
                          ("remove", lambda: os.remove(path))):
            try:
                act()
                said.append(f"{what}: done")
            except OSError as exc:
                said.append(f"{what}: errno {exc.errno}")
    def on_file():
        with open(glob.glob("/arena/*.arena")[0], "rb") as f:
            return bytes(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
    before, seen = on_file(), view.keys.clone()
    view.keys.add_(1.0)
    said.append(f"keys changed here: {not torch.equal(view.keys, seen)}")
    said.append(f"file unchanged by the write: {on_file() == before}")
    raise RuntimeError("; ".join(said))
    """
    policy = hostile(tmp_path, body)
    model = synthetic_model(layers=1, q_heads=4, kv_heads=2, head_dim=64)
    backend = RecordingBackend(policy, Schedule(budget=256, buffer=32), model, prompt_len=8, row_seeds=[3, 7])
    with pytest.raises(ScorerError) as raised:
        for _ in range(400):
            backend.step()
    message = str(raised.value)
    # EACCES (the parent's file, mode 0644, and another user) or EROFS (the folder is bound read-only)
    for what in ("open for writing", "truncate", "remove"):
        assert f"{what}: errno 13" in message or f"{what}: errno 30" in message, message
    assert "done" not in message, message
    assert "keys changed here: True" in message and "file unchanged by the write: True" in message, message
    assert os.path.isdir(policy.process.arena.folder)


def test_an_arena_that_cannot_take_its_pages_leaves_every_tensor_to_the_pipe() -> None:
    """A file that cannot grow (here the file-size limit; a full tmpfs, as a container's 64 MiB /dev/shm
    fills, fails the same way) is refused when made, never by SIGBUS in the middle of a write."""
    script = """
import resource, signal, torch
from kvbench.isolation.arena import Arena
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
arena = Arena()
big = {"keys": torch.ones(4, 1 << 20), "small": torch.ones(3)}
layout, left = arena.place(big)
print(sorted(layout), sorted(left), sorted(p.name for p in arena.folder.iterdir()))
arena.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] ['keys', 'small'] []"
