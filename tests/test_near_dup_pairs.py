"""Near-duplicates judged on real pages (tests/data/near_dup): precision, recall, no template."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from courtly.analysis import PageSettings, analyse_page
from courtly.config import CrawlConfig
from courtly.model import CrawlAction, ExitCode, Link
from courtly.store.sqlite import SqliteStore
from courtly.urls import Rules

DATA = Path(__file__).parent / "data" / "near_dup"
PAIRS = json.loads((DATA / "pairs.json").read_text())


def signature(path: str) -> bytes | None:
    """The near-duplicate signature the page worker computes for this page."""
    config = CrawlConfig()
    settings = PageSettings("courtly", config.limits.max_links_per_page,
                            config.limits.max_parse_size, config.dedup.near,
                            config.dedup.min_words, Rules.of(config.normalize), False)
    body = gzip.decompress((DATA / f"{path}.gz").read_bytes())
    return analyse_page(settings, f"http://docs.test/{path}", body, "text/html", "").near_signature


def judged_duplicate(a: str, b: str, tmp_path: Path) -> bool:
    """Crawl a, then b, into a fresh crawl database: is b a near-duplicate of a?"""
    store = SqliteStore(str(tmp_path / f"{len(list(tmp_path.iterdir()))}.db"))
    try:
        urls = [f"http://docs.test/1/{a}", f"http://docs.test/2/{b}"]
        store.add_links([Link(url, "http://docs.test", 0) for url in urls])
        first = store.take_todo("http://docs.test", 1, 1, 0.0)[0]
        action = CrawlAction(first, "http://docs.test", ExitCode.OK, 0.0)
        action.near_signature = signature(a)
        store.record(action, 1)
        second = signature(b)
        threshold = CrawlConfig().dedup.min_similarity
        return second is not None and store.find_similar(second, urls[1], threshold) is not None
    finally:
        store.close()


def test_real_pairs_precision_recall_and_no_template_pair(tmp_path: Path) -> None:
    judged = {(p["kind"], p["a"], p["b"]): judged_duplicate(p["a"], p["b"], tmp_path)
              for p in PAIRS}
    positives = [v for (kind, _, _), v in judged.items() if kind in ("same", "edits")]
    negatives = [v for (kind, _, _), v in judged.items() if kind == "template"]
    found = sum(positives)
    wrong = sum(negatives)
    recall = found / len(positives)
    precision = found / (found + wrong) if found + wrong else 1.0
    print(f"near-duplicate pairs: recall {recall:.2f} ({found}/{len(positives)}), precision "
          f"{precision:.2f}; repeated content judged duplicate: "
          f"{[v for (kind, _, _), v in judged.items() if kind == 'repeated']}")
    assert not [key for key, v in judged.items() if key[0] == "template" and v]
    assert recall >= 0.9, [key for key, v in judged.items() if key[0] != "template" and not v]


def test_a_page_without_a_main_element_is_judged_without_its_chrome(tmp_path: Path) -> None:
    """No <main>, <article> or role=main: the body less nav, header, footer, aside, scripts."""
    from courtly.parse import parse_html

    words = " ".join(f"word{i}" for i in range(60))
    page = parse_html(
        f"<html><body><nav>menu one two</nav><header>site name</header><script>var x;</script>"
        f"<div><p>{words}</p></div><aside>related</aside><footer>copyright</footer>"
        f"</body></html>".encode(), "text/html", "courtly", 10, want_text=True)
    assert page.text == words
    marked = parse_html(b"<body><nav>menu</nav><div role=MAIN>the content</div></body>",
                        "text/html", "courtly", 10, want_text=True)
    assert marked.text == "the content"
