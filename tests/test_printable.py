"""Text from a scorer or a bundle reaches the operator's terminal as text: control characters are printed
by their escapes (kvbench.commands.common.printable), by the real command in a subprocess as by its
consoles."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from rich.table import Table

from kvbench.commands.common import text_console
from kvbench.printable import printable

KVBENCH = str(Path(sys.executable).parent / "kvbench")
HOSTILE = "\x1b]0;pwned\x07\x1b[2J"
"""OSC 0 retitles the terminal, CSI 2J clears it."""
SHOWN = r"\x1b]0;pwned\x07\x1b[2J"


def test_every_control_character_is_shown_by_its_escape() -> None:
    text = "a\x1b[31mb\x9b2Jc\x7fd\u202ee\x00f\nG\th\\"
    assert printable(text) == r"a\x1b[31mb\x9b2Jc\x7fd\u202ee\x00f\nG\th" + "\\"
    assert printable(text, lines=True) == r"a\x1b[31mb\x9b2Jc\x7fd\u202ee\x00f" + "\nG\th\\"
    # every C0 and C1 control and DEL: none is left for a terminal to act on
    controls = "".join(map(chr, [*range(0x20), 0x7F, *range(0x80, 0xA0)]))
    assert printable(controls).isprintable() and printable(controls).isascii()


def test_a_scorers_exception_message_is_printed_escaped_by_kvbench_run(tmp_path: Path) -> None:
    # the file holds the message as Python escapes: only the raised exception carries the raw bytes
    (tmp_path / "scorer.py").write_text(
        "from kvbench import EvictionView, Policy, policy\n\n\n"
        "@policy('pwn')\nclass Scorer(Policy):\n    '''Raises a message with escape sequences.'''\n\n"
        "    def score(self, view: EvictionView):\n"
        f"        raise RuntimeError({HOSTILE!r})\n"
    )
    args = ("--model", "tiny-qwen3", "--task", "passkey", "--limit", "1", "--samples", "1", "--no-baselines")
    done = subprocess.run(
        [KVBENCH, "run", "--policy", f"{tmp_path / 'scorer.py'}:Scorer", *args, "--quiet"],
        capture_output=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr
    assert b"\x1b" not in done.stdout + done.stderr and b"\x07" not in done.stdout + done.stderr
    stderr = done.stderr.decode()
    assert "policy 'pwn' at layer 0, eviction event 0 raised RuntimeError" in stderr, stderr
    assert SHOWN in stderr, stderr


def test_the_console_prints_no_control_character_of_a_table_cell_or_a_line() -> None:
    """The consoles' last guard, for text printed without printable(): rich's own style codes stay."""
    out = io.StringIO()
    console = text_console(file=out, force_terminal=True, width=120)
    table = Table("policy", "detail")
    table.add_row(f"x{HOSTILE}[red]y[/]", "\x9b2J")
    console.print(table)
    console.print(f"a line {HOSTILE}", style="bold")
    written = out.getvalue()
    assert "\x1b]" not in written and "\x1b[2J" not in written and "\x9b" not in written, repr(written)
    assert r"\x1b]0;pwned\x1b[2J[red]y[/]" in written  # rich drops BEL itself; markup is text
    assert "\x1b[1m" in written  # the console's own bold


def test_kvbench_list_prints_an_installed_policys_docstring_escaped(tmp_path: Path) -> None:
    """An installed package's policy (entry point group kvbench.policies) describes itself."""
    info = tmp_path / "pwnplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pwnplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kvbench.policies]\npwn-plug = pwnplug:Plug\n")
    (tmp_path / "pwnplug.py").write_text(
        "from kvbench import Policy, policy\n\n\n"
        f"@policy('pwn-plug')\nclass Plug(Policy):\n    {('Keeps all. ' + HOSTILE)!r}\n"
    )
    done = subprocess.run(
        [KVBENCH, "list", "policies"],
        capture_output=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert b"\x1b" not in done.stdout + done.stderr and b"\x07" not in done.stdout
    assert f"pwn-plug\tKeeps all. {SHOWN}" in done.stdout.decode().splitlines()


def test_every_control_format_separator_and_surrogate_code_point_is_escaped() -> None:
    """Counted here from this Python's Unicode database, not from kvbench's table: each character of
    category Cc, Cf, Cs, Zl or Zp comes out as its escape, and the text rule refuses each one too."""
    import unicodedata

    from kvbench.submissions.text import NAME, text_problem

    hidden = [c for c in range(0x110000) if unicodedata.category(chr(c)) in {"Cc", "Cf", "Cs", "Zl", "Zp"}]
    assert len(hidden) > 2200  # 65 controls, 2048 surrogates, 160-odd format characters, 2 separators
    for code in hidden:
        assert printable(chr(code)) == ascii(chr(code))[1:-1], hex(code)
        if not 0xD800 <= code < 0xE000:
            assert text_problem(f"a{chr(code)}b", NAME), hex(code)
    assert printable("Jane \u061cDoe\u2028\xad\U000e0041") == "Jane \\u061cDoe\\u2028\\xad\\U000e0041"


# Unicode 15.1's DerivedCoreProperties.txt, Default_Ignorable_Code_Point, less what is Cf (checked above):
# written out here, as Python's unicodedata does not carry the property
DEFAULT_IGNORABLE_NOT_CF = [
    0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, *range(0x180B, 0x180E), 0x180F, 0x2065, 0x3164,
    *range(0xFE00, 0xFE10), 0xFFA0, *range(0xFFF0, 0xFFF9), 0xE0000, *range(0xE0002, 0xE0020),
    *range(0xE0080, 0xE1000),
]  # fmt: skip


def test_every_default_ignorable_code_point_is_escaped_and_refused() -> None:
    """Invisible where shown (a grapheme joiner, fillers, variation selectors): a submitter that reads as
    another group's name while it carries a hidden message is refused, and escaped wherever printed."""
    from kvbench.submissions.text import SUBMITTER, text_problem

    for code in DEFAULT_IGNORABLE_NOT_CF:
        assert printable(chr(code)) == ascii(chr(code))[1:-1], hex(code)
        assert text_problem(f"a{chr(code)}b", SUBMITTER), hex(code)
