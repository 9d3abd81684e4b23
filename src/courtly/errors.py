"""Errors as the user reads them: one line of valid text, never a traceback."""

from __future__ import annotations

import traceback
from pathlib import Path


def one_line(exc: BaseException | str) -> str:
    """An exception or a message as one line of valid text (at most 300 characters)."""
    text = exc if isinstance(exc, str) else str(exc) or type(exc).__name__
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return " ".join(text.split())[:300]


def describe(exc: BaseException) -> str:
    """One line: the exception and the innermost place it was raised (-vv logs the traceback)."""
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else ""
    text = f"{type(exc).__name__}: {one_line(str(exc))}" if str(exc) else type(exc).__name__
    return text + where
