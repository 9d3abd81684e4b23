"""The configuration examples in the README and docs/ are valid and mean what they say."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from courtly.config import CrawlConfig

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = [
    pytest.param(block, id=f"{path.name}#{i}")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for i, block in enumerate(re.findall(r"```toml\n(.*?)```", path.read_text(), re.S))
]
#: top-level shorthands that fold into a section (CrawlConfig.model_post_init)
SHORTHANDS = {"min_delay": ("politeness", "min_delay"), "obey_robots": ("robots", "obey")}


Setting = tuple[tuple[str, ...], Any]


def settings(table: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[Setting]:
    """(key path, value) for every value a TOML block sets; tables of tables are walked."""
    for key, value in table.items():
        if isinstance(value, dict) and key != "strategy_args":
            yield from settings(value, (*path, key))
        else:
            yield (*path, key), value


def read_back(config: Any, path: tuple[str, ...]) -> Any:
    for key in SHORTHANDS.get(path[0], path) if len(path) == 1 else path:
        config = config[key] if isinstance(config, dict) else getattr(config, key)
    return config


@pytest.mark.parametrize("block", BLOCKS)
def test_toml_examples_set_what_they_say(block: str) -> None:
    """Each key of an example is one courtly reads, with the value the example gives it."""
    table = tomllib.loads(block)
    config = CrawlConfig.model_validate(table)
    found = list(settings(table))
    assert found, "an empty example"
    for path, value in found:
        got = read_back(config, path)
        if isinstance(got, list) and got and hasattr(got[0], "model_dump"):
            got = [item.model_dump() for item in got]
        assert got == value, (".".join(path), got, value)


def test_there_are_examples() -> None:
    assert len(BLOCKS) >= 2


def test_the_readme_lists_every_crawl_flag() -> None:
    """The README's flag table for `courtly crawl` names exactly the flags the command has."""
    from click.testing import CliRunner

    from courtly.cli import main

    help_text = CliRunner().invoke(main, ["crawl", "--help"], terminal_width=200).output
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", help_text)) - {"--help"}
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("`courtly crawl [SEED ...]` options"):]
    table = table[: table.index("\n\n", table.index("| flag"))]
    listed = set(re.findall(r"^\| `(--[a-z-]+)", table, re.M))
    assert listed == flags, (sorted(flags - listed), sorted(listed - flags))
