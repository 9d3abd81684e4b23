"""Crawling through an HTTP proxy (pproxy, started by the test): environment, NO_PROXY, refusals."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from courtly.proxy import Proxies, parse_proxy
from courtly.site import Page, html
from tests.conftest import candidates, courtly, fetched_paths, robots, rows
from tests.hostile_server import (
    Conn,
    HostileServer,
    Request,
    close_at_once,
    fixed,
    link_page,
    page,
)
from tests.test_bad_input import one_line

#: pproxy imports uvloop when it can, and then fails on Python 3.11 (no current event loop)
_PPROXY = ("import sys; sys.modules['uvloop'] = None; sys.argv[0] = 'pproxy'; "
           "from pproxy.server import main; main()")
#: a port nothing listens on: only the proxy (which sends everything to the real server) can
#: reach a URL on it, so a request that went direct fails
DEAD = "http://127.0.0.1:9"


@contextlib.contextmanager
def pproxy(forward_to: str, auth: str = "") -> Iterator[tuple[str, list[str]]]:
    """An HTTP proxy on 127.0.0.1 that sends every connection to forward_to (host:port), with
    its log lines (one a connection) filled in when it stops."""
    listen = "http://127.0.0.1:0" + (f"#{auth}" if auth else "")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listen = listen.replace(":0", f":{port}")
    proc = subprocess.Popen([sys.executable, "-c", _PPROXY, "-l", listen, "-r",
                             f"tunnel://{forward_to}", "-v"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    log: list[str] = []
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # "Serving on …" once it listens
        assert "Serving on" in first, first + proc.stdout.read()
        yield f"127.0.0.1:{port}", log
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
        log.extend(line for line in out.splitlines() if " -> " in line)


def test_every_request_through_the_proxy_and_no_proxy_obeyed(
        serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = serve({
        "far": {"/robots.txt": robots("User-agent: *\nAllow: /\n"),
                "/": Page(html("Far", ["/a", "/b"])), "/a": Page(html("A", [])),
                "/b": Page(html("B", []))},
        "near": {"/": Page(html("Near", ["/x"])), "/x": Page(html("X", []))},
    })
    far = site.origins["far"].removeprefix("http://")
    near = "http://localhost:" + site.origins["near"].rpartition(":")[2]
    with pproxy(far, "alice:s3cret") as (proxy, log):
        monkeypatch.setenv("HTTP_PROXY", f"http://alice:s3cret@{proxy}")
        monkeypatch.setenv("no_proxy", "example.org, localhost")
        db = tmp_path / "crawl.db"
        run = courtly("crawl", DEAD + "/", near + "/", "--db", db, "--min-delay", "0")
        assert run.status == 0, run.err
    found = candidates(db)
    for path in ("/", "/a", "/b", "/x"):
        origin = near if path == "/x" else DEAD
        assert found[origin + path]["exit_code"] == "OK", found[origin + path]
    assert fetched_paths(site, "far") == ["/", "/a", "/b"]  # each through the proxy, once
    assert fetched_paths(site, "near") == ["/", "/x"]  # direct: through it, "far" answers
    assert log and all(f"-> tunnel {far} -> 127.0.0.1:9" in line for line in log)
    # the exchange kept is the request to the site: origin form, no proxy credentials
    body = rows(db, "SELECT exchange FROM content WHERE url = ?", DEAD + "/a")[0]["exchange"]
    request = zstandard.ZstdDecompressor().decompress(body)
    assert request.startswith(b"GET /a HTTP/1.1\r\nHost: 127.0.0.1:9\r\n")
    assert b"Proxy-Authorization" not in request and b"s3cret" not in request


@pytest.mark.parametrize("credentials", ["", "alice:wrong@"])
def test_a_proxy_that_refuses_stops_the_crawl_with_one_line(
        serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, credentials: str) -> None:
    site = serve({"far": {"/": Page(html("Far", []))}})
    with pproxy(site.origins["far"].removeprefix("http://"), "alice:s3cret") as (proxy, _):
        monkeypatch.setenv("http_proxy", f"http://{credentials}{proxy}")
        run = courtly("crawl", DEAD + "/", "--db", tmp_path / "c.db", "--min-delay", "0")
    why = "its credentials were refused" if credentials else "give them in its URL"
    assert run.status == 1 and len(run.err.splitlines()) == 1
    assert run.err.startswith(f"courtly: local error: proxy {proxy} answered 407 Proxy "
                              f"Authentication Required ({why})")
    assert site.hits == []  # robots.txt was asked of the proxy, which said no


def test_an_unreachable_proxy_stops_the_crawl(serve, tmp_path: Path) -> None:
    site = serve({"one": {"/": Page(html("One", []))}})
    run = courtly("crawl", site.url("one"), "--db", tmp_path / "c.db", "--min-delay", "0",
                  "--config", config(tmp_path, 'proxy = "http://127.0.0.1:9"'))
    assert run.status == 1 and len(run.err.splitlines()) == 1
    assert run.err.startswith("courtly: local error: proxy 127.0.0.1:9: ")
    assert site.hits == []


@pytest.mark.parametrize("fault", ["502", "hangs up"])
def test_a_proxy_that_fails_every_site_stops_the_crawl_and_resume_crawls_them(
        serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str) -> None:
    """A proxy that answered 502 to every request, or closed every connection, was blamed on
    the sites: each got robots.txt errors and was given up, and the crawl exited 0. Now the
    crawl stops with one line naming the proxy (exit status 1), and a resume through a working
    proxy crawls every site."""
    seeds = [f"http://127.0.0.1:{port}/" for port in (9, 10, 11)]  # reached through the proxy
    down = fixed(page("no", "text/plain", "502 Bad Gateway")) if fault == "502" else close_at_once
    db = tmp_path / "c.db"
    with HostileServer({"proxy": down}) as broken:
        address = broken.origins["proxy"].removeprefix("http://")
        monkeypatch.setenv("http_proxy", f"http://alice:s3cret@{address}")
        run = courtly("crawl", *seeds, "--db", db, "--min-delay", "0")
    assert run.status == 1, run.err
    [line] = [line for line in run.err.splitlines() if "taken to be down" in line]
    assert line.startswith(f"courtly: local error: proxy {address} failed the last 10 "
                           "requests, for 3 sites, with no answer between (the last: ")
    assert "s3cret" not in run.err
    site = serve({"far": {"/": Page(html("Far", ["/a"])), "/a": Page(html("A", []))}})
    with pproxy(site.origins["far"].removeprefix("http://")) as (proxy, _):
        monkeypatch.setenv("http_proxy", f"http://{proxy}")
        run = courtly("crawl", "--db", db, "--min-delay", "0")
    assert run.status == 0 and "stopped early" not in run.err, run.err
    found = candidates(db)  # the one site behind the proxy: the second and third duplicates
    assert all(found[seed]["exit_code"] in ("OK", "DUPLICATE_CONTENT") for seed in seeds), found


def test_sites_that_fail_behind_a_working_proxy_before_its_first_answer_do_not_stop_the_crawl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broad crawl through a working proxy: twelve seeds name sites that do not exist, and the
    proxy says 502 for them at once, before the two real sites' first (slower) answers came. The
    crawl took the proxy to be down and stopped (exit 1). Now the proxy is judged once the
    requests under way when its failures began have ended: the real sites are crawled."""
    dead = {f"127.0.0.1:{port}" for port in range(20, 32)}

    async def gateway(conn: Conn, req: Request) -> None:
        host = req.path.removeprefix("http://").partition("/")[0]
        if host in dead:
            await conn.send(page("no such host", "text/plain", "502 Bad Gateway"))
            return
        await asyncio.sleep(1.0)
        if req.path.endswith("/robots.txt"):
            await conn.send(page("", "text/plain", "404 Not Found"))
        else:
            await conn.send(link_page([]))

    live = ["http://127.0.0.1:40/", "http://127.0.0.1:41/"]
    db = tmp_path / "c.db"
    with HostileServer({"proxy": gateway}) as proxy:
        monkeypatch.setenv("http_proxy", proxy.origins["proxy"])
        run = courtly("crawl", *[f"http://{host}/" for host in sorted(dead)], *live,
                      "--db", db, "--min-delay", "0")
    assert run.status == 0 and "taken to be down" not in run.err, run.err
    found = candidates(db)
    assert [found[url]["exit_code"] for url in live] == ["OK", "OK"]
    assert all(found[f"http://{host}/"]["exit_code"] != "OK" for host in dead)


def test_a_proxy_url_courtly_cannot_use_is_one_line(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run = courtly("crawl", "http://127.0.0.1:9/", "--db", tmp_path / "c.db", "--config",
                  config(tmp_path, 'proxy = "socks5://127.0.0.1:1080"'))
    assert run.status == 2 and "proxy: only http:// proxies are supported" in run.err
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:notaport")
    run = courtly("crawl", "http://127.0.0.1:9/", "--db", tmp_path / "d.db")
    one_line(run, 2, "HTTPS_PROXY: bad port in proxy URL")  # the variable the user set
    monkeypatch.delenv("HTTPS_PROXY")
    # all_proxy is read for both schemes: a mistake in it once said "http_proxy: …", a variable
    # the user had not set
    monkeypatch.setenv("all_proxy", "socks5://127.0.0.1:1080")
    run = courtly("crawl", "http://127.0.0.1:9/", "--db", tmp_path / "e.db")
    one_line(run, 2, "courtly: all_proxy: only http:// proxies are supported, not socks5://")


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "crawl.toml"
    path.write_text(text + "\n")
    return path


def test_no_proxy_rules_as_curl_and_requests_read_them() -> None:
    proxies = Proxies.from_environment({
        "HTTP_PROXY": "http://upper:1", "http_proxy": "proxy.corp:3128",
        "ALL_PROXY": "http://all.corp:8080",
        "NO_PROXY": ".internal.org, *.lan, 10.0.0.0/8, host.org:8443, [::1], 192.168.1.5"})
    assert proxies is not None
    http = proxies.for_url("http", "example.com", 80)
    assert http == parse_proxy("http://proxy.corp:3128")  # lower case wins, port as given
    assert proxies.for_url("https", "example.com", 443) == parse_proxy("http://all.corp:8080")
    direct = [("a.internal.org", 80), ("internal.org", 80), ("x.lan", 80), ("10.1.2.3", 80),
              ("host.org", 8443), ("::1", 80), ("192.168.1.5", 80)]
    assert all(proxies.for_url("http", h, p) is None for h, p in direct)
    through = [("notinternal.org", 80), ("host.org", 80), ("11.0.0.1", 80), ("lan.x", 80)]
    assert all(proxies.for_url("http", h, p) == http for h, p in through)
    assert Proxies.from_environment({"NO_PROXY": "*"}) is None  # no proxy at all
    everything = Proxies.from_environment({"https_proxy": "http://p:1", "no_proxy": "*"})
    assert everything is not None and everything.for_url("https", "example.com", 443) is None
    auth = parse_proxy("http://al%40ice:p%3Ass@p:1").authorization
    assert auth == "Basic YWxAaWNlOnA6c3M="  # "al@ice:p:ss"


def test_politeness_is_per_target_origin_not_per_proxy(
        serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two origins through one proxy: each keeps its delay, and they do not wait for each other."""
    site = serve({"far": {"/": Page(html("Home", [f"/p{i}" for i in range(4)]))}
                  | {f"/p{i}": Page(html(f"P{i}", [])) for i in range(4)}})
    other = "http://127.0.0.2:9"  # another origin, also reachable only through the proxy
    with pproxy(site.origins["far"].removeprefix("http://")) as (proxy, _):
        monkeypatch.setenv("http_proxy", f"http://{proxy}")
        run = courtly("crawl", DEAD + "/", other + "/", "--db", tmp_path / "c.db",
                      "--min-delay", "0.3", "--config",  # one server: the same pages twice
                      config(tmp_path, "[dedup]\nexact = false\nnear = false"))
        assert run.status == 0, run.err
    hits = sorted(site.hits, key=lambda h: h.arrived)
    by_host = {host: [h for h in hits if h.headers.get("Host") == host]
               for host in ("127.0.0.1:9", "127.0.0.2:9")}
    assert [len(v) for v in by_host.values()] == [6, 6]  # robots.txt, home, 4 pages each
    for own in by_host.values():
        assert all(b.arrived - a.done >= 0.3 - 0.005 for a, b in itertools.pairwise(own))
    closest = min(b.arrived - a.arrived for a, b in itertools.pairwise(hits)
                  if a.headers["Host"] != b.headers["Host"])
    assert closest < 0.3  # the other origin's request did not wait for this one's delay
