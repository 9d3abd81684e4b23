"""robots.txt parsing and matching against hostile files, in CPU time (issue 26 item 6c).

Figures for the courtly on PYTHONPATH, so that two trees can be compared run for run:

    git archive BEFORE src | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before/src .venv/bin/python bench/robots_bench.py
    PYTHONPATH=src .venv/bin/python bench/robots_bench.py

Each figure is the least CPU time of a few runs of the same work, except "new paths", where each
path is matched once (a matcher that builds state per path, as RE2's DFA did, pays each time).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/, for the files

from tests.robots_files import cpu_seconds as cpu
from tests.robots_files import hostile_robots, hundred_rules, path_of_parts

from courtly.robots import RobotsRules

UA = "courtly/0.1 (+http://example.org/bot)"
URL = "https://example.org/blog/2024/05/some-article-title.html?utm=1"


def main() -> None:
    """Print one line of figures."""
    out: dict[str, float] = {}
    body = hostile_robots()
    parsed: list[RobotsRules] = []
    out["issue file: parse ms"] = cpu(
        lambda: parsed.append(RobotsRules.parse(body, UA, 1 << 20)), 5) * 1e3
    rules = parsed[0]
    rnd = random.Random(1)
    paths = ["/" + "".join(rnd.choice(letters) for _ in range(n))
             for letters in ("abcdefghij0123/-", "abcdef") for n in (20, 300, 2047)]
    out["issue file: worst match ms"] = max(
        cpu(lambda path=path: rules.allowed(path), 5) for path in paths) * 1e3  # type: ignore[misc]
    few = RobotsRules.parse(hostile_robots(95, 20), UA)
    rnd = random.Random(2)
    out["95 rules of 20 wildcards, new paths: worst ms"] = max(
        cpu(lambda: few.allowed("/" + "".join(rnd.choices("abcdef", k=2000))), 1)
        for _ in range(20)) * 1e3
    usual = RobotsRules.parse(hundred_rules(), UA)
    out["100 rules, new paths of their parts: worst ms"] = max(
        cpu(lambda path=path: usual.allowed(path), 1)  # type: ignore[misc]
        for path in [path_of_parts(rnd, hundred_rules()) for _ in range(20)]) * 1e3
    out["100 rules, a usual URL: µs"] = cpu(
        lambda: [usual.allowed(URL) for _ in range(10_000)], 3) / 10_000 * 1e6
    plain = RobotsRules.parse(b"User-agent: *\nDisallow: /private/\n", UA)
    out["2 literal rules: µs"] = cpu(
        lambda: [plain.allowed(URL) for _ in range(10_000)], 3) / 10_000 * 1e6
    sitemaps = b"".join(b"Sitemap: https://example.org/s%d.xml\n" % i for i in range(13_000))
    out["13,000 Sitemap lines: parse ms"] = cpu(lambda: RobotsRules.parse(sitemaps, UA), 1) * 1e3
    print(" | ".join(f"{name}: {value:.2f}" for name, value in out.items()))


if __name__ == "__main__":
    main()
