"""The command line as a new user meets it: config files, environment, seeds, two crawls at once."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from courtly.store.sqlite import SqliteStore
from tests.conftest import candidates, courtly
from tests.test_bad_input import SEED, one_line, write


@pytest.mark.parametrize(("toml", "said"), [
    ("min_delay = 2\n[politeness]\nmin_delay = 1\n",
     "min_delay = 2 and politeness.min_delay = 1 both set it: keep one"),
    ("obey_robots = false\n[robots]\nobey = true\n",
     "obey_robots = false and robots.obey = true both set it: keep one"),
])
def test_a_config_that_sets_a_key_twice_is_refused(toml: str, said: str, tmp_path: Path) -> None:
    """The top-level shorthand won without a word: a file asking for a 1 s delay crawled at 2 s,
    one saying `obey = true` ignored robots.txt."""
    config = write(tmp_path / "crawl.toml", toml)
    for command in ("crawl", "add-seeds"):
        one_line(courtly(command, SEED, "--db", tmp_path / "c.db", "--config", config), 2,
                 f"{config}: {said}")
    assert not (tmp_path / "c.db").exists()
    same = write(tmp_path / "same.toml", "min_delay = 1\n[politeness]\nmin_delay = 1.0\n")
    assert courtly("add-seeds", SEED, "--db", tmp_path / "c.db", "--config", same).status == 0


@pytest.mark.parametrize("content", [None, "not a certificate\n"])
def test_an_ssl_cert_file_that_does_not_load_is_one_line(
        content: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenSSL skips an SSL_CERT_FILE it cannot load: the crawl ran, and every HTTPS site failed
    its certificate check (robots.txt unavailable, the origin given up), exit status 0."""
    bundle = tmp_path / "ca.pem"
    if content is not None:
        bundle.write_text(content)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    run = courtly("crawl", "https://127.0.0.1:9/", "--db", tmp_path / "c.db", "--progress", "off")
    one_line(run, 2, f"SSL_CERT_FILE: cannot load CA certificates from {bundle}")


def test_a_refused_second_crawl_leaves_its_seeds_out(tmp_path: Path) -> None:
    """The second `crawl` on a file said "another courtly crawl is running", yet had written its
    seeds and their origins into the database first."""
    db = tmp_path / "c.db"
    first = SqliteStore(str(db))
    first.begin_run()  # what a running crawl holds
    try:
        second = courtly("crawl", SEED + "other", "--db", db, "--min-delay", "0")
        one_line(second, 1, f"another courtly crawl is running on {db}")
        assert first.configured_origins() == []
    finally:
        first.close()
    assert candidates(db) == {}


def test_crawl_help_names_each_flags_default() -> None:
    """`courtly crawl --help` named no default: where the crawl database goes, what 0 actions
    means, how fast, how many origins at once were in the README only."""
    run = courtly("crawl", "--help")
    assert run.status == 0, run.err
    text = " ".join(run.out.split())
    for said in ("postgresql:// URL. [default: courtly.db]", "(0: no budget). [default: 0]",
                 "origin. [default: 1.0]", "at once. [default: 32]", "[default: breadth-first]",
                 "[default: auto]", "(# comments)"):
        assert said in text, said


def test_a_database_in_a_missing_directory_is_named_so(tmp_path: Path) -> None:
    """SQLite's "unable to open database file" was all a user read of a typo in --db's folder."""
    db = tmp_path / "missing" / "c.db"
    for command in ("crawl", "add-seeds"):
        one_line(courtly(command, SEED, "--db", db), 1,
                 f"cannot create database {db}: no directory {db.parent}")
    assert not db.parent.exists()


def test_a_bad_seed_in_a_seeds_file_is_named_with_its_line(tmp_path: Path) -> None:
    """In a file of 100,000 seeds, the one bad seed was named without its file and line."""
    lines = [f"http://127.0.0.1:1/p{i}" for i in range(100_000)]
    lines[50_000:50_000] = ["htp://127.0.0.1:1/typo", "http://a..b/"]
    seeds = write(tmp_path / "seeds.txt", "\r\n".join(lines) + "\r\n")
    one_line(courtly("add-seeds", "--seeds-file", seeds, "--db", tmp_path / "c.db"), 2,
             f"seeds file {seeds}, line 50001: invalid seed URL (need an absolute http or https "
             "URL): 'htp://127.0.0.1:1/typo'")
    del lines[50_000]
    write(seeds, "\n".join(lines))
    one_line(courtly("crawl", "--seeds-file", seeds, "--db", tmp_path / "c.db"), 2,
             f"seeds file {seeds}, line 50001: invalid seed URL (its host name has an empty label)")
    assert not (tmp_path / "c.db").exists()


def test_an_export_that_fails_leaves_the_older_file_as_it_was(tmp_path: Path) -> None:
    """An export over an existing file that failed half-way (here: past the file size limit,
    as a full disk would) left it cut short: the last good export was lost."""
    db, out = tmp_path / "c.db", tmp_path / "out.jsonl"
    seeds = [f"http://127.0.0.1:9/page-{i}" for i in range(2000)]
    assert courtly("add-seeds", *seeds, "--db", db).status == 0
    out.write_text("the last good export\n")
    out.chmod(0o640)

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    run = subprocess.run([sys.executable, "-m", "courtly", "export", "--db", str(db),
                          "--out", str(out)], capture_output=True, text=True,
                         preexec_fn=limited, check=False)
    assert run.returncode == 2 and run.stderr.startswith(f"courtly: cannot write {out}: "), run
    assert out.read_text() == "the last good export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.db", "out.jsonl"]
    assert courtly("export", "--db", db, "--out", out).status == 0  # whole: replaced
    assert len(out.read_text().splitlines()) == 2000 and out.stat().st_mode & 0o777 == 0o640
