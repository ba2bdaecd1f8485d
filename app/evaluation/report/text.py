"""Text made safe for the Markdown reports: what a case id, query, tag or document id may carry, escaped so
the report stays inert in a Markdown viewer (no link, image, autolink or HTML made of it) and readable in a
terminal. A leaf: it imports nothing from the app."""

from __future__ import annotations

import re

# Escaped, and nothing else (prose like "0.71 < 0.80", "1 -> 0", ">= 0.7" or "(grade 1)" reads as it is):
# - `[` and `]`: no link, image or reference can open or close without them; a `(` right after a `]`, so
#   the file never holds `](` either;
# - `<` before anything that could open a tag, comment, declaration, autolink (`<http:...>`) or email
#   autolink (`<1x@host>`): a letter, a digit, `/`, `!`, `?` or another character of an email's local part;
#   `>` after a letter, digit, quote or `/` (what could close a tag); `&` before a letter or `#` (an entity);
# - a backslash before ASCII punctuation or at the end, so that it cannot undo an escape or take the next
#   character of the line;
# - C0 and C1 controls, DEL, line and paragraph separators and lone surrogates, as visible `\u0000` escapes.
_UNSAFE = re.compile(
    r"[\[\]]|(?<=\])\("
    r"|<(?=[A-Za-z0-9/!?.#$%&'*+=^_`{|}~-])|(?<=[A-Za-z0-9\"'/])>|&(?=[A-Za-z#])"
    r"|\\(?=[!-/:-@\[-`{-~]|$)"
    "|[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]"
)
_ESCAPES = {"<": "&lt;", ">": "&gt;", "&": "&amp;", "[": "\\[", "]": "\\]", "(": "\\(", "\\": "\\\\"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or f"\\u{ord(char):04x}"


def md_text(text: object) -> str:
    """`text` safe to put in the report: see the module docstring. Apply it once, where the text enters the
    Markdown (escaping twice shows the escapes)."""
    return _UNSAFE.sub(_escape, str(text))
