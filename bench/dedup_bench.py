"""Near-duplicate detection: simhash (64 bits, 4×16-bit band index) against MinHash (LSH bands).

The result decided courtly.dedup (see its docstring): MinHash, computed by one-permutation hashing.

Corpus: windows of real English text (the seed documents and the Python standard library's
docstrings), each copied with known edits — a fraction of words replaced, inserted or deleted —
and with a page's chrome changed (a navigation header, a date). For each method it reports
recall by edit level, false positives among distinct documents, fingerprint time per document,
and the bytes kept per document (signature + index rows).

    .venv/bin/python bench/dedup_bench.py [--docs 200] [--seed 1]

With --index N [N ...] it measures instead what the near-duplicate index costs the crawl
database: N pages on one template (the same 400 words of chrome around 120 words of their own,
so their signatures share band keys by chance, as templated pages do; similarity about 0.6,
under the threshold) are looked up (`Store.find_similar`) and stored as OK pages, 1,000 pages
a commit as group commit does, and it prints the CPU (user + sys) a page over the last fifth,
with the configured number of indexed bands or `--bands B`, each size in its own database; the
last fifths are measured in turns, so the machine's load weighs on all sizes alike, and the ratio of
each size's CPU a page to the first's is printed. `--random` uses random signatures instead.
Issue 32: `--index 20000 200000`, the CPU a page at both sizes within 15 %.
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import resource
import sys
import sysconfig
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from courtly import dedup, minhash
from courtly.config import Dedup

EDITS = (0.0, 0.005, 0.01, 0.02, 0.05, 0.10, 0.20)


def corpus_words() -> list[str]:
    """A long stream of real words: seed documents, then stdlib docstrings."""
    texts = [p.read_text(errors="replace") for p in Path("/work/shared/seeds").glob("*.txt")]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.glob("*.py"))[:400]:
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Module):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    texts.append(doc)
    return re.findall(r"\S+", "\n".join(texts))


def edit(words: list[str], fraction: float, rng: random.Random, vocab: list[str]) -> list[str]:
    """Replace, insert or delete `fraction` of the words at random places."""
    out = list(words)
    for _ in range(round(len(words) * fraction)):
        i = rng.randrange(len(out))
        op = rng.random()
        if op < 0.5:
            out[i] = rng.choice(vocab)
        elif op < 0.75:
            out.insert(i, rng.choice(vocab))
        elif len(out) > 1:
            del out[i]
    return out


def chrome(words: list[str], rng: random.Random, vocab: list[str]) -> list[str]:
    """The same article in another page: a new 12-word navigation bar and a changed date."""
    nav = [rng.choice(vocab) for _ in range(12)]
    return ["Home", "News", *nav, "Posted", f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
            *words, "Copyright", "2024"]


# -- the two methods ----------------------------------------------------------------------


def shingle_set(text: str, size: int) -> set[str]:
    """Runs of `size` lower-cased words (what simhash and classic MinHash hash one by one)."""
    tokens = re.findall(r"\w+", text.lower())
    if len(tokens) <= size:
        return {" ".join(tokens)}
    return {" ".join(tokens[i:i + size]) for i in range(len(tokens) - size + 1)}


@dataclass
class Method:
    name: str
    fingerprint: Callable[[str], object]
    keys: Callable[[object], list[tuple[int, int]]]  # index rows
    similar: Callable[[object, object], bool]
    bytes_per_doc: int
    index: dict[tuple[int, int], list[int]] = field(default_factory=lambda: defaultdict(list))


def simhash_method(shingle: int, k: int) -> Method:
    def fp(text: str) -> int | None:
        hashes = [xxhash.xxh64_intdigest(s.encode()) for s in shingle_set(text, shingle)]
        half, value = len(hashes) / 2, 0
        for pos, col in enumerate(zip(*(f"{h:064b}" for h in hashes), strict=True)):
            if col.count("1") > half:
                value |= 1 << (63 - pos)
        return value

    return Method(
        f"simhash64 shingle={shingle} k<={k}", fp,
        lambda v: [(i, (v >> (16 * i)) & 0xFFFF) for i in range(4)],  # type: ignore[operator]
        lambda a, b: (a ^ b).bit_count() <= k,  # type: ignore[operator]
        8 + 4 * 12,  # the BIGINT + 4 index rows of (candidate, band, value)
    )


_P = (1 << 61) - 1


def minhash_method(perms: int, bands: int, threshold: float, shingle: int = 3) -> Method:
    rng = random.Random(42)
    coeffs = [(rng.randrange(1, _P), rng.randrange(0, _P)) for _ in range(perms)]
    rows = perms // bands

    def fp(text: str) -> list[int]:
        hashes = [xxhash.xxh64_intdigest(s.encode()) & _P
                  for s in shingle_set(text, shingle)]
        return [min((a * h + b) % _P for h in hashes) for a, b in coeffs]

    def keys(sig: object) -> list[tuple[int, int]]:
        s = sig  # list[int]
        return [(i, xxhash.xxh64_intdigest(repr(s[i * rows:(i + 1) * rows]).encode()))  # type: ignore[index]
                for i in range(bands)]

    def similar(a: object, b: object) -> bool:
        same = sum(x == y for x, y in zip(a, b, strict=True))  # type: ignore[call-overload]
        return same / perms >= threshold

    return Method(f"minhash {perms} perms, {bands}x{rows} LSH, J>={threshold}", fp, keys,
                  similar, perms * 4 + bands * 12)


def courtly_method() -> Method:
    """What courtly uses (courtly.dedup): MinHash by one-permutation hashing, 16-bit values."""
    threshold = 0.8

    def fp(text: str) -> bytes | None:
        return minhash.signature(text, min_words=1)

    def keys(sig: object) -> list[tuple[int, int]]:
        return [(0, key) for key in dedup.band_keys(sig)]  # type: ignore[arg-type]

    def similar(a: object, b: object) -> bool:
        return dedup.similarity(a, b) >= threshold  # type: ignore[arg-type]

    return Method(f"courtly.dedup: oph-minhash {dedup.BINS} bins, {dedup.BANDS}x{dedup.ROWS} "
                  f"LSH, J>={threshold}", fp, keys, similar,
                  dedup.BINS * 2 + 8 + dedup.BANDS * 16)


def run(method: Method, originals: list[str], variants: dict[float, list[str]],
        chromes: list[str], strangers: list[str]) -> dict[str, float]:
    sigs: list[object] = []
    started = time.perf_counter()
    for i, text in enumerate(originals):
        sig = method.fingerprint(text)
        sigs.append(sig)
        for key in method.keys(sig):
            method.index[key].append(i)
    per_doc = (time.perf_counter() - started) / len(originals)

    def lookup(text: str) -> set[int]:
        sig = method.fingerprint(text)
        found: set[int] = set()
        for key in method.keys(sig):
            found.update(j for j in method.index.get(key, ()) if method.similar(sig, sigs[j]))
        return found

    result: dict[str, float] = {"ms/doc": per_doc * 1000, "bytes/doc": method.bytes_per_doc}
    for fraction, texts in variants.items():
        hits = sum(i in lookup(t) for i, t in enumerate(texts))
        result[f"recall@{fraction:.1%}"] = hits / len(texts)
    result["recall@chrome"] = sum(i in lookup(t) for i, t in enumerate(chromes)) / len(chromes)
    false = sum(len(lookup(t)) for t in strangers)
    result["false+/query"] = false / len(strangers)
    buckets = [len(v) for v in method.index.values()]
    result["max bucket"] = max(buckets)
    return result


def templated_signatures(pages: int, seed: int) -> list[bytes]:
    """Signatures of pages on one template: 400 words of chrome, 120 words of their own."""
    rng = random.Random(seed)
    vocab = sorted(set(corpus_words()))
    chrome_words = [rng.choice(vocab) for _ in range(400)]
    head, tail = " ".join(chrome_words[:300]), " ".join(chrome_words[300:])
    out = []
    for _ in range(pages):
        own = " ".join(rng.choice(vocab) for _ in range(120))
        sig = minhash.signature(f"{head} {own} {tail}", Dedup().min_words)
        assert sig is not None
        out.append(sig)
    return out


class _Crawl:
    """One crawl database being filled with templated pages as a crawl fills it."""

    def __init__(self, path: str, signatures: list[bytes]) -> None:
        from courtly.model import Link
        from courtly.store.sqlite import SqliteStore

        self.signatures = signatures
        self.store = SqliteStore(path)
        self.store.commit_interval = float("inf")  # committed by hand, every 1,000 pages
        pages = len(signatures)
        self.store.add_links([Link(f"http://a.test/{i}", "http://a.test", 1, 1.0)
                              for i in range(pages)])
        self.store.flush()
        self.candidates = self.store.take_todo("http://a.test", 1, pages, 0.0)
        self.done = 0
        self.found = 0
        self.cpu = [0.0, 0.0, 0.0]  # measured CPU seconds: lookups, records, commits
        self.rusage = 0.0  # measured user + system CPU seconds, from getrusage
        self.measured = 0

    def step(self, pages: int, measure: bool) -> None:
        """Look up and record the next pages, 1,000 a commit."""
        from courtly.model import CrawlAction, ExitCode

        clock = time.process_time
        store, cpu = self.store, [0.0, 0.0, 0.0]
        start = resource.getrusage(resource.RUSAGE_SELF)
        for i in range(self.done, self.done + pages):
            candidate, sig = self.candidates[i], self.signatures[i]
            t0 = clock()
            self.found += store.find_similar(sig, candidate.url, 0.8) is not None
            t1 = clock()
            action = CrawlAction(candidate, "http://a.test", ExitCode.OK, 0.0)
            action.near_signature = sig
            store.record(action, 1)
            t2 = clock()
            if i % 1000 == 999:
                store.flush()
            cpu[0] += t1 - t0
            cpu[1] += t2 - t1
            cpu[2] += clock() - t2
        end = resource.getrusage(resource.RUSAGE_SELF)
        self.done += pages
        if measure:
            self.measured += pages
            self.cpu = [a + b for a, b in zip(self.cpu, cpu, strict=True)]
            self.rusage += (end.ru_utime - start.ru_utime) + (end.ru_stime - start.ru_stime)

    def report(self) -> float:
        """Print the measured CPU a page; return it (µs)."""
        per = self.rusage / self.measured * 1e6
        lookups, records, commits = (c / self.measured * 1e6 for c in self.cpu)
        biggest = self.store._x("SELECT COUNT(*) AS n FROM near_dup_keys GROUP BY key "
                                "ORDER BY n DESC LIMIT 1").fetchone()
        pages = len(self.signatures)
        print(f"{pages:>9,} pages: {per:6.1f} µs a page over the last {self.measured:,} "
              f"(lookups {lookups:.1f}, records {records:.1f}, commits {commits:.1f}); judged "
              f"near-duplicate {self.found:,}; largest bucket {biggest[0] if biggest else 0:,}")
        return per


def index_cost(sizes: list[int], seed: int, random_signatures: bool) -> None:
    """CPU a page of near-duplicate lookups and stores in SQLite crawl databases of these sizes,
    the last fifth of each measured in turns (the same machine load for all), and the ratio of
    each size's to the first's."""
    rng = random.Random(seed)
    pages = max(sizes)
    if random_signatures:
        signatures = [rng.randbytes(2 * dedup.BINS) for _ in range(pages)]
    else:
        signatures = templated_signatures(pages, seed)
    turns = 40
    with tempfile.TemporaryDirectory() as tmp:
        crawls = [_Crawl(f"{tmp}/{n}.db", signatures[:n]) for n in sizes]
        for crawl, n in zip(crawls, sizes, strict=True):
            crawl.step(n - n // 5, measure=False)
        for turn in range(turns):
            for crawl, n in zip(crawls, sizes, strict=True):
                share = n // 5
                crawl.step(share * (turn + 1) // turns - share * turn // turns, measure=True)
        kind = "random" if random_signatures else "templated"
        print(f"{kind} pages, {dedup.BANDS} bands indexed, {dedup.MEMBERS} pages a key, "
              f"measured in {turns} turns:")
        costs = [crawl.report() for crawl in crawls]
        for crawl in crawls:
            crawl.store.close()
    for n, cost in zip(sizes[1:], costs[1:], strict=True):
        print(f"CPU a page at {n:,} pages / at {sizes[0]:,}: {cost / costs[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--index", type=int, nargs="+", metavar="N",
                        help="measure the index's cost at these sizes instead (20000 200000)")
    parser.add_argument("--bands", type=int, help="indexed bands (default: courtly's)")
    parser.add_argument("--random", action="store_true", help="--index: random signatures")
    opts = parser.parse_args()
    if opts.bands:
        dedup.BANDS = opts.bands
    if opts.index:
        index_cost(opts.index, opts.seed, opts.random)
        return
    rng = random.Random(opts.seed)
    stream = corpus_words()
    vocab = sorted(set(stream))
    spans: list[list[str]] = []
    pos = 0
    while len(spans) < 2 * opts.docs and pos < len(stream):
        length = rng.randint(150, 800)
        spans.append(stream[pos:pos + length])
        pos += length
    originals = [" ".join(w) for w in spans[:opts.docs]]
    strangers = [" ".join(w) for w in spans[opts.docs:]]
    variants = {f: [" ".join(edit(w, f, rng, vocab)) for w in spans[:opts.docs]] for f in EDITS}
    chromes = [" ".join(chrome(w, rng, vocab)) for w in spans[:opts.docs]]
    print(f"{len(originals)} documents (150–800 words), {len(strangers)} distinct queries, "
          f"{len(stream)} words of corpus\n")
    methods = [simhash_method(1, 3), simhash_method(2, 3), simhash_method(3, 3),
               minhash_method(128, 16, 0.8), minhash_method(128, 32, 0.7),
               courtly_method()]
    results = {m.name: run(m, originals, variants, chromes, strangers) for m in methods}
    columns = list(next(iter(results.values())))
    width = max(len(n) for n in results)
    print(" " * width + "".join(f"{c:>14}" for c in columns))
    for name, row in results.items():
        print(f"{name:<{width}}" + "".join(f"{row[c]:>14.3g}" for c in columns))


if __name__ == "__main__":
    main()
