"""transformers' progress bars as a terminal or a log wants them while a model loads.

A tqdm bar redraws its line with carriage returns: live on a terminal, but in a log (stderr piped) one
line of thousands of characters per bar. So a bar is drawn only where stderr is a terminal and
transformers' bars are enabled, and never in a quiet run.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import TextIO

from transformers.utils import logging as transformers_logging


@contextlib.contextmanager
def bars_where_seen(shown: bool = True) -> Iterator[TextIO]:
    """Inside, bars are live on a terminal, absent otherwise or where not ``shown`` (a quiet run); yields
    the stream to report progress on.

    transformers' own bars follow its switch (``disable_progress_bar``, restored after). Its GGUF reader
    draws a plain tqdm bar that neither its switch nor huggingface_hub's reaches, so while bars are off,
    what is written to ``sys.stderr`` inside is held and written after, lines holding a carriage return
    (a bar's redraws) left out; a warning is delayed, never lost."""
    stderr = sys.stderr
    if shown and stderr.isatty() and transformers_logging.is_progress_bar_enabled():
        yield stderr
        return
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held):
            yield stderr
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()
        # what was held, without its lines that hold a carriage return (a bar's redraws)
        stderr.write("".join(line for line in io.StringIO(held.getvalue(), newline="\n") if "\r" not in line))
        stderr.flush()
