"""Ctrl-C outside a crawl's loop (which stops on it, tests/test_resume.py): a quiet exit 130."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def installed_script() -> list[str]:
    """The `courtly` script as an installer writes it from pyproject.toml's [project.scripts]."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["courtly"]
    module, function = target.split(":")
    return ["-c", f"import sys; from {module} import {function}; sys.exit({function}())"]


@pytest.mark.parametrize("entry", [["-m", "courtly"], installed_script()],
                         ids=["python -m courtly", "the installed script"])
def test_ctrl_c_while_the_modules_load_exits_quietly(entry: list[str], tmp_path: Path) -> None:
    """SIGINT while courtly.cli was being imported printed a KeyboardInterrupt traceback."""
    # -X importtime: a line as each module is loaded; asyncio is the command's first import
    proc = subprocess.Popen([sys.executable, "-X", "importtime", *entry, "stats", "--db",
                             str(tmp_path / "crawl.db")], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.split("|")[-1].strip() == "asyncio":
            proc.send_signal(signal.SIGINT)  # courtly.config, click... are still to come
            break
    err = "".join(seen) + proc.stderr.read()
    proc.wait(timeout=30)
    assert "asyncio" in seen[-1], err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == 130, err


def test_ctrl_c_in_a_command_exits_quietly(tmp_path: Path) -> None:
    """SIGINT while add-seeds read its seeds file: click's `Aborted!` and status 1 (the status
    of a database failure) before; now nothing, 130, and no database."""
    fifo = tmp_path / "seeds"
    os.mkfifo(fifo)
    db = tmp_path / "crawl.db"
    proc = subprocess.Popen([sys.executable, "-m", "courtly", "add-seeds", "--seeds-file",
                             str(fifo), "--db", str(db)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while True:  # until the command opens the seeds file to read it (a writer may open then)
        try:
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:
            assert exc.errno == errno.ENXIO and time.monotonic() < deadline
            time.sleep(0.01)
    try:
        proc.send_signal(signal.SIGINT)  # it waits for the seeds
        _, err = proc.communicate(timeout=30)
    finally:
        os.close(writer)
    assert (proc.returncode, err) == (130, "")
    assert not db.exists()
