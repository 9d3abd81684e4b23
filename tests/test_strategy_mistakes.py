"""End to end: a user's strategy as the README tells them to write it, and their mistakes in it:
each is one line or a recorded exit code, never a traceback, never lost data."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from courtly.site import Page, html
from tests.conftest import candidates, courtly, courtly_process, fetched_paths, rows
from tests.test_strategy import topical_site

ROOT = Path(__file__).resolve().parents[1]
USER = "tests.test_strategy_user:"
BACKENDS = ("sqlite", "postgres")


def two_pages() -> dict[str, Page]:
    return {"/": Page(html("Home", ["/a"])), "/a": Page(html("A", []))}


def metadata(db: Path) -> dict[str, object]:
    return json.loads(rows(db, "SELECT metadata FROM origins")[0]["metadata"])  # type: ignore[no-any-return]


def test_the_readme_strategy_in_the_current_directory_runs_with_the_courtly_command(
    serve, tmp_path: Path
) -> None:
    """The README's topical.py, copied as it is into the directory the user runs `courtly` in
    (the installed script: its own directory is on sys.path, not the user's)."""
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S)
                 if b.startswith("# topical.py"))
    work, scripts = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    scripts.mkdir()
    (work / "topical.py").write_text(block)
    script = scripts / "courtly"
    script.write_text("import sys\nfrom courtly.cli import main\nsys.exit(main())\n")
    site = serve({"a": topical_site()})
    run = subprocess.run(
        [sys.executable, str(script), "crawl", site.url("a"), "--db", "crawl.db",
         "--min-delay", "0", "--strategy", "topical:Topical"],
        cwd=work, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    cands = candidates(work / "crawl.db")
    assert cands[site.url("a", "/py1")]["score"] == 0.9
    assert cands[site.url("a", "/cook")]["score"] == 0.1
    paths = fetched_paths(site, "a")
    assert paths.index("/py2") < paths.index("/cook")


def test_the_docs_example_is_the_class_the_tests_run() -> None:
    """docs/strategies.md's complete example is tests/test_strategy_user.py's Topical."""
    import inspect

    from tests.test_strategy_user import Topical

    docs = (ROOT / "docs" / "strategies.md").read_text()
    block = re.findall(r"```python\n(.*?)```", docs, re.S)[0]
    assert inspect.getsource(Topical) in block


@pytest.mark.parametrize("name, words", [
    ("InitLikeFrontera", "InitLikeFrontera.__init__ takes (manager, args, scheduled_stream, "
                         "states_context); a strategy's takes (context=None, args=None)"),
    ("NoSuperInit", "NoSuperInit.__init__ does not call super().__init__(context, args)"),
    ("SchedulesNothing", "no seed became a crawl candidate: strategy "
                         "'tests.test_strategy_user:SchedulesNothing' scheduled none"),
])
def test_a_strategy_that_cannot_start_is_one_line(db: Path, name: str, words: str) -> None:
    run = courtly("crawl", "http://127.0.0.1:1/", "--db", db, "--strategy", USER + name)
    assert run.status == 2
    assert words in run.err
    assert len(run.err.strip().splitlines()) == 1


@pytest.mark.parametrize("name, detail", [
    ("SchedulesAString", "TypeError: schedule() takes a Request (an event's, or "
                         "create_request(url)), not str 'http://"),
    ("SchedulesNoScore", "TypeError: schedule(): the score must be a number in [0, 1], "
                         "not None"),
    ("FiltersToNone", "TypeError: filter_extracted_links() must return a list of Requests, "
                      "not NoneType"),
])
def test_a_wrong_value_handed_to_courtly_is_an_exit_code_naming_it(serve, db: Path, name: str,
                                                                   detail: str) -> None:
    site = serve({"a": two_pages()})
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0", "--strategy", USER + name)
    assert run.status == 0, run.err
    seed = candidates(db)[site.url("a")]
    assert (seed["state"], seed["exit_code"]) == ("ERROR", "INTERNAL_ERROR")
    assert seed["detail"].startswith(detail), seed["detail"]


def test_request_error_raising_keeps_the_actions_exit_code_and_the_crawl_goes_on(
        serve, db: Path) -> None:
    site = serve({"a": {"/": Page(html("Home", ["/missing", "/after"])),
                        "/after": Page(html("After", []))}})
    proc = courtly_process("crawl", site.url("a"), "--db", db, "--min-delay", "0",
                           "--strategy", USER + "FailsOnErrors")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert (f"internal error on {site.url('a', '/missing')}: strategy request_error(): "
            "ValueError: cannot handle HTTP_CLIENT_ERROR (at test_strategy_user.py:") in err
    cands = candidates(db)
    assert cands[site.url("a", "/missing")]["exit_code"] == "HTTP_CLIENT_ERROR"
    assert cands[site.url("a", "/after")]["exit_code"] == "OK"


def test_domain_metadata_that_is_not_json_stops_the_crawl_in_one_line_naming_it(
        serve, db: Path) -> None:
    site = serve({"a": two_pages()})
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0",
                  "--strategy", USER + "KeepsASet")
    assert run.status == 1
    assert "Traceback" not in run.err
    assert (f"internal error: TypeError: domain_metadata['{site.origins['a']}'] cannot be saved: "
            "Object of type set is not JSON serializable") in run.err
    assert "close()" not in run.err  # the first failure is the one named
    assert candidates(db)[site.url("a")]["state"] == "NOT_CRAWLED"  # crawled again on resume


def test_the_helpers_refuse_a_thread_of_the_strategys_own(serve, db: Path) -> None:
    site = serve({"a": two_pages()})
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0",
                  "--strategy", USER + "SchedulesFromAThread")
    assert run.status == 0, run.err
    assert metadata(db)["thread"] == [
        "schedule() called from another thread: call the strategy's helpers from its event "
        "handlers, on the crawl's thread"]
    assert site.url("a", "/from-thread") not in candidates(db)


def test_a_strategy_written_with_fronteras_calls(serve, db: Path) -> None:
    site = serve({"a": two_pages()})
    run = courtly("crawl", site.url("a"), "--db", db, "--min-delay", "0",
                  "--strategy", USER + "FronteraStyle")
    assert run.status == 0, run.err
    assert fetched_paths(site, "a") == ["/", "/a"]
    assert metadata(db) == {"pages": 2}


def test_domain_metadata_is_written_with_its_crawl_action_through_kill_9(serve, db: Path
                                                                         ) -> None:
    """The pages counted in the metadata are the pages recorded, whenever the process dies
    (here: with a group commit due as /slow's action is recorded, then SIGKILL on /die)."""
    site = serve({"a": {"/": Page(html("Home", ["/slow"])),
                        "/slow": Page(html("Slow", ["/die"])), "/die": Page(html("Die", []))}})
    proc = courtly_process("crawl", site.url("a"), "--db", db, "--min-delay", "0",
                           "--strategy", USER + "CountsThenDies")
    proc.communicate(timeout=60)
    assert proc.returncode == -9
    crawled = [u for u, c in candidates(db).items() if c["state"] == "CRAWLED"]
    assert metadata(db) == {"pages": len(crawled)}
    resumed = courtly("crawl", "--db", db, "--min-delay", "0", "--strategy", USER + "Topical")
    assert resumed.status == 0, resumed.err
    assert metadata(db) == {"pages": 3}  # Topical counts "pages" too: /die, once
