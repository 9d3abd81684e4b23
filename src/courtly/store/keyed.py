"""How a hot statement names the partition column: in its key on PostgreSQL, whose hot tables'
rows carry their URL's partition (`part`, migration 13), not at all on SQLite (docs/distributed.md,
sharding by partition)."""

from __future__ import annotations

import re

_PARTED = re.compile(r"\[\[(.*?)\]\]")


def keyed(template: str, parted: bool) -> str:
    """The statement for a backend: the template's [[…]] parts (those naming `part`) kept if its
    hot tables carry the partition (`parted`), dropped if not."""
    return _PARTED.sub(r"\1" if parted else "", template)


class Keyed:
    """A hot statement as a store's class attribute (`keyed` for its class's `parted`): made
    once per store class, then read as a plain class attribute."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, store: object | None, owner: type) -> str:
        text = keyed(self.template, bool(getattr(owner, "parted", False)))
        if store is not None:  # the store's own class: later reads find the text itself
            setattr(owner, self.name, text)
        return text
