"""Policy.check() cost per URL with 10, 1,000 and 10,000 patterns, against a naive loop.

The naive baseline compiles the same patterns (same translation) with Python's `re` and tries
them one by one, stopping at the first match, which is what a crawler without a multi-pattern
matcher does. Run: .venv/bin/python bench/policy_bench.py [--quick]
"""

from __future__ import annotations

import functools
import random
import re
import sys
import time
from collections.abc import Callable

from courtly.config import Policies, Traps
from courtly.policy import SET_LIMIT, Policy, compile_pattern

SEED = "https://www.example.org/"


def patterns(n: int, rng: random.Random) -> list[str]:
    """A mix like a real do_not_crawl list: half path prefixes, a quarter globs, a quarter re."""
    out = []
    for i in range(n):
        kind = i % 4
        if kind in (0, 1):
            out.append(f"/{rng.choice(['area', 'docs', 'user'])}{i}/")
        elif kind == 2:
            out.append(f"glob:/files{i}/*.{rng.choice(['pdf', 'zip', 'exe'])}")
        else:
            out.append(f"re:[?&]{rng.choice(['sid', 'token', 'ref'])}{i}=")
    return out


def urls(pats: list[str], count: int, rng: random.Random) -> list[str]:
    """Mostly non-matching URLs (the common case), about 1 in 5 hitting some pattern."""
    out = []
    for _ in range(count):
        i = rng.randrange(1000)
        pattern = rng.choice(pats) if pats else "/"
        if rng.random() < 0.2:  # a URL this pattern refuses
            if pattern.startswith("glob:"):
                out.append("https://www.example.org" + pattern[5:].replace("*", "a/b"))
            elif pattern.startswith("re:"):
                out.append(f"https://www.example.org/x?a=1&{pattern[6:-1]}=2")
            else:
                out.append(f"https://www.example.org{pattern}page.html")
        else:
            depth = "/".join(f"p{rng.randrange(1000)}" for _ in range(rng.randint(1, 5)))
            out.append(f"https://www.example.org/{depth}/item{i}.html?page={rng.randrange(9)}")
    return out


def per_call_us(fn: Callable[[str], object], items: list[str], repeat: int = 3) -> float:
    """Best of `repeat` runs, in microseconds per item."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - start)
    return best / len(items) * 1e6


def check(policy: Policy, url: str) -> bool:
    return policy.check(url, 1).allowed


def naive(pats: list[str]) -> Callable[[str], str | None]:
    compiled = [(p, re.compile(compile_pattern(p)[0])) for p in pats]

    def first_match(url: str) -> str | None:
        for pattern, regex in compiled:
            if regex.match(url):
                return pattern
        return None

    return first_match


def main() -> None:
    quick = "--quick" in sys.argv
    rng = random.Random(42)
    traps = Traps()
    rows = []
    for n in (10, 1_000, 10_000):
        pats = patterns(n, rng)
        start = time.perf_counter()
        policy = Policy(Policies(do_not_crawl=pats), traps, [SEED])
        build_ms = (time.perf_counter() - start) * 1e3
        sample = urls(pats, 2_000 if quick else 20_000, rng)
        check_us = per_call_us(functools.partial(check, policy), sample)
        loop = naive(pats)
        naive_sample = sample[: max(50, 200_000 // max(n, 1))]
        for url in naive_sample[:200]:  # sanity: both refuse the same URLs
            blocked = not policy.check(url, 1).allowed
            assert blocked == (loop(url) is not None), url
        naive_us = per_call_us(loop, naive_sample, repeat=1 if n >= 10_000 else 3)
        refused = sum(1 for u in sample if not policy.check(u, 1).allowed) / len(sample)
        rows.append((n, build_ms, check_us, naive_us, refused))
    scope_policy = Policy(Policies(scope="domain"), traps, [SEED])
    links = urls([], 20_000, rng)
    in_scope_us = per_call_us(scope_policy.in_scope, links)
    empty_us = per_call_us(lambda u: scope_policy.check(u, 1), links)

    print(f"Policy.check() per URL (globs/regexes above {SET_LIMIT} use RE2 Filter, else RE2 Set)")
    print(
        f"{'patterns':>9} | {'build ms':>9} | {'check µs':>9} | {'naive re µs':>12} | "
        f"{'speed-up':>8} | {'refused':>7}"
    )
    print("-" * 70)
    for n, build_ms, check_us, naive_us, refused in rows:
        print(
            f"{n:>9,} | {build_ms:>9.1f} | {check_us:>9.2f} | {naive_us:>12.1f} | "
            f"{naive_us / check_us:>7.1f}x | {refused:>6.0%}"
        )
    print()
    print(f"check() with no patterns (scope + traps only): {empty_us:.2f} µs")
    print(f"in_scope() (scope 'domain', cached per authority): {in_scope_us:.2f} µs")


if __name__ == "__main__":
    main()
