"""The configuration examples in the README and docs/ are valid configurations."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from courtly.config import CrawlConfig

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = [
    pytest.param(block, id=f"{path.name}#{i}")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for i, block in enumerate(re.findall(r"```toml\n(.*?)```", path.read_text(), re.S))
]


@pytest.mark.parametrize("block", BLOCKS)
def test_toml_examples_validate(block: str) -> None:
    config = CrawlConfig.model_validate(tomllib.loads(block))
    assert isinstance(config, CrawlConfig)


def test_there_are_examples() -> None:
    assert len(BLOCKS) >= 2
