"""robots.txt files for the tests and bench/robots_bench.py: a usual one, hostile ones."""

from __future__ import annotations

import random


def hundred_rules() -> bytes:
    """A 100-rule group: 70 literal prefixes and 30 wildcard patterns."""
    lines = ["User-agent: *"]
    lines += [f"{'Allow' if i % 5 == 0 else 'Disallow'}: /section{i}/page{i}/" for i in range(70)]
    lines += [f"Disallow: /*param{i}=*" for i in range(25)]
    lines += [f"Disallow: /*.ext{i}$" for i in range(3)]
    lines += ["Disallow: /*/print/*/x*.html$", "Allow: /*?page=*&sort=*"]
    return ("\n".join(lines) + "\n").encode()


def hostile_robots(rules: int = 10_000, wildcards: int = 20, allow: bool = True) -> bytes:
    """Issue 26's pathological robots.txt: 10,000 rules of 20 wildcards each, two letters of
    a-f a part (705 KB: parsed whole with a 1 MiB limit); Allow and Disallow alternate, unless
    ``allow`` is false (then every rule is a Disallow)."""
    rnd = random.Random(26)
    lines = ["User-agent: *"]
    for i in range(rules):
        parts = ["".join(rnd.choice("abcdef") for _ in range(2)) for _ in range(wildcards)]
        lines.append(f"{'Allow' if allow and i % 2 else 'Disallow'}: /*" + "*".join(parts))
    return ("\n".join(lines) + "\n").encode()
