"""Duplicate content: exact copies and near-copies on a site with known copies, end to end."""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

from courtly import dedup, minhash
from courtly.config import Dedup
from courtly.model import Candidate, CrawlAction, ExitCode
from courtly.site import Page, html
from courtly.store.sqlite import SqliteStore
from tests.conftest import BAND_KEYS, candidates, courtly, fetched_paths, rows

MIN_WORDS = Dedup().min_words

_VOCAB = [
    "crawler", "frontier", "politeness", "origin", "robots", "sitemap", "fetch", "parse", "link",
    "anchor", "page", "content", "duplicate", "shingle", "fingerprint", "index", "database",
    "schedule", "score", "depth", "breadth", "queue", "state", "error", "retry", "delay",
    "backoff", "header", "status", "body", "text", "word", "token", "hash", "band", "signature",
    "similar", "copy", "article", "news", "river", "mountain", "garden", "kitchen", "window",
    "bridge", "market", "station", "morning", "evening", "winter", "summer", "quiet", "loud",
    "bright", "dark", "river", "forest", "ocean", "desert", "island",
]


def article(seed: int, n: int = 300) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(_VOCAB) for _ in range(n)]


def page(title: str, words: list[str], links: list[str] = ()) -> Page:  # type: ignore[assignment]
    return Page(html(title, list(links), body=" ".join(words)))


def site_with_copies() -> dict[str, Page]:
    text = article(1)
    near = list(text)
    near[10], near[150], near[290] = "changed", "edited", "different"  # 1 % of the words
    return {
        "/": Page(html("Home", ["/article", "/copy", "/near", "/other", "/tiny1", "/tiny2"])),
        "/article": page("Article", text),
        "/copy": page("Article", text, ["/copy-child"]),  # byte for byte the same…
        "/near": page("Article, printable", ["Printed", "on", "2024-05-01", *near],
                      ["/near-child"]),
        "/other": page("Other", article(2)),
        "/tiny1": page("Tiny", ["hello", "world"]),
        "/tiny2": page("Tiny too", ["hello", "world"]),
        "/copy-child": page("Copy child", article(3)),
        "/near-child": page("Near child", article(4)),
    }


def test_exact_and_near_duplicates_are_found(serve, db: Path) -> None:
    pages = site_with_copies()
    pages["/copy"] = Page(pages["/article"].body)  # identical bytes
    site = serve({"a": pages})
    a = site.origins["a"]
    assert courtly("crawl", a + "/", "--db", db, "--min-delay", "0").status == 0
    cands = candidates(db)
    assert cands[a + "/article"]["exit_code"] == "OK"
    assert cands[a + "/copy"]["exit_code"] == "DUPLICATE_CONTENT"
    assert cands[a + "/copy"]["duplicate_of"] == a + "/article"
    assert cands[a + "/copy"]["detail"] == f"exact duplicate of {a}/article"  # same body
    assert cands[a + "/near"]["exit_code"] == "DUPLICATE_CONTENT"
    assert cands[a + "/near"]["duplicate_of"] == a + "/article"
    assert cands[a + "/near"]["detail"].startswith("near-duplicate: similarity 0.")
    assert cands[a + "/other"]["exit_code"] == "OK"
    # tiny pages are too short to compare: no false near-duplicate
    assert cands[a + "/tiny1"]["exit_code"] == "OK" and cands[a + "/tiny2"]["exit_code"] == "OK"
    # by default the links of a duplicate are still followed
    assert cands[a + "/near-child"]["exit_code"] == "OK"
    log = rows(db, "SELECT exit_code FROM crawl_log WHERE url = ?", a + "/near")
    assert log == [{"exit_code": "DUPLICATE_CONTENT"}]
    stored = {r["url"] for r in rows(db, "SELECT url FROM content")}
    assert a + "/article" in stored and a + "/near" not in stored  # duplicates are not kept


def test_links_of_duplicates_not_followed_when_configured(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": site_with_copies()})
    config = tmp_path / "crawl.toml"
    config.write_text("[dedup]\nfollow_links_of_near_duplicates = false\n")
    a = site.origins["a"]
    assert courtly("crawl", a + "/", "--db", db, "--min-delay", "0", "--config", config).status == 0
    cands = candidates(db)
    assert cands[a + "/near"]["exit_code"] == "DUPLICATE_CONTENT"
    assert a + "/near-child" not in cands
    assert "/near-child" not in fetched_paths(site, "a")


def test_near_duplicates_off_and_threshold(serve, db: Path, tmp_path: Path) -> None:
    site = serve({"a": site_with_copies()})
    config = tmp_path / "crawl.toml"
    config.write_text("[dedup]\nnear = false\n")
    a = site.origins["a"]
    assert courtly("crawl", a + "/", "--db", db, "--min-delay", "0", "--config", config).status == 0
    assert candidates(db)[a + "/near"]["exit_code"] == "OK"
    assert rows(db, "SELECT COUNT(*) AS n FROM near_dup") == [{"n": 0}]


# -- the fingerprints and the index on their own -----------------------------------------


def test_signature_similarity_tracks_edits() -> None:
    text = article(7, 400)
    sig = minhash.signature(" ".join(text), MIN_WORDS)
    assert sig is not None and len(sig) == 2 * dedup.BINS
    assert minhash.signature("too short to say anything", MIN_WORDS) is None
    edited = list(text)
    for i in range(0, 400, 100):
        edited[i] = "zzz"
    other = minhash.signature(" ".join(article(8, 400)), MIN_WORDS)
    near = minhash.signature(" ".join(edited), MIN_WORDS)
    assert near is not None and other is not None
    assert dedup.similarity(sig, sig) == 1.0
    assert dedup.similarity(sig, near) >= 0.85
    assert dedup.similarity(sig, other) < 0.3
    shared = set(dedup.band_keys(sig)) & set(dedup.band_keys(near))
    assert shared and not set(dedup.band_keys(sig)) & set(dedup.band_keys(other))


def test_signatures_are_those_stored_by_earlier_versions() -> None:
    """Stored signatures are compared with new ones: the function's output must never change."""
    text = " ".join(f"Word{i % 37}, w{i * 7 % 101}." for i in range(400))
    sig = minhash.signature(text, MIN_WORDS)
    assert sig is not None and len(sig) == 2 * dedup.BINS
    assert hashlib.sha256(sig).hexdigest()[:32] == "15c81cf3d4e8cc501a6ae18165091fda"


def test_word_hashes_match_a_word_by_word_reference() -> None:
    """The vectorized word hashes equal each word's polynomial hash, mixed, computed one by one."""
    separators = re.compile(rb"[\x00-\x20!-/:-@\[-^`{-~]+")  # ASCII punctuation but '_'
    mask = (1 << 64) - 1

    def reference(text: str) -> list[int]:
        out = []
        for word in separators.split(text.lower().encode("utf-8", "replace")[:dedup.TEXT_LIMIT]):
            if word:
                h = sum(byte * pow(0x100000001B3, j, 1 << 64) for j, byte in enumerate(word)) & mask
                for shift, factor in ((30, 0x9E3779B97F4A7C15), (27, 0xC2B2AE3D27D4EB4F)):
                    h = (h ^ h >> shift) * factor & mask
                out.append(h ^ h >> 31)
        return out

    rng = random.Random(3)
    alphabet = "aZ_9 \t\n.,-'!~\x7fé€😀\ud800"
    texts = ["", " ", "a", " a", "a ", "ab, c", "x" * (dedup.TEXT_LIMIT + 5),
             "y " * (dedup.TEXT_LIMIT // 2 - 1) + "é" * 10]
    texts += ["".join(rng.choices(alphabet, k=rng.randrange(60))) for _ in range(300)]
    for text in texts:
        assert minhash.word_hashes(text).tolist() == reference(text), text[:80]


def test_index_finds_near_copies_among_many(tmp_path: Path) -> None:
    """The band index finds the copy among 300 pages, reading only a few of them."""
    store = SqliteStore(str(tmp_path / "d.db"))
    from courtly.model import Link

    store.add_links([Link(f"http://a/{i}", "http://a", 0) for i in range(300)])
    for i, cand in enumerate(store.take_todo("http://a", 1, 300, 0.0)):
        action = CrawlAction(cand, "http://a", ExitCode.OK, 0.0)
        action.near_signature = minhash.signature(" ".join(article(1000 + i)), MIN_WORDS)
        store.record(action, 1)
    copy = article(1000 + 123)
    copy[5] = "edited"
    sig = minhash.signature(" ".join(copy), MIN_WORDS)
    assert sig is not None
    found = store.find_similar(sig, "http://a/new", 0.8)
    assert found is not None and found[0] == "http://a/123"
    assert store.find_similar(sig, "http://a/123", 0.8) is None  # never itself
    other = minhash.signature(" ".join(article(5)), MIN_WORDS)
    assert store.find_similar(other or b"", "http://x", 0.8) is None
    keys = rows(tmp_path / "d.db", f"SELECT COUNT(*) AS n FROM {BAND_KEYS}")[0]["n"]
    assert keys == 300 * dedup.BANDS
    # a recrawl (the todo list gives the last exit code) replaces the page's signature and keys
    again = Candidate(1, "http://a/0", 0, exit_code="OK")
    action = CrawlAction(again, "http://a", ExitCode.OK, 0.0)
    action.near_signature = sig
    store.record(action, 2)
    assert rows(tmp_path / "d.db", f"SELECT COUNT(*) AS n FROM {BAND_KEYS}")[0]["n"] == keys
    # a first crawl recorded twice (another worker took it after a lost lease) is no error:
    # the signature is the last one, the first one's keys stay unused
    twice = Candidate(2, "http://a/1", 0)
    for text in (article(7), article(8)):
        action = CrawlAction(twice, "http://a", ExitCode.OK, 0.0)
        action.near_signature = minhash.signature(" ".join(text), MIN_WORDS)
        store.record(action, 2)
    stored = rows(tmp_path / "d.db", "SELECT signature FROM near_dup WHERE candidate = 2")
    assert [r["signature"] for r in stored] == [minhash.signature(" ".join(article(8)), MIN_WORDS)]
    store.close()
