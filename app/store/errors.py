"""The store's base error, apart from the modules that raise it (app/store/chroma.py, record.py, space.py),
so that each can import it without importing the others."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The store cannot be used as asked; the message says why and what to do."""
