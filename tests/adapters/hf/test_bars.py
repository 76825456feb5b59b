"""While a model loads, transformers' progress bars are live on a terminal and absent from a log: a bar
redrawn with carriage returns is one line of thousands of characters in a log. Real tqdm bars, a real
pseudo-terminal."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import sys
import termios
import time

import pytest
from tqdm.auto import tqdm
from transformers.utils import logging as transformers_logging

from kvbench.adapters.hf.bars import bars_where_seen


def _draw(label: str) -> None:
    """What the GGUF reader does: a plain tqdm bar on stderr, which no transformers switch reaches; and
    what transformers' loaders do: its own bar, which its switch does."""
    for _ in tqdm(range(3), desc=label, mininterval=0):
        time.sleep(0.01)
    for _ in transformers_logging.tqdm(range(3), desc=f"{label} (transformers)", mininterval=0):
        pass


def _terminal() -> tuple[int, int]:
    """A pseudo-terminal of 40 rows and 120 columns (tqdm draws nothing on one of size 0)."""
    leader, follower = os.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    return leader, follower


def _shown(leader: int) -> str:
    """What the terminal received (never blocking on an empty one)."""
    shown = b""
    while select.select([leader], [], [], 0.5)[0]:
        shown += os.read(leader, 1 << 16)
    return shown.decode()


def test_a_log_gets_the_lines_written_and_no_bar(capsys: pytest.CaptureFixture[str]) -> None:
    with bars_where_seen() as report:
        print("converting, once", file=report)
        _draw("Converting")
        print("a warning written on stderr meanwhile", file=sys.stderr)
        print("converted in 1 s", file=report)
    err = capsys.readouterr().err
    assert "\r" not in err and "Converting" not in err
    assert err == "converting, once\nconverted in 1 s\na warning written on stderr meanwhile\n"
    assert transformers_logging.is_progress_bar_enabled()  # the switch is as it was


def test_a_terminal_gets_live_bars(monkeypatch: pytest.MonkeyPatch) -> None:
    leader, follower = _terminal()
    with os.fdopen(follower, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        with bars_where_seen() as report:
            assert report is terminal
            _draw("Converting")
        terminal.flush()
        shown = _shown(leader)
    os.close(leader)
    assert "\rConverting: 100%" in shown and "\rConverting (transformers): 100%" in shown


def test_a_quiet_run_gets_no_bar_on_a_terminal_either(monkeypatch: pytest.MonkeyPatch) -> None:
    leader, follower = _terminal()
    try:
        with os.fdopen(follower, "w") as terminal:
            monkeypatch.setattr(sys, "stderr", terminal)
            with bars_where_seen(shown=False) as report:  # a --quiet run's backend loads so
                print("converting, once", file=report)
                _draw("Converting")
            terminal.flush()
            shown = _shown(leader)
        assert transformers_logging.is_progress_bar_enabled()  # the switch is as it was
    finally:
        os.close(leader)
    assert shown.replace("\r\n", "\n") == "converting, once\n"
