"""A scorer from a file, run in its own process behind the sandbox: it decides exactly what it decides in
kvbench's process, it reaches nothing outside its boundary, and whatever it does wrong is named."""

from __future__ import annotations

import gc
import os
import socket
import sys
import textwrap
import time
import weakref
from pathlib import Path

import pytest
import torch
from isolated_scorers import hostile, run_through, scorer, started_policy, stop_scorers  # noqa: F401 (a fixture)

from kvbench.errors import ScorerError, SpecError
from kvbench.isolation.host import IsolatedPolicy
from kvbench.registry import load_file_policy, policy_record
from support import needs_sandbox

pytestmark = needs_sandbox

STATEFUL = textwrap.dedent(
    '''
    """Accumulated attention, the recent queries' attention and a random jitter: every part of the
    contract an isolated scorer must see exactly as an in-process one does."""
    import torch
    from kvbench import Policy, policy


    @policy("accumulating-jitter", needs={"step_attention", "queries"})
    class AccumulatingJitter(Policy):
        jitter: float = 0.05

        @property
        def query_window(self) -> int:
            return 4

        def observe(self, step):
            b, hq, q, s = step.attention.shape
            received = step.attention.view(b, step.model.num_kv_heads, -1, q, s).mean(dim=2).sum(dim=2)
            if step.state.has_slot("acc"):
                step.state.set_slot("acc", step.state.slot("acc") + received)
            else:
                step.state.register_slot("acc", received, fill=0.0)
            calls = step.state.row("calls") + 1 if step.state.has_row("calls") else torch.ones(b)
            step.state.set_row("calls", calls)

        def score(self, view):
            b, hkv, n, d = view.keys.shape
            queries = view.queries[:, :, -4:].reshape(b, hkv, -1, d)
            attention = torch.softmax(queries @ view.keys.transpose(-1, -2) / d**0.5, dim=-1).mean(dim=2)
            return view.candidate_slot("acc") + attention + self.jitter * view.uniform(hkv, n)
    '''
)


def test_isolated_and_in_process_keep_the_same_tokens_state_and_draws(tmp_path: Path) -> None:
    path = scorer(tmp_path, STATEFUL)
    local = run_through(load_file_policy(str(path), "AccumulatingJitter").cls())
    isolated = started_policy(path, "AccumulatingJitter", {})
    apart = run_through(isolated)
    assert local.evictor.stats.events >= 3
    for ours, theirs in zip(local.layers, apart.layers, strict=True):
        assert torch.equal(ours.positions, theirs.positions)
        assert torch.equal(ours.state.slot("acc"), theirs.state.slot("acc"))
        assert (
            ours.state.row("calls").tolist() == theirs.state.row("calls").tolist() == [31.0, 31.0]
        )  # the prompt and 30 steps
    # the same identity in and out of process: name, parameters and the file's hash
    assert policy_record(isolated) == policy_record(local.policy)
    assert (
        policy_record(isolated)["source_sha256"]
        == __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    )


def test_the_scorer_reaches_no_file_no_network_and_no_environment_outside(tmp_path: Path) -> None:
    results = tmp_path / "runs"
    results.mkdir()
    (results / "secret.txt").write_text("the null's outputs")
    os.environ["KVBENCH_TEST_SECRET"] = "hunter2"
    # kvbench's own Python, bound read-only (a home folder under /tmp would meet the sandbox's own /tmp)
    planted = Path(sys.prefix) / "planted"
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        for attempt, expected in [
            (f"open({str(results / 'secret.txt')!r}).read()", "FileNotFoundError"),
            (f"open({str(planted)!r}, 'w')", "OSError: [Errno 30] Read-only file system"),
            (f"socket.create_connection(('127.0.0.1', {port}), timeout=1)", "ConnectionRefusedError"),
            (
                "assert 'KVBENCH_TEST_SECRET' not in os.environ, 'saw it'\nraise RuntimeError('contained')",
                "RuntimeError: contained",
            ),
        ]:
            with pytest.raises(ScorerError) as raised:
                run_through(hostile(tmp_path, attempt), steps=20)
                pytest.fail(f"the scorer did {attempt!r}")
            assert "policy 'hostile' at layer 0, eviction event 0 raised" in str(raised.value)
            assert expected in str(raised.value), str(raised.value)
        assert not planted.exists()
    finally:
        listener.close()
        del os.environ["KVBENCH_TEST_SECRET"]


def test_runs_of_one_scorer_share_its_process_each_with_its_own_instance(tmp_path: Path) -> None:
    """A sweep's cells, or a bundle's runs under verification, start the scorer's process once."""
    path = scorer(tmp_path, STATEFUL)
    first = started_policy(path, "AccumulatingJitter", {"jitter": 0.0})
    began = time.monotonic()
    second = started_policy(path, "AccumulatingJitter", {"jitter": 0.5})
    print(f"second run's start: {time.monotonic() - began:.3f} s")
    assert second.process is first.process and first.process is not None
    assert time.monotonic() - began < 0.5  # a hello, not a process start
    for policy, jitter in ((first, 0.0), (second, 0.5), (first, 0.0)):  # interleaved, each its own
        local = run_through(load_file_policy(str(path), "AccumulatingJitter").cls(jitter=jitter), steps=12)
        apart = run_through(policy, steps=12)
        for ours, theirs in zip(local.layers, apart.layers, strict=True):
            assert torch.equal(ours.positions, theirs.positions)
    shared = first.process
    first.close()
    assert shared.alive()  # the second run still holds it
    run_through(second, steps=12)
    unused = started_policy(path, "AccumulatingJitter", {"jitter": 0.0})
    shared.process.kill()  # the shared process ends before this run's first event: it gets a new one
    shared.process.wait()
    run_through(unused, steps=12)
    assert unused.process is not shared and unused.process is not None and unused.process.alive()
    with pytest.raises(ScorerError, match="no longer running"):  # a run it served cannot go on
        run_through(second, steps=12)
    second.close()
    unused.close()
    assert not shared.alive()


def test_a_scorer_process_goes_with_its_last_run_not_with_its_stderr_thread(tmp_path: Path) -> None:
    """Only the runs hold a scorer's process; the thread that reads its stderr does not. One that did was
    the last to hold it when the child died at interpreter exit, and freeing the tensors its arena held on
    a thread Python was finalizing aborted kvbench ("terminate called without an active exception")."""
    policy = IsolatedPolicy(scorer(tmp_path, STATEFUL), "AccumulatingJitter", {})
    run_through(policy, steps=12)
    assert policy.process is not None
    process, child = weakref.ref(policy.process), policy.process.process
    del policy
    gc.collect()
    assert process() is None
    assert child.wait(timeout=30) is not None  # freed, it stopped its child


@pytest.mark.parametrize(
    ("action", "named"),
    [
        ("raise KeyboardInterrupt", "KeyboardInterrupt"),
        ("raise MemoryError('too much')", "MemoryError: too much"),
        ("raise SystemExit(0)", "SystemExit: 0"),
        ("raise ValueError('bad')", "ValueError: bad"),
    ],
)
def test_what_the_scorer_raises_is_named_with_its_policy_layer_and_event(
    tmp_path: Path, action: str, named: str
) -> None:
    with pytest.raises(ScorerError) as raised:
        run_through(hostile(tmp_path, action), steps=20)
    assert f"policy 'hostile' at layer 0, eviction event 0 raised {named}" in str(raised.value)


def test_a_scorer_that_never_returns_is_stopped_at_the_time_limit(tmp_path: Path) -> None:
    policy = hostile(tmp_path, "while True:\n    time.sleep(1)", seconds=3)
    started = time.monotonic()
    with pytest.raises(ScorerError) as raised:
        run_through(policy, steps=20)
    assert time.monotonic() - started < 30
    assert "policy 'hostile' at layer 0, eviction event 0: no answer within 3 s" in str(raised.value)
    assert policy.process is not None and policy.process.process.poll() is not None  # it was stopped


def test_a_scorer_that_exits_its_process_is_named(tmp_path: Path) -> None:
    with pytest.raises(ScorerError) as raised:
        run_through(hostile(tmp_path, "os._exit(3)"), steps=20)
    assert (
        "policy 'hostile' at layer 0, eviction event 0: the scorer's process broke off (exit status 3"
        in str(raised.value)
    )


def test_state_that_does_not_line_up_with_the_cache_is_refused(tmp_path: Path) -> None:
    body = "view.state.register_slot('bad', torch.zeros(1, 7, 3))"
    with pytest.raises(ScorerError, match=r"layer state 'slot.bad' of shape \(1, 7, 3\)"):
        run_through(hostile(tmp_path, body), steps=20)


def test_a_file_scorer_may_not_take_a_built_in_name(tmp_path: Path) -> None:
    path = scorer(tmp_path, STATEFUL.replace('"accumulating-jitter"', '"snapkv"'))
    for load in (
        lambda: load_file_policy(str(path), "AccumulatingJitter"),
        lambda: started_policy(path, "AccumulatingJitter", {}),
    ):
        with pytest.raises(SpecError, match="registers the name 'snapkv', which is the built-in policy"):
            load()
