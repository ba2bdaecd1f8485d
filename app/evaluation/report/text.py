"""Text made safe for the Markdown reports: what a case id, query, tag or document id may carry, escaped so
the report stays inert as HTML and readable in a terminal. A leaf: it imports nothing from the app."""

from __future__ import annotations

import re

# what could open a tag, comment or entity (`<` before a letter, "/", "!" or "?"; `&` before a letter or "#")
# and what could close a tag (`>` after a letter, digit, quote or "/"); C0 and C1 controls, DEL, line and
# paragraph separators, lone surrogates. Prose like "0.71 < 0.80", "1 -> 0" or ">= 0.7" reads as it is.
_UNSAFE = re.compile(
    "<(?=[A-Za-z/!?])|&(?=[A-Za-z#])|(?<=[A-Za-z0-9\"'/])>|[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]"
)
_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ENTITIES.get(char) or f"\\u{ord(char):04x}"


def md_text(text: object) -> str:
    """`text` safe to put in the report: see the module docstring."""
    return _UNSAFE.sub(_escape, str(text))
