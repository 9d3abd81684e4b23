"""courtly's own errors of a fetch, and errors as the user reads them: one line of valid text,
never a traceback."""

from __future__ import annotations

import traceback
from pathlib import Path

from courtly.model import ExitCode


def one_line(exc: BaseException | str) -> str:
    """An exception or a message as one line of valid text (at most 300 characters)."""
    text = exc if isinstance(exc, str) else str(exc) or type(exc).__name__
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return " ".join(text.split())[:300]


def describe(exc: BaseException, where: bool = True) -> str:
    """One line: the exception's type and message and, with `where`, the innermost place it was
    raised (-vv logs the traceback)."""
    text = f"{type(exc).__name__}: {one_line(str(exc))}" if str(exc) else type(exc).__name__
    tb = traceback.extract_tb(exc.__traceback__) if where else None
    return text + (f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno})" if tb else "")


class FetchError(Exception):
    """A fetch that ended without a usable response, with the exit code to log.

    stale: a kept-alive connection was closed by the server before any byte of the response
    (the request may be sent again at once on a new connection).
    status: the response's status when its head had arrived before the fetch failed (a 404
    whose body never came is still a 404 to robots.txt's rules).
    partial: then, the response so far (request head, response head, the body until the
    fault) and `cut`, why it is short, as WARC-Truncated says it (the WARC files keep it).
    """

    def __init__(self, exit_code: ExitCode, detail: str, stale: bool = False,
                 status: int | None = None, partial: tuple[bytes, bytes, bytes] | None = None,
                 cut: str = "unspecified") -> None:
        super().__init__(detail)
        self.exit_code = exit_code
        self.detail = detail
        self.stale = stale
        self.status = status
        self.partial = partial
        self.cut = cut  # or length, time, disconnect


class LocalError(Exception):
    """A fetch that failed for want of courtly's own resources (file descriptors, buffers,
    memory, disk): never the site's fault. Not a FetchError, so no crawl action can log it."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ArchiveError(Exception):
    """A WARC file could not be written (crawl --warc): the crawl stops."""
