"""Whether a process of this machine still runs (a fleet worker's, a WARC file's writer)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True unless no process has this id (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
