"""A user's mistake (config, seeds, paths, strategy, database) is one line and harms nothing."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from courtly.site import Page, html
from tests.conftest import Run, candidates, courtly, rows

SEED = "http://127.0.0.1:1/"


def one_line(run: Run, status: int, *words: str) -> None:
    """The run failed with this status and one `courtly: ...` line containing the words."""
    lines = run.err.strip().splitlines()
    assert run.status == status and len(lines) == 1, run.err
    assert lines[0].startswith("courtly: "), run.err
    for word in words:
        assert word in lines[0], (word, run.err)


def seeded(db: Path, *seeds: str) -> Path:
    """A crawl database holding these seeds (add-seeds fetches nothing)."""
    run = courtly("add-seeds", *(seeds or (SEED,)), "--db", db)
    assert run.status == 0, run.err
    return db


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- export --------------------------------------------------------------------------------


def test_export_refuses_to_write_over_its_database(db: Path) -> None:
    seeded(db)
    roundabout = f"{db.parent}/../{db.parent.name}/{db.name}"
    for out in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), roundabout):
        one_line(courtly("export", "--db", db, "--out", out), 2, "crawl database", str(out))
    assert list(candidates(db)) == [SEED]


def test_export_to_a_full_disk_is_one_line(db: Path) -> None:
    seeded(db)
    one_line(courtly("export", "--db", db, "--out", "/dev/full"), 2, "cannot write /dev/full")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "courtly", "export", "--db", str(db)],
                              stdout=full, stderr=subprocess.PIPE, text=True, check=False)
    one_line(Run(proc.returncode, "", proc.stderr), 2, "cannot write standard output")


def test_export_into_a_pipe_closed_early_stops_quietly(db: Path, tmp_path: Path) -> None:
    """`courtly export | head`: before, "cannot write standard output: Broken pipe", exit 2."""
    seeds = write(tmp_path / "seeds.txt", "".join(f"http://127.0.0.1:1/{i}\n"
                                                  for i in range(20_000)))
    assert courtly("add-seeds", "--seeds-file", seeds, "--db", db).status == 0
    proc = subprocess.Popen([sys.executable, "-m", "courtly", "export", "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b'{"url": "http://127.0.0.1:1/')  # JSON lines
    proc.stdout.close()  # what head does once it has its lines
    assert proc.wait(timeout=60) == 141
    assert proc.stderr.read() == b""


# -- the demo ------------------------------------------------------------------------------


def test_demo_refuses_to_delete_a_database_it_did_not_write(db: Path, tmp_path: Path) -> None:
    seeded(db, "http://example.com/")
    notes = write(tmp_path / "notes.txt", "precious\n")
    for path in (db, notes):
        before = path.read_bytes()
        one_line(courtly("demo", "--db", path), 2, str(path))
        assert path.read_bytes() == before
    assert list(candidates(db)) == ["http://example.com/"]


def test_demo_replaces_its_own_database(db: Path) -> None:
    for _ in range(2):  # the second run replaces what the first wrote
        run = courtly("demo", "--db", db)
        assert run.status == 0, run.err
    assert len(rows(db, "SELECT origin FROM origins WHERE seed = 1")) == 3
    assert len(rows(db, "SELECT DISTINCT run FROM crawl_log")) == 1


def test_demo_leaves_a_crawl_of_a_local_site_alone(db: Path) -> None:
    """A crawl of one's own site on 127.0.0.1 is not the demo's, although its origin is local
    (before: the demo deleted it)."""
    seeded(db, "http://127.0.0.1:8000/my-app/")
    before = db.read_bytes()
    one_line(courtly("demo", "--db", db), 2, "not a demo crawl database")
    assert db.read_bytes() == before


def test_demo_argument_mistakes_are_one_line(tmp_path: Path) -> None:
    demo_db = tmp_path / "demo.db"
    for port in ("99999", "-1", "65535"):
        one_line(courtly("demo", "--port", port, "--db", demo_db), 2, "--port")
    one_line(courtly("demo", "--db", tmp_path), 2, "directory")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        one_line(courtly("demo", "--port", port, "--db", demo_db), 2, str(port), "in use")
    assert not demo_db.exists()


# -- --db ----------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", ":memory:", "mysql://127.0.0.1/test"])
def test_db_that_saves_nothing_is_refused(bad: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for command in (["crawl", SEED], ["add-seeds", SEED], ["export"], ["stats"], ["check", SEED],
                    ["worker"], ["demo"]):
        one_line(courtly(*command, "--db", bad), 2, "db")
    write(tmp_path / "crawl.toml", f'db = "{bad}"\n')
    one_line(courtly("add-seeds", SEED, "--config", "crawl.toml"), 2, "db")
    assert list(tmp_path.iterdir()) == [tmp_path / "crawl.toml"]


# -- strategies ----------------------------------------------------------------------------


def test_strategy_module_that_fails_to_import_is_one_line(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    write(tmp_path / "broken_syntax_strategy.py", "class S(:\n")
    write(tmp_path / "raising_strategy.py", "raise RuntimeError('no config here')\n")
    for spec, words in [("broken_syntax_strategy:S", "SyntaxError"),
                        ("raising_strategy:S", "RuntimeError: no config here")]:
        run = courtly("add-seeds", SEED, "--db", db, "--strategy", spec)
        one_line(run, 2, "cannot load strategy", spec, words)


HOOKS = """
from courtly.strategy import CrawlingStrategy

class BadSeeds(CrawlingStrategy):
    def read_seeds(self, stream):
        raise ValueError("seeds are off today")

class BadClose(CrawlingStrategy):
    def read_seeds(self, stream):
        super().read_seeds(stream)
        self.domain_metadata["http://127.0.0.1:1"]["seeded"] = 1

    def close(self):
        super().close()
        raise OSError("metadata store gone")
"""


def test_strategy_hook_that_raises_is_one_line(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    write(tmp_path / "hook_strategies.py", HOOKS)
    for command in ("add-seeds", "crawl"):
        run = courtly(command, SEED, "--db", db, "--strategy", "hook_strategies:BadSeeds")
        one_line(run, 2, "read_seeds", "ValueError: seeds are off today")
        run = courtly(command, SEED, "--db", db, "--strategy", "hook_strategies:BadClose")
        one_line(run, 2, "close", "OSError: metadata store gone")
        # as README says: no seed, origin or metadata written (before, a close() that raised
        # left the seeds and their origins written, and the metadata it had saved)
        assert rows(db, "SELECT origin FROM origins") == []
        assert rows(db, "SELECT url FROM candidates") == []


@pytest.mark.parametrize("cap", ['"abc"', "[1]", "0", "-1", "1.5", "true"])
def test_discovery_cap_must_be_a_positive_integer(cap: str, db: Path, tmp_path: Path) -> None:
    config = write(tmp_path / "crawl.toml",
                   f'strategy = "discovery"\n[strategy_args]\nmax_pages_per_origin = {cap}\n')
    for command in ("add-seeds", "crawl"):
        run = courtly(command, SEED, "--db", db, "--config", config)
        one_line(run, 2, "max_pages_per_origin", "positive integer")


# -- the configuration ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ["5", "true", '"http://127.0.0.1:1/a"'])
def test_seeds_key_that_is_not_a_list(value: str, db: Path, tmp_path: Path) -> None:
    config = write(tmp_path / "crawl.toml", f"seeds = {value}\n")
    for extra in ((), (SEED,)):
        run = courtly("add-seeds", *extra, "--db", db, "--config", config)
        one_line(run, 2, "seeds: Input should be a valid list")
    assert not db.exists()


def test_user_agent_with_control_characters_is_refused(db: Path, tmp_path: Path) -> None:
    config = write(tmp_path / "crawl.toml", 'user_agent = "bot\\nX"\n')
    one_line(courtly("crawl", SEED, "--db", db, "--config", config), 2, "user_agent")
    for agent in ("bot\r\nX: 1", "bot\x00", "bot\tX", "bot\x7f"):
        one_line(courtly("crawl", SEED, "--db", db, "--user-agent", agent), 2, "user_agent")
    assert not db.exists()


def test_infinite_or_nan_numbers_are_refused(db: Path, tmp_path: Path) -> None:
    for value in ("inf", "nan", "-inf"):
        one_line(courtly("crawl", SEED, "--db", db, "--min-delay", value), 2, "min_delay")
    for key, section in [("min_delay", ""), ("commit_interval", ""), ("backoff_max", "politeness"),
                         ("expiry", "robots"), ("total_timeout", "limits"), ("ok", "recrawl")]:
        header = f"[{section}]\n" if section else ""
        config = write(tmp_path / "crawl.toml", f"{header}{key} = inf\n")
        one_line(courtly("crawl", SEED, "--db", db, "--config", config), 2, key, "finite")
    assert not db.exists()


@pytest.mark.parametrize("lease", ["0.02", "0.5", "0"])
def test_a_lease_too_short_to_hold_is_refused(lease: str, tmp_path: Path) -> None:
    """`[fleet] lease_seconds = 0.02` was taken: the worker's leases expired between its
    renewals, and it fetched the same pages again and again (402 requests in 20 s, not one
    recorded: `lost the leases of partitions …`) until it was stopped."""
    config = write(tmp_path / "crawl.toml", f"[fleet]\nlease_seconds = {lease}\n")
    run = courtly("worker", "--db", "postgresql://postgres@127.0.0.1:1/test", "--config", config)
    one_line(run, 2, "fleet.lease_seconds", "greater than or equal to 1")


def test_seeds_file_comments_trailing_words_and_bom(db: Path, tmp_path: Path) -> None:
    seeds = tmp_path / "seeds.txt"
    seeds.write_bytes("\ufeffhttp://127.0.0.1:1/a\n  # an indented comment\n"
                      "http://127.0.0.1:1/b # the b page\n\thttp://127.0.0.1:1/c\tnote\n"
                      .encode())
    run = courtly("add-seeds", "--seeds-file", seeds, "--db", db)
    assert run.status == 0, run.err
    assert sorted(candidates(db)) == [f"http://127.0.0.1:1/{p}" for p in "abc"]


def test_seeds_file_that_is_not_utf8_is_refused_not_guessed_at(db: Path, tmp_path: Path) -> None:
    """A Latin-1 seed once became another URL (its byte replaced by U+FFFD, queued as
    /caf%EF%BF%BD) without a word; a binary file's garbage was printed as text."""
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"http://127.0.0.1:1/a\nhttp://127.0.0.1:1/caf\xe9 note\n")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    for command in ("add-seeds", "crawl"):
        run = courtly(command, "--seeds-file", latin, "--db", db)
        one_line(run, 2, f"seeds file {latin}, line 2: not UTF-8", "caf\\xe9")
        run = courtly(command, "--seeds-file", binary, "--db", db)
        one_line(run, 2, f"seeds file {binary}, line 1: not UTF-8", "\\x80\\x81")
        assert len(run.err) < 500, run.err
    assert not db.exists()
    # bytes that are not UTF-8 in a comment or in a seed's note are no seed's: let through
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"# caf\xe9\nhttp://127.0.0.1:1/a caf\xe9\n")
    assert courtly("add-seeds", "--seeds-file", notes, "--db", db).status == 0
    assert list(candidates(db)) == ["http://127.0.0.1:1/a"]


@pytest.mark.parametrize(("seed", "why"), [
    ("http://a..b/", "its host name has an empty label"),
    ("http://.example.org/", "its host name has an empty label"),
    (f"http://{'a' * 64}.example.org/", "its host name has a label longer than 63 characters"),
    (f"http://{'a.' * 127}org/", "its host name is longer than 253 characters"),
])
def test_a_seed_whose_host_no_resolver_takes_is_refused(seed: str, why: str, db: Path) -> None:
    """A seed http://a..b/ (or a label over 63 characters) was accepted, stored as a seed origin
    and failed only when crawled (a failed DNS lookup of its origin): now refused up front. (Run
    in `unshare -n` to see it fail without the check: `crawl` then looks the name up.)"""
    for command in ("add-seeds", "crawl"):
        one_line(courtly(command, SEED, seed, "--db", db), 2, f"invalid seed URL ({why})", seed)
    assert not db.exists()
    assert courtly("add-seeds", "http://a.example.org./", "--db", db).status == 0  # root dot


def test_a_seed_with_a_user_name_and_password_is_refused(db: Path, tmp_path: Path) -> None:
    """A seed http://user:secret@host/ was stored as given, the password in the crawl database,
    and crawled without it (courtly sends no credentials). Now refused, the password not shown."""
    seeds = write(tmp_path / "seeds.txt", f"{SEED}\nhttp://user:secret@127.0.0.1:1/a\n")
    for command in ("add-seeds", "crawl"):
        for given in (["http://user:secret@127.0.0.1:1/a"], ["--seeds-file", seeds]):
            run = courtly(command, *given, "--db", db)
            one_line(run, 2, "invalid seed URL (a user name or password in it",
                     "'http://127.0.0.1:1/a'")
            assert "secret" not in run.err
    assert not db.exists()


def test_config_file_with_a_bom(db: Path, tmp_path: Path) -> None:
    config = tmp_path / "crawl.toml"
    config.write_bytes(f'\ufeffseeds = ["{SEED}"]\n'.encode())
    run = courtly("add-seeds", "--db", db, "--config", config)
    assert run.status == 0, run.err
    assert list(candidates(db)) == [SEED]


# -- a file that is not a crawl database ---------------------------------------------------


def test_read_only_commands_leave_a_foreign_sqlite_file_alone(tmp_path: Path) -> None:
    app = tmp_path / "app.db"
    con = sqlite3.connect(app)
    con.execute("CREATE TABLE foo (x)")
    con.commit()
    con.close()
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (app, empty):
        before = path.read_bytes()
        for command in (["stats"], ["export"], ["check", SEED]):
            one_line(courtly(*command, "--db", path), 2, f"{path} is not a courtly crawl database")
        assert path.read_bytes() == before
    one_line(courtly("add-seeds", SEED, "--db", app), 2, "not a courtly crawl database")
    assert [r["name"] for r in rows(app, "SELECT name FROM sqlite_master")] == ["foo"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db", "empty.db"]
    seeded(tmp_path / "new.db")  # a new path still becomes a crawl database


def test_an_invalid_regex_is_one_line_with_re2s_reason(tmp_path: Path) -> None:
    config = write(tmp_path / "crawl.toml", '[policies]\ndeny = ["re:(?<=a)b"]\n')
    proc = subprocess.run(  # a real process: RE2 would write to file descriptor 2 itself
        [sys.executable, "-m", "courtly", "crawl", SEED, "--db", str(tmp_path / "c.db"),
         "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"courtly: {config}: policies.deny: invalid regex in pattern 're:(?<=a)b': "
        "invalid perl operator: (?<="]


# -- host names the resolver cannot encode -------------------------------------------------


def test_a_host_name_with_an_empty_or_long_label_is_its_origins_error(
        serve: Any, db: Path, tmp_path: Path) -> None:
    """WHATWG accepts http://a..b/ (an empty label) and a label of 64 characters or more; the
    IDNA codec of getaddrinfo refuses them (UnicodeError): the origin's robots.txt is
    unreachable, the crawl goes on. Such a link on a page in a wide scope once stopped every
    crawl of its database ("internal error: UnicodeError", exit status 1), resume included."""
    site = serve({"home": {"/": Page(html("home", []))}, "wide": {}})
    port = site.origins["wide"].rsplit(":", 1)[1]
    empty, long = f"http://a..site.example.com:{port}/", f"http://{'a' * 64}.example.com:{port}/"
    site.sites["wide"].update({"/": Page(html("wide", [empty, long, "/b"])),
                               "/b": Page(html("b", []))})
    wide = site.url("wide").replace("127.0.0.1", "site.example.com")
    config = write(tmp_path / "crawl.toml", '[policies]\nscope = "domain"\n[limits]\n'
                   'dns_hosts = { "site.example.com" = "127.0.0.1" }\n'
                   '[politeness]\npatience = 1\n')  # robots.txt unreachable once: given up
    for _ in range(2):  # the crawl, then its resume
        run = courtly("crawl", wide, "--db", db, "--config", config, "--min-delay", "0",
                      "--progress", "off")
        assert run.status == 0, run.err
    found = candidates(db)
    assert found[wide]["exit_code"] == found[wide + "b"]["exit_code"] == "OK"
    for url in (empty, long):
        assert found[url]["exit_code"] == "ORIGIN_GIVEN_UP"
    given_up = rows(db, "SELECT detail FROM crawl_log WHERE exit_code = 'ORIGIN_GIVEN_UP'")
    assert all("not a valid host name" in r["detail"] for r in given_up), given_up
    # a seed of that kind is refused up front (test_a_seed_whose_host_no_resolver_takes_...)
    run = courtly("crawl", f"http://a..b:{port}/", site.url("home"), "--db",
                  tmp_path / "two.db", "--config", config, "--min-delay", "0",
                  "--progress", "off")
    one_line(run, 2, "invalid seed URL (its host name has an empty label)")
    assert not (tmp_path / "two.db").exists()
