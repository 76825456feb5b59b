"""What the host takes from an isolated scorer is bounded in advance: a reply by what its request can
return, a run by its time limit, and the arena's files are readable by the host and the scorer only."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from isolated_scorers import hostile, run_through, stop_scorers  # noqa: F401

from kvbench.errors import ScorerError


def test_a_reply_announcing_more_than_its_request_can_return_is_refused_before_it_is_allocated(
    tmp_path: Path,
) -> None:
    body = """
    ours = {os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 2)}
    head = b'[{"ok": true}, {}]'
    for fd in map(int, os.listdir("/proc/self/fd")):
        link = os.readlink(f"/proc/self/fd/{fd}") if fd > 2 else ""
        if link.startswith("pipe:") and link not in ours:  # the reply channel: 4 GiB announced, none sent
            os.write(fd, len(head).to_bytes(8, "big") + head + (1 << 32).to_bytes(8, "big"))
    time.sleep(60)
    """
    started = time.monotonic()
    with pytest.raises(ScorerError) as raised:
        run_through(hostile(tmp_path, body, seconds=20), steps=20)
    assert time.monotonic() - started < 15  # refused at the announcement, not at the time limit
    assert "a payload of 4,294,967,296 bytes announced, over the bound of" in str(raised.value), raised.value


def test_calls_each_within_their_limit_stop_at_the_limit_per_run(tmp_path: Path) -> None:
    policy = hostile(tmp_path, "time.sleep(0.5)", seconds=30, seconds_per_run=2)
    with pytest.raises(ScorerError) as raised:
        run_through(policy, steps=40)
    assert "the time limit per run (2 s for all of one run's calls, --scorer-run-seconds)" in str(
        raised.value
    ), raised.value


@pytest.mark.skipif(os.geteuid() != 0, reason="reads as another user, which only root may start")
def test_an_arena_file_is_readable_by_the_host_and_its_scorer_only(tmp_path: Path) -> None:
    policy = hostile(tmp_path, "pass")
    run_through(policy, steps=20)
    arena = policy.process.arena
    path = arena.folder / arena.name
    mode = stat.S_IMODE(path.stat().st_mode)
    assert mode & 0o007 == 0 and path.stat().st_gid == arena.group != 0, oct(mode)
    other = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c"]
    done = subprocess.run([*other, f"open({str(path)!r}, 'rb').read(1)"], capture_output=True, text=True)
    assert done.returncode != 0 and "PermissionError" in done.stderr, done.stderr


def test_a_layer_state_grown_at_every_call_is_stopped_at_the_state_kvbench_keeps(tmp_path: Path) -> None:
    """Each reply may hold the state back at twice its size, and kvbench keeps every layer's: a scorer
    that doubles its state at each event would grow kvbench's own memory without bound. At 8 MiB for all
    layers, the event that passes it is refused with the sizes named."""
    body = """
    sent = sum(t.numel() * t.element_size() for t in view.state._rows.values())
    rows = view.keys.shape[0]
    view.state._rows.clear()
    view.state._rows[f"g{sent}"] = torch.ones(rows, (2 * sent + (1 << 20)) // rows, dtype=torch.uint8)
    """
    policy = hostile(tmp_path, body, state_bytes=8 << 20)
    with pytest.raises(ScorerError) as raised:
        run_through(policy, steps=80)
    message = str(raised.value)
    assert "the scorer returned a layer state of " in message, message
    assert "MiB passes the 0.0078125 GiB of state kvbench keeps for one scorer" in message, message
    held = sum(policy.state_held.values())
    assert 0 < held <= 8 << 20, held
