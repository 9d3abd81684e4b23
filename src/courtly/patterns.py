"""URL patterns as the configuration writes them (literal prefixes, `glob:`, `re:`) compiled to
RE2 regexes; globs to regex bodies. No courtly imports: config validates with it, policy and urls
match with it."""

from __future__ import annotations

import re
from typing import Any

import re2

# Matches the "scheme://authority" part of an absolute URL; path patterns start after it.
_AUTHORITY = r"[^:/?#]+://[^/?#]*"
# RE2 memory budget per compiled set; allocated lazily, so a small rule list costs little.
_MAX_MEM = 256 << 20


def glob_to_regex(glob: str, stay_within: str = "") -> str:
    """Translate a glob (*, ?, [seq], [!seq]) into a regex body (no anchors, valid for RE2 too).

    Wildcards never match the characters of `stay_within` (e.g. "&=" keeps a parameter-name glob
    inside one name).
    """
    anything = f"[^{re.escape(stay_within)}]" if stay_within else "."
    out: list[str] = []
    i = 0
    while i < len(glob):
        char = glob[i]
        i += 1
        if char == "*":
            out.append(anything + "*")
        elif char == "?":
            out.append(anything)
        elif char == "[" and (end := glob.find("]", i + 1)) > 0:
            body = glob[i:end].replace("\\", "\\\\")
            negated = body.startswith("!")
            out.append(f"[^{re.escape(stay_within)}{body[1:]}]" if negated else f"[{body}]")
            i = end + 1
        else:
            out.append(re.escape(char))
    return "".join(out)


def compile_pattern(pattern: str) -> tuple[str, bool]:
    """Translate one pattern to (RE2 regex matched from the start of the URL, is_literal).

    "re:..." is searched anywhere in the URL, or matched at the start of the path when it begins
    with "/"; "glob:..." must match the whole URL (or the whole path+query when it begins with
    "/"); anything else is a literal prefix of the URL (or of the path+query when it begins with
    "/"). Raises ValueError for an empty pattern or an invalid regex.
    """
    literal = False
    if pattern.startswith("re:"):
        body = pattern[3:]
        regex = (_AUTHORITY if body.startswith("/") else ".*?") + "(?:" + body + ")"
    elif pattern.startswith("glob:"):
        body = pattern[5:]
        regex = (_AUTHORITY if body.startswith("/") else "") + glob_to_regex(body) + "$"
    else:
        body, literal = pattern, True
        regex = (_AUTHORITY if body.startswith("/") else "") + re2.escape(body)
    if not body:
        raise ValueError(f"empty pattern: {pattern!r}")
    try:  # quietly: RE2 would log its own two lines to stderr
        re2.compile(body if pattern.startswith("re:") else regex, re2_options())  # not "a)|(b"
        re2.compile(regex, re2_options())
    except re2.error as exc:
        why = exc.args[0] if exc.args else ""
        why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
        raise ValueError(f"invalid regex in pattern {pattern!r}: {why}") from None
    return "(?s)" + regex, literal


def re2_options() -> Any:
    """RE2's options for courtly's patterns: a memory budget, and no logging of its own."""
    options = re2.Options()
    options.max_mem = _MAX_MEM
    options.log_errors = False
    return options
