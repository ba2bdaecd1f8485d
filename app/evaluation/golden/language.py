"""A query's language, as the segments and the generated cases call it: "zh" or "en"."""

from __future__ import annotations


def is_cjk(ch: str) -> bool:
    """A CJK ideograph (the Unified Ideographs blocks, extension A, the compatibility block, and
    extensions B and later in planes 2-3)."""
    code = ord(ch)
    return (
        0x4E00 <= code <= 0x9FFF
        or 0x3400 <= code <= 0x4DBF
        or 0xF900 <= code <= 0xFAFF
        or 0x20000 <= code <= 0x3FFFF
    )


def query_language(text: str) -> str:
    """ "zh" when more than half of the query's letters (`str.isalpha`) are CJK ideographs, else "en"
    (a query with no letters is "en")."""
    letters = [ch for ch in text if ch.isalpha()]
    cjk = sum(1 for ch in letters if is_cjk(ch))
    return "zh" if letters and 2 * cjk > len(letters) else "en"
