"""The crawl database behind one interface; `open_store` picks the backend from --db."""

from __future__ import annotations

from courtly.model import OriginState
from courtly.store.base import ConnectionLost, Store, StoreError


def open_store(db: str, reconnect_seconds: float | None = None) -> Store:
    """A path opens SQLite; a postgresql:// URL opens the shared PostgreSQL store, which waits
    for its server up to reconnect_seconds (`[fleet] reconnect_seconds` by default)."""
    if db.startswith(("postgresql://", "postgres://")):
        from courtly.store.postgres import PostgresStore

        return PostgresStore(db) if reconnect_seconds is None else PostgresStore(
            db, reconnect_seconds)
    from courtly.store.sqlite import SqliteStore

    return SqliteStore(db)


__all__ = ["ConnectionLost", "OriginState", "Store", "StoreError", "open_store"]
