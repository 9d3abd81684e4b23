"""Schema migrations, shared by the SQLite and PostgreSQL backends (portable SQL, but for the
statements marked `Postgres`)."""

from __future__ import annotations


class Postgres(str):
    """A migration statement for PostgreSQL alone (SQLite's backend skips it): what a database
    many workers share needs and one machine's does not."""


#: the tables a crawl action writes, which a sharded database would distribute by partition
#: (docs/distributed.md): on PostgreSQL each row carries its URL's partition, `part` (migration
#: 13; these constants are part of it: never change them, a later migration has its own)
HOT_TABLES = ("candidates", "crawl_log", "content", "redirects", "revisits", "near_dup",
              "near_dup_keys", "near_dup_recent")
#: the hot tables whose rows belong to a candidate: the column naming its URL, or its id
PART_FROM_URL = {"content": "url", "redirects": "url", "revisits": "url"}
PART_FROM_CANDIDATE = {"near_dup": "candidate", "near_dup_keys": "candidate",
                       "near_dup_recent": "candidate"}
#: each hot table's keys after migration 13: (constraint, definition). Keys by URL lead with the
#: partition; keys by a serial id or a band key, which are looked up across partitions (the
#: view's tail of the log, find_similar, a band key's bucket), end with it
_KEYS_13 = {
    "candidates": [("candidates_pkey", "PRIMARY KEY (id, part)"),
                   ("candidates_url_key", "UNIQUE (part, url)")],
    "crawl_log": [("crawl_log_pkey", "PRIMARY KEY (id, part)")],
    "content": [("content_pkey", "PRIMARY KEY (part, url)")],
    "redirects": [("redirects_pkey", "PRIMARY KEY (part, url)")],
    "revisits": [("revisits_pkey", "PRIMARY KEY (part, url, fetched)")],
    "near_dup": [("near_dup_pkey", "PRIMARY KEY (candidate, part)")],
    "near_dup_keys": [("near_dup_keys_6_pkey", "PRIMARY KEY (key, candidate, part)")],
    "near_dup_recent": [("near_dup_recent_pkey", "PRIMARY KEY (key, candidate, part)")],
}
#: the frontier's indexes and the log's by URL, as migration 13 makes them: by partition first
_INDEXES_13 = [
    "cand_fresh ON candidates (part, origin, score DESC, id, url, depth, state) "
    "WHERE state = 'NOT_CRAWLED'",
    "cand_queued ON candidates (part, origin, taken_run) WHERE state = 'QUEUED'",
    "cand_due ON candidates (part, origin, next_due) WHERE state IN ('CRAWLED', 'ERROR')",
    "crawl_log_url ON crawl_log (part, url)",
]


def _migration_13() -> list[str]:
    """Every hot table's rows get their partition (their origin's, as `origins.part` holds it;
    -1 where it is not known yet: PostgresStore.ensure_partitions gives them theirs when a
    worker joins), then their keys name it."""
    fill = [f"ALTER TABLE {t} ADD COLUMN part INTEGER NOT NULL DEFAULT -1" for t in HOT_TABLES]
    fill += [f"UPDATE {t} x SET part = o.part FROM origins o WHERE o.origin = x.origin "
             "AND o.part IS NOT NULL" for t in ("candidates", "crawl_log")]
    fill += [f"UPDATE {t} x SET part = c.part FROM candidates c WHERE c.url = x.{column}"
             for t, column in PART_FROM_URL.items()]
    fill += [f"UPDATE {t} x SET part = c.part FROM candidates c WHERE c.id = x.{column}"
             for t, column in PART_FROM_CANDIDATE.items()]
    fill += [f"ALTER TABLE {t} ALTER COLUMN part DROP DEFAULT" for t in HOT_TABLES]
    keys = [f"ALTER TABLE {table} " + ", ".join(
        [f"DROP CONSTRAINT {name}" for name, _ in named]
        + [f"ADD CONSTRAINT {name} {key}" for name, key in named])
        for table, named in _KEYS_13.items()]
    indexes = [f"DROP INDEX {i.split()[0]}" for i in _INDEXES_13]
    indexes += [f"CREATE INDEX {i}" for i in _INDEXES_13]
    return [Postgres(s) for s in fill + keys + indexes]


#: migration N brings the schema from version N-1 to N; never edit a released one, add a new one
MIGRATIONS: list[list[str]] = [
    [
        """CREATE TABLE origins (
            origin TEXT PRIMARY KEY,
            configured INTEGER NOT NULL DEFAULT 1,
            robots_body BYTEA,
            robots_status INTEGER,
            robots_fetched DOUBLE PRECISION,
            crawl_delay DOUBLE PRECISION,
            backoff_until DOUBLE PRECISION NOT NULL DEFAULT 0,
            backoff_level INTEGER NOT NULL DEFAULT 0,
            sitemaps TEXT NOT NULL DEFAULT '[]',
            metadata TEXT NOT NULL DEFAULT '{}'
        )""",
        """CREATE TABLE candidates (
            id BIGSERIAL_PK,
            url TEXT NOT NULL UNIQUE,
            origin TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'NOT_CRAWLED',
            depth INTEGER NOT NULL DEFAULT 0,
            score DOUBLE PRECISION NOT NULL DEFAULT 1.0,
            taken_run BIGINT,
            attempts INTEGER NOT NULL DEFAULT 0,
            last_crawl DOUBLE PRECISION,
            next_due DOUBLE PRECISION,
            recrawl_interval DOUBLE PRECISION,
            exit_code TEXT,
            http_status INTEGER,
            etag TEXT,
            last_modified TEXT,
            content_hash TEXT,
            simhash BIGINT,
            content_type TEXT,
            content_length BIGINT,
            redirect_target TEXT,
            canonical TEXT,
            duplicate_of TEXT,
            detail TEXT
        )""",
        "CREATE INDEX cand_fresh ON candidates (origin, score DESC, id) "
        "WHERE state = 'NOT_CRAWLED'",
        "CREATE INDEX cand_queued ON candidates (origin, taken_run) WHERE state = 'QUEUED'",
        "CREATE INDEX cand_due ON candidates (origin, next_due) "
        "WHERE state IN ('CRAWLED', 'ERROR')",
        "CREATE INDEX cand_hash ON candidates (content_hash) WHERE content_hash IS NOT NULL",
        """CREATE TABLE crawl_log (
            id BIGSERIAL_PK,
            run BIGINT NOT NULL,
            url TEXT NOT NULL,
            origin TEXT NOT NULL,
            started DOUBLE PRECISION NOT NULL,
            elapsed DOUBLE PRECISION NOT NULL,
            exit_code TEXT NOT NULL,
            http_status INTEGER,
            content_type TEXT,
            content_length BIGINT,
            detail TEXT,
            worker TEXT
        )""",
        "CREATE INDEX crawl_log_url ON crawl_log (url)",
        """CREATE TABLE redirects (
            url TEXT PRIMARY KEY,
            target TEXT NOT NULL,
            status INTEGER NOT NULL,
            seen DOUBLE PRECISION NOT NULL
        )""",
        """CREATE TABLE content (
            url TEXT PRIMARY KEY,
            content_hash TEXT NOT NULL,
            fetched DOUBLE PRECISION NOT NULL,
            body BYTEA NOT NULL
        )""",
        """CREATE TABLE runs (
            id BIGSERIAL_PK,
            started DOUBLE PRECISION NOT NULL,
            finished DOUBLE PRECISION
        )""",
    ],
    # 2: near-duplicate index — each simhash cut into 4 bands of 16 bits (courtly.dedup)
    [
        """CREATE TABLE simhash_bands (
            candidate BIGINT NOT NULL,
            band INTEGER NOT NULL,
            value INTEGER NOT NULL,
            PRIMARY KEY (candidate, band)
        )""",
        "CREATE INDEX simhash_band_value ON simhash_bands (band, value)",
    ],
    # 3: redirect chains are walked backwards from a target (Store.redirect_chain); seed
    # origins are marked, for the address guard (existing configured origins count as seeds)
    [
        "CREATE INDEX redirects_target ON redirects (target)",
        "ALTER TABLE origins ADD COLUMN seed INTEGER NOT NULL DEFAULT 0",
        "UPDATE origins SET seed = configured",
    ],
    # 4: distributed crawling (docs/distributed.md): partitions of origins, workers, leases
    [
        "ALTER TABLE origins ADD COLUMN part INTEGER",
        "ALTER TABLE origins ADD COLUMN finished_run BIGINT",
        "CREATE INDEX origins_part ON origins (part)",
        """CREATE TABLE workers (
            id TEXT PRIMARY KEY,
            host TEXT NOT NULL,
            pid INTEGER NOT NULL,
            started DOUBLE PRECISION NOT NULL,
            heartbeat DOUBLE PRECISION NOT NULL,
            lease_seconds DOUBLE PRECISION NOT NULL DEFAULT 30,
            busy INTEGER NOT NULL DEFAULT 1,
            actions BIGINT NOT NULL DEFAULT 0,
            stopped DOUBLE PRECISION
        )""",
        """CREATE TABLE leases (
            part INTEGER PRIMARY KEY,
            worker TEXT,
            expires DOUBLE PRECISION NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX crawl_log_worker ON crawl_log (worker, started)",
    ],
    # 5: near-duplicates by MinHash (courtly.dedup; bench/dedup_bench.py measured it against
    # the simhash bands of migration 2): one signature per page, one indexed key per LSH band
    [
        "DROP TABLE simhash_bands",
        """CREATE TABLE near_dup (
            candidate BIGINT PRIMARY KEY,
            signature BYTEA NOT NULL
        )""",
        """CREATE TABLE near_dup_keys (
            key BIGINT NOT NULL,
            candidate BIGINT NOT NULL,
            PRIMARY KEY (key, candidate)
        )""",
        "CREATE INDEX near_dup_keys_candidate ON near_dup_keys (candidate)",
    ],
    # 6: band keys in one B-tree (key, candidate) (SQLite: WITHOUT ROWID), no index by candidate:
    # a page's old keys are found from its old signature. Three B-trees per key row were the
    # most expensive write of a crawl action (bench/RESULTS.md).
    [
        """CREATE TABLE near_dup_keys_6 (
            key BIGINT NOT NULL,
            candidate BIGINT NOT NULL,
            PRIMARY KEY (key, candidate)
        ) WITHOUT_ROWID""",
        "INSERT INTO near_dup_keys_6 (key, candidate) SELECT key, candidate FROM near_dup_keys",
        "DROP TABLE near_dup_keys",
        "ALTER TABLE near_dup_keys_6 RENAME TO near_dup_keys",
    ],
    # 7: the fresh-candidate index covers what take_todo reads of a NOT_CRAWLED URL (its url and
    # depth; the rest is still at its default), so filling a todo list reads a few index pages
    # instead of one table page per URL (2.3-4x slower at 10M known URLs than at 100k before);
    # state is a column too, or SQLite 3.40 does not count the index as covering
    [
        "DROP INDEX cand_fresh",
        "CREATE INDEX cand_fresh ON candidates (origin, score DESC, id, url, depth, state) "
        "WHERE state = 'NOT_CRAWLED'",
    ],
    # 8: why the last robots.txt fetch failed (status or network error), so `courtly check`
    # can say why an origin's URLs wait; cleared when robots.txt is read again
    [
        "ALTER TABLE origins ADD COLUMN robots_error TEXT",
    ],
    # 9: the HTTP exchange of a kept page (its request head and response head, as sent and
    # received, zstd-compressed together), for WARC request and response records; a 304 or an
    # exact duplicate of a kept page is a revisit of it (WARC revisit records)
    [
        "ALTER TABLE content ADD COLUMN exchange BYTEA",
        """CREATE TABLE revisits (
            url TEXT NOT NULL,
            fetched DOUBLE PRECISION NOT NULL,
            exchange BYTEA NOT NULL,
            refers_to TEXT NOT NULL,
            refers_to_date DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (url, fetched)
        )""",
    ],
    # 10: fencing (docs/distributed.md): a lease's epoch grows each time a worker takes it; a
    # worker's writes for a partition carry the epoch it holds, and the database refuses them once
    # the lease expired or passed on
    [
        "ALTER TABLE leases ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0",
    ],
    # 11: a page's band keys go first to a small table, merged into near_dup_keys in key order
    # every dedup.RECENT keys (a key inserted at random into the large B-tree dirtied a page of it
    # each: a commit wrote 5 pages a crawled page at 200,000 pages, 1 at 20,000); each key row
    # holds the page's sketch (dedup.sketch), so a lookup reads no signature of a page whose
    # sketch is too far (the rows of one key are together: the pages of a bucket cost no random
    # reads into 256-byte signatures)
    [
        "ALTER TABLE near_dup_keys ADD COLUMN sketch BYTEA",
        """CREATE TABLE near_dup_recent (
            key BIGINT NOT NULL,
            candidate BIGINT NOT NULL,
            sketch BYTEA NOT NULL,
            PRIMARY KEY (key, candidate)
        ) WITHOUT_ROWID""",
    ],
    # 12: the bits of the keys merged into near_dup_keys (dedup.FILTER_BITS, a key's bit: its low
    # bits), written with each merge: a crawl that is the database's only writer probes the index
    # for the keys whose bit is set alone (most pages: none)
    [
        """CREATE TABLE near_dup_filter (
            id INTEGER PRIMARY KEY,
            bits BYTEA NOT NULL
        )""",
    ],
    # 13: sharding by partition (docs/distributed.md): on PostgreSQL the hot tables' rows carry
    # their URL's partition and their keys name it, so that a crawl action's statements name one
    # partition (Citus's distribution column); SQLite, one machine's, is left as it was
    _migration_13(),
    # 14: PostgreSQL keeps a stored body and exchange as they come (zstd already: no pglz try)
    # and in the row up to a page's size, not in the TOAST table: a 2-8 KB compressed page cost
    # a second heap row and a TOAST index entry (the content insert 37 -> 20 us; bench/RESULTS.md)
    [Postgres("ALTER TABLE content ALTER COLUMN body SET STORAGE EXTERNAL, "
              "ALTER COLUMN exchange SET STORAGE EXTERNAL, SET (toast_tuple_target = 8160)"),
     Postgres("ALTER TABLE revisits ALTER COLUMN exchange SET STORAGE EXTERNAL")],
    # 15: PostgreSQL's band keys are all in near_dup_keys, so a look-up probes no other table:
    # the keys it staged in near_dup_recent before writing them straight in are merged
    [Postgres("INSERT INTO near_dup_keys (key, candidate, sketch, part) SELECT key, candidate, "
              "sketch, part FROM near_dup_recent ON CONFLICT DO NOTHING"),
     Postgres("DELETE FROM near_dup_recent")],
    # 16: each worker's configuration that the fleet should share (distributed.shared_settings,
    # JSON), so that a worker joining with another one says so (SQLite has no fleet)
    [Postgres("ALTER TABLE workers ADD COLUMN IF NOT EXISTS settings TEXT")],
    # 17: politeness across a restart (docs/reliability.md): when each origin was last asked
    # (wall clock), and whether the run's last process stopped cleanly (else: it may be now)
    ["ALTER TABLE origins ADD COLUMN last_request DOUBLE PRECISION",
     "ALTER TABLE runs ADD COLUMN stopped DOUBLE PRECISION"],
]
