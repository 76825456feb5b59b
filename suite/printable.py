"""Text from outside kvbench (a scorer's message, a bundle's names, parameters and labels) made safe to
print: the one function every printed line from such text goes through."""

from __future__ import annotations

# Every C0 and C1 control character and DEL (Unicode category Cc), and the bidirectional overrides that
# make a terminal show text in another order than it is: a scorer's message or a bundle's name with
# "\x1b]0;...\x07" would retitle the operator's terminal, "\x1b[2J" clear it, "\x9b" start a sequence on
# terminals that read C1. rich.control.escape_control_codes covers only BEL, BS, VT, FF and CR, and
# rich.text.Text drops those five and passes ESC through, so the table is written here. A lone surrogate
# (U+D800..U+DFFF, which a bundle's JSON can spell as "\ud800") is no character a terminal's UTF-8 can
# carry: written as it is, it ends the command in a UnicodeEncodeError.
FORMAT_CHARACTERS = "".join(
    map(
        chr,
        [
            0xAD,
            0x34F,
            *range(0x600, 0x606),
            0x61C,
            0x6DD,
            0x70F,
            0x890,
            0x891,
            0x8E2,
            0x115F,
            0x1160,
            0x17B4,
            0x17B5,
            *range(0x180B, 0x1810),
            *range(0x200B, 0x2010),
            *range(0x2028, 0x202F),
            *range(0x2060, 0x2070),
            0x3164,
            *range(0xFE00, 0xFE10),
            0xFEFF,
            0xFFA0,
            *range(0xFFF0, 0xFFFC),
            0x110BD,
            0x110CD,
            *range(0x13430, 0x13440),
            *range(0x1BCA0, 0x1BCA4),
            *range(0x1D173, 0x1D17B),
            *range(0xE0000, 0xE1000),
        ],
    )
)
"""Unicode's format characters (category Cf: zero-width, soft hyphen, bidirectional marks, overrides and
isolates, tags), its line and paragraph separators (Zl, Zp) and every other default-ignorable code point
(DerivedCoreProperties' Default_Ignorable_Code_Point: the combining grapheme joiner, Hangul and Khmer
fillers, Mongolian and other variation selectors, the E0000 block), to Unicode 15.1: shown as they are,
text reads in another order than it is, hides part of itself (a name that reads as another's, with a
message spelt in variation selectors), or breaks a line where none is."""
_UNPRINTABLE = [*range(0x20), 0x7F, *range(0x80, 0xA0), *map(ord, FORMAT_CHARACTERS), *range(0xD800, 0xE000)]
_ESCAPES = {code: ascii(chr(code))[1:-1] for code in _UNPRINTABLE}
_ESCAPES_IN_LINES = {code: text for code, text in _ESCAPES.items() if chr(code) not in "\n\t"}


def printable(text: object, *, lines: bool = False) -> str:
    """``text`` with every control character and lone surrogate shown as its Python escape (ESC as
    ``\\x1b``), for a terminal: the one way kvbench prints text that came from a scorer or a bundle (a
    name, a parameter, a message, a submitter). ``lines`` keeps newlines and tabs, for a multi-line
    message."""
    return str(text).translate(_ESCAPES_IN_LINES if lines else _ESCAPES)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""How a spreadsheet cell that it reads as a formula begins (OWASP's list for CSV injection)."""


def spreadsheet_cell(value: object) -> object:
    """A text cell of a CSV file as a spreadsheet shows it: one that would begin a formula (a submitter of
    ``=HYPERLINK(...)``) gets a leading apostrophe, so it is shown as the text it is. Numbers stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value
