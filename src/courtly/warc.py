"""The stored pages as a WARC file (`courtly export --format warc`), written with warcio.

One `resource` record a page: the body courtly kept (not the HTTP exchange, whose headers it does
not keep), its media type and the time it was fetched.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from io import BytesIO
from typing import BinaryIO

import zstandard

from courtly import __version__
from courtly.model import StoredPage


def write_warc(stream: BinaryIO, pages: Iterable[StoredPage]) -> tuple[int, list[str]]:
    """Write a gzipped WARC 1.1 file: a warcinfo record, then the pages; returns how many pages
    were written and the URLs whose stored body is damaged (left out)."""
    from warcio.timeutils import datetime_to_iso_date  # only this command needs warcio
    from warcio.warcwriter import WARCWriter

    writer = WARCWriter(stream, gzip=True, warc_version="1.1")
    info = {"software": f"courtly/{__version__}", "format": "WARC File Format 1.1"}
    writer.write_record(writer.create_warcinfo_record("courtly-export.warc.gz", info))
    unpack = zstandard.ZstdDecompressor()
    written = 0
    damaged: list[str] = []
    for page in pages:
        try:
            body = unpack.decompress(page.body)
        except zstandard.ZstdError:
            damaged.append(page.url)
            continue
        fetched = datetime.fromtimestamp(page.fetched, UTC).replace(tzinfo=None)
        headers = {"WARC-Date": datetime_to_iso_date(fetched, use_micros=True)}
        record = writer.create_warc_record(
            page.url, "resource", payload=BytesIO(body), length=len(body),
            warc_content_type=page.content_type or "application/octet-stream",
            warc_headers_dict=headers,
        )
        writer.write_record(record)
        written += 1
    stream.flush()
    return written, damaged

