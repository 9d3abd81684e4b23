"""HTTPS with a CA of the user's (a CA bundle: the config key or SSL_CERT_FILE), and through a
proxy's CONNECT tunnel."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from courtly.site import LocalSite, Page, html
from tests.conftest import candidates, courtly, fetched_paths
from tests.test_proxy import config, pproxy
from tests.tls import Authority, make_ca

PAGES = {"/": Page(html("Secure", ["/a"])), "/a": Page(html("A", []))}


@pytest.fixture
def ca(tmp_path: Path) -> Authority:
    return make_ca(tmp_path / "ca")


@pytest.fixture
def secure(ca: Authority) -> Iterator[LocalSite]:
    """An HTTPS site on 127.0.0.1 whose certificate (for localhost) the test CA signed."""
    with LocalSite({"s": PAGES}, tls=ca.server) as site:
        yield site


def localhost(site: LocalSite) -> str:
    return "https://localhost:" + site.origins["s"].rpartition(":")[2]


def crawl(db: Path, seed: str, *args: str) -> dict[str, dict[str, object]]:
    run = courtly("crawl", seed + "/", "--db", db, "--min-delay", "0", *args)
    assert run.status == 0, run.err
    return candidates(db)


def test_without_the_ca_the_certificate_is_refused(secure: LocalSite, tmp_path: Path) -> None:
    run = courtly("crawl", localhost(secure) + "/", "--db", tmp_path / "c.db", "--min-delay",
                  "0", "--config", config(tmp_path, "[politeness]\npatience = 1"))
    assert run.status == 0, run.err
    assert "robots.txt unavailable (TLS: [SSL: CERTIFICATE_VERIFY_FAILED]" in run.out + run.err
    assert secure.hits == []


def test_the_ca_bundle_key(secure: LocalSite, ca: Authority, tmp_path: Path) -> None:
    seed = localhost(secure)
    found = crawl(tmp_path / "c.db", seed, "--config",
                  config(tmp_path, f'ca_bundle = "{ca.ca_file}"'))
    assert found[seed + "/"]["exit_code"] == found[seed + "/a"]["exit_code"] == "OK"


def test_ssl_cert_file(secure: LocalSite, ca: Authority, tmp_path: Path,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.ca_file))
    seed = localhost(secure)
    found = crawl(tmp_path / "c.db", seed)
    assert found[seed + "/"]["exit_code"] == found[seed + "/a"]["exit_code"] == "OK"


def test_a_ca_bundle_that_does_not_load_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty.pem").write_text("not a certificate\n")
    for path in (tmp_path / "missing.pem", tmp_path / "empty.pem"):
        run = courtly("crawl", "https://localhost:9/", "--db", tmp_path / "c.db", "--config",
                      config(tmp_path, f'ca_bundle = "{path}"'))
        assert run.status == 2 and len(run.err.splitlines()) == 1
        assert f"ca_bundle: cannot load CA certificates from {path}" in run.err


def test_https_through_the_proxy_tunnel(secure: LocalSite, ca: Authority, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTPS_PROXY with credentials: CONNECT, then TLS with the site (port 9 is reachable only
    through the proxy, which tunnels every connection to the test site)."""
    with pproxy(secure.origins["s"].removeprefix("https://"), "bob:pw") as (proxy, log):
        monkeypatch.setenv("HTTPS_PROXY", f"http://bob:pw@{proxy}")
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # not for https URLs
        found = crawl(tmp_path / "c.db", "https://localhost:9", "--config",
                      config(tmp_path, f'ca_bundle = "{ca.ca_file}"'))
    assert found["https://localhost:9/"]["exit_code"] == "OK"
    assert found["https://localhost:9/a"]["exit_code"] == "OK"
    assert fetched_paths(secure, "s") == ["/", "/a"]
    assert log and all(line.endswith("-> localhost:9") for line in log)
