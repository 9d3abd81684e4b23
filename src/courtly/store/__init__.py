"""The crawl database behind one interface; `open_store` picks the backend from --db."""

from __future__ import annotations

from courtly.model import OriginState
from courtly.store.base import ConnectionLost, Store, StoreError


def open_store(db: str) -> Store:
    """A path opens SQLite; a postgresql:// URL opens the shared PostgreSQL store."""
    if db.startswith(("postgresql://", "postgres://")):
        from courtly.store.postgres import PostgresStore

        return PostgresStore(db)
    from courtly.store.sqlite import SqliteStore

    return SqliteStore(db)


__all__ = ["ConnectionLost", "OriginState", "Store", "StoreError", "open_store"]
