"""The kept pages as WARC 1.1 records, written with warcio (docs/warc.md).

A page kept with its HTTP exchange is a `request` record (the request as sent) and a `response`
record (the status line and headers as received, and the body courtly kept: transfer and content
encodings undone, so those headers are renamed `X-Crawler-…` and a Content-Length is given, as
Nutch and Common Crawl write them); WARC-Concurrent-To links the two. A 304, an exact duplicate or
an unchanged body is a `revisit` record of the kept page. A page kept before courtly kept
exchanges (schema 9) is a `resource` record. Record ids and dates come from the URL and the fetch
time alone, so the same page gives the same records during the crawl (`crawl --warc`) and in
`export --format warc`. During the crawl every other response (a redirect, an error page, a file,
robots.txt, a response cut short: WARC-Truncated says why) is a response record too, written
from the response as received: the database keeps no body of it.

`WarcFiles` rolls files of a configurable size with Heritrix-style names, and keeps a CDXJ index
(pywb's format, written by cdxj-indexer) beside them.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

import zstandard

from courtly import __version__, clock
from courtly.errors import ArchiveError, one_line
from courtly.model import CrawlAction, StoredPage, StoredRevisit
from courtly.processes import pid_alive

if TYPE_CHECKING:
    import asyncio

    from courtly.config import Warc
    from courtly.store import Store
    from courtly.store.database import Database

#: a 304's revisit (WARC 1.1, 6.7.2), and an identical payload's (6.7.1)
NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
#: the index beside the files
INDEX = "index.cdxj"
_IDS = uuid.UUID("6f1d2c2e-5b8e-4c57-9a43-2f0d3c6a7e11")  # the namespace of courtly's record ids
#: a response as received: the request head and response head (with their blank lines), the body
Received = tuple[bytes, bytes, bytes]
#: headers that describe the body as sent, not as kept: renamed when they no longer hold
_ENCODINGS = (b"content-encoding", b"transfer-encoding")


class Fetched(Protocol):
    """A response as fetch.py gives it: what its records are made of."""

    url: str
    body: bytes
    elapsed: float
    request: bytes
    head: bytes


class Damaged(Exception):
    """A stored page or exchange that cannot be read back (nothing of it is written)."""


class Records(Protocol):
    """Where records go: one stream (Archive) or rolling files (WarcFiles)."""

    def write_page(self, page: StoredPage) -> None:
        """Write a page's records (Damaged: nothing is written)."""
        ...

    def write_revisit(self, revisit: StoredRevisit) -> None:
        """Write a revisit's records (Damaged: nothing is written)."""
        ...


def write_all(records: Records, pages: Iterable[StoredPage],
              revisits: Iterable[StoredRevisit]) -> tuple[int, list[str]]:
    """Write the pages, then the revisits; returns how many were written and the URLs of the
    damaged ones (left out)."""
    written, damaged = 0, []
    items: Iterable[StoredPage | StoredRevisit] = itertools.chain(pages, revisits)
    for item in items:
        try:
            if isinstance(item, StoredPage):
                records.write_page(item)
            else:
                records.write_revisit(item)
            written += 1
        except Damaged:
            damaged.append(item.url)
    return written, damaged


def record_id(kind: str, url: str, fetched: float) -> str:
    """The WARC-Record-ID of one record, the same whenever it is written."""
    return f"<urn:uuid:{uuid.uuid5(_IDS, f'{kind} {fetched!r} {url}')}>"


def warc_date(fetched: float) -> str:
    """A fetch time as WARC-Date (UTC, microseconds)."""
    from warcio.timeutils import datetime_to_iso_date

    return str(datetime_to_iso_date(
        datetime.fromtimestamp(fetched, UTC).replace(tzinfo=None), use_micros=True))


class Archive:
    """Writes WARC records for stored pages and revisits on one stream (gzip, WARC 1.1)."""

    def __init__(self, stream: BinaryIO, filename: str) -> None:
        from warcio.warcwriter import WARCWriter  # only archiving needs warcio

        self.stream = stream
        self._writer = WARCWriter(stream, gzip=True, warc_version="1.1")
        self._unpack = zstandard.ZstdDecompressor()
        info = {"software": f"courtly/{__version__}", "format": "WARC File Format 1.1",
                "conformsTo": "https://iipc.github.io/warc-specifications/specifications/"
                              "warc-format/warc-1.1/"}
        self._writer.write_record(self._writer.create_warcinfo_record(filename, info))

    def write_page(self, page: StoredPage) -> None:
        """A response and a request record, or a resource record (no exchange kept); all read
        back before a byte is written (Damaged)."""
        body = self._decompress(page.body)
        w = self._writer
        date = warc_date(page.fetched)
        if page.exchange is None:
            w.write_record(w.create_warc_record(
                page.url, "resource", payload=BytesIO(body), length=len(body),
                warc_content_type=page.content_type or "application/octet-stream",
                warc_headers_dict={"WARC-Record-ID": record_id("resource", page.url,
                                                               page.fetched),
                                   "WARC-Date": date}))
            return
        request, head = self._exchange(page.exchange)
        self.write_response(page.url, page.fetched, request, head, body)

    def write_response(self, url: str, fetched: float, request: bytes, head: bytes,
                       body: bytes, truncated: str | None = None) -> None:
        """A response record (its head made true of the body as kept: `as_kept`; truncated: why
        the body is cut short, WARC-Truncated) and its request record."""
        w = self._writer
        date = warc_date(fetched)
        response_id = record_id("response", url, fetched)
        response = as_kept(head, len(body))
        headers = {"WARC-Record-ID": response_id, "WARC-Date": date}
        if truncated is not None:
            headers["WARC-Truncated"] = truncated
        w.write_record(w.create_warc_record(
            url, "response", payload=BytesIO(response + body),
            length=len(response) + len(body), warc_headers_dict=headers))
        w.write_record(w.create_warc_record(
            url, "request", payload=BytesIO(request), length=len(request),
            warc_headers_dict={"WARC-Record-ID": record_id("request", url, fetched),
                               "WARC-Date": date, "WARC-Concurrent-To": response_id}))

    def write_revisit(self, revisit: StoredRevisit) -> None:
        """A revisit record of the kept page, with its payload digest, and its request."""
        from warcio.statusandheaders import StatusAndHeadersParser
        from warcio.utils import Digester

        original = self._decompress(revisit.original)
        request, head = self._exchange(revisit.exchange)
        not_modified = head.split(b" ", 2)[1:2] == [b"304"]
        if not_modified and revisit.original_exchange is not None:
            head = freshened(self._exchange(revisit.original_exchange)[1], head)
        digest = Digester("sha1")
        digest.update(original)
        w = self._writer
        date = warc_date(revisit.fetched)
        revisit_id = record_id("revisit", revisit.url, revisit.fetched)
        headers = StatusAndHeadersParser([], verify=False).parse(
            BytesIO(as_kept(head, len(original))))
        record = w.create_revisit_record(
            revisit.url, str(digest), revisit.refers_to, warc_date(revisit.refers_to_date),
            http_headers=headers,
            warc_headers_dict={
                "WARC-Record-ID": revisit_id, "WARC-Date": date,
                "WARC-Refers-To": record_id("response", revisit.refers_to,
                                            revisit.refers_to_date)})
        if not_modified:  # the server said it had not changed
            record.rec_headers.replace_header("WARC-Profile", NOT_MODIFIED)
        w.write_record(record)
        w.write_record(w.create_warc_record(
            revisit.url, "request", payload=BytesIO(request), length=len(request),
            warc_headers_dict={"WARC-Record-ID": record_id("request", revisit.url,
                                                           revisit.fetched),
                               "WARC-Date": date, "WARC-Concurrent-To": revisit_id}))

    def _decompress(self, data: bytes) -> bytes:
        try:
            return bytes(self._unpack.decompress(data))
        except zstandard.ZstdError:
            raise Damaged("damaged") from None

    def _exchange(self, data: bytes) -> tuple[bytes, bytes]:
        """The stored exchange: (request head, response head), each with its blank line."""
        return split_exchange(self._decompress(data))


def split_exchange(exchange: bytes) -> tuple[bytes, bytes]:
    """A request head and the response head after it: each with its blank line (Damaged)."""
    request, mark, head = exchange.partition(b"\r\n\r\n")
    if not mark or not head.startswith(b"HTTP/"):
        raise Damaged("damaged exchange")
    return request + mark, head


def freshened(stored: bytes, not_modified: bytes) -> bytes:
    """A kept response's head updated with a 304's header fields, as a cache updates it (RFC
    9111 §3.2: each replaces the stored fields of its name; Content-Length excepted): the
    response the 304 stands for. pywb replays a revisit with its own head, and a 304's own
    head is an empty page to a browser."""
    fresh = [line for line in not_modified.split(b"\r\n")[1:] if line]
    names = {_field_name(line) for line in fresh} - {b"content-length"}
    lines = stored.split(b"\r\n")
    kept = [line for line in lines[1:] if line and _field_name(line) not in names]
    updates = [line for line in fresh if _field_name(line) in names]
    return b"\r\n".join([lines[0], *kept, *updates]) + b"\r\n\r\n"


def _field_name(line: bytes) -> bytes:
    """A header line's field name, lower case."""
    return line.partition(b":")[0].strip().lower()


def as_kept(head: bytes, length: int) -> bytes:
    """A response head as received, made true of the body as kept (decoded, of this length):
    Content-Encoding and Transfer-Encoding renamed X-Crawler-…, a differing Content-Length too,
    and the body's own Content-Length added (what Nutch and Common Crawl write)."""
    lines = head.split(b"\r\n")
    out = [lines[0]]
    length_line = b"Content-Length: %d" % length
    kept_length = False
    for line in lines[1:]:
        if not line:
            continue
        name, value = _field_name(line), line.partition(b":")[2]
        if name in _ENCODINGS and value.strip().lower() != b"identity":
            line = b"X-Crawler-" + line
        elif name == b"content-length":
            if value.strip() == b"%d" % length and not kept_length:
                kept_length = True
            else:
                line = b"X-Crawler-" + line
        out.append(line)
    if not kept_length:
        out.append(length_line)
    return b"\r\n".join(out) + b"\r\n\r\n"


class WarcFiles:
    """WARC files in a directory, a new one past max_size bytes, named the way Heritrix names
    them (prefix-timestamp-serial-pid~host.warc.gz; `.open` while written), each indexed into
    the directory's CDXJ index when it is closed."""

    def __init__(self, directory: str | Path, max_size: int, prefix: str = "courtly") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        recover_leftovers(self.directory)
        self.max_size = max_size
        self.prefix = prefix
        self.files: list[Path] = []  # closed so far
        self._serial = 0
        self._open: tuple[Path, BinaryIO, Archive] | None = None

    def write_page(self, page: StoredPage) -> None:
        """Write a page's records (Damaged: nothing is written)."""
        self._write(lambda archive: archive.write_page(page))

    def write_revisit(self, revisit: StoredRevisit) -> None:
        """Write a revisit's records (Damaged: nothing is written)."""
        self._write(lambda archive: archive.write_revisit(revisit))

    def write_received(self, url: str, fetched: float, received: Received,
                       truncated: str | None = None) -> None:
        """Write the records of a response the database does not keep."""
        request, head, body = received
        self._write(lambda archive: archive.write_response(url, fetched, request, head, body,
                                                           truncated))

    def _write(self, write: Callable[[Archive], None]) -> None:
        if self._open is None:
            self._open = self._new_file()
        _, stream, archive = self._open
        write(archive)
        if stream.tell() >= self.max_size:
            self.close()

    def _new_file(self) -> tuple[Path, BinaryIO, Archive]:
        now = time.time()
        stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}"
        name = (f"{self.prefix}-{stamp}-{self._serial:05d}-{os.getpid()}~"
                f"{socket.gethostname()}.warc.gz")
        self._serial += 1
        path = self.directory / name
        stream = open(path.with_name(name + ".open"), "wb")  # noqa: SIM115 - closed in close()
        return path, stream, Archive(stream, name)

    def close(self) -> None:
        """Close the open file (its final name, then indexed)."""
        if self._open is None:
            return
        path, stream, _ = self._open
        self._open = None
        stream.close()
        path.with_name(path.name + ".open").replace(path)
        self.files.append(path)
        add_to_index(self.directory / INDEX, path)


def recover_leftovers(directory: Path) -> None:
    """The files a process of this machine left `.open` when it was killed: each cut after its
    last whole record, given its final name and indexed (before, their pages were in no index:
    pywb could not replay them). A live writer's file, or another machine's, is left alone."""
    for path in sorted(directory.glob("*.warc.gz.open")):
        pid, host = writer_of(path.name)
        if host != socket.gethostname() or pid is None or pid_alive(pid):
            continue
        with open(path, "r+b") as stream:
            stream.truncate(_whole_records(stream))
        final = path.with_name(path.name.removesuffix(".open"))
        path.replace(final)
        add_to_index(directory / INDEX, final)


def writer_of(name: str) -> tuple[int | None, str]:
    """The process id and host a WARC file's name gives (WarcFiles' names: …-PID~HOST.warc.gz;
    a host name may hold '-', never '~')."""
    head, _, host = name.removesuffix(".open").removesuffix(".warc.gz").rpartition("~")
    pid = head.rpartition("-")[2]
    return (int(pid) if pid.isdecimal() else None), host


def _whole_records(stream: BinaryIO) -> int:
    """Where the last whole record of a WARC file ends (a killed writer's last may be cut)."""
    from warcio.archiveiterator import ArchiveIterator

    end = 0
    records = ArchiveIterator(stream)
    with contextlib.suppress(Exception):  # a cut record, whatever warcio calls it: it ends here
        for record in records:
            records.read_to_end(record)
            end = records.get_record_offset() + records.get_record_length()
    return end


def archive_action(files: WarcFiles, store: Store, action: CrawlAction) -> None:
    """Write a recorded crawl action's records (`crawl --warc`): what the store kept of it, a
    page or a revisit, read as the export reads it; else the response as received (a
    redirect, an error page, a file: the database keeps no body of it)."""
    url, fetched = action.candidate.url, action.started
    revisit = store.revisit(url, fetched) if action.exchange is not None else None
    if revisit is not None:
        files.write_revisit(revisit)
    elif action.content is not None and action.exchange is not None:
        files.write_page(StoredPage(url, fetched, action.content_type, action.content,
                                    action.exchange))
    elif action.received is not None:
        files.write_received(url, fetched, action.received, action.truncated)


class CrawlArchive:
    """`crawl --warc`: each recorded crawl action's records, written as it is recorded; a
    failure (ArchiveError, or a bug) goes to `failed`, which stops the crawl."""

    def __init__(self, files: WarcFiles, store: Store, failed: Callable[[Exception], None]
                 ) -> None:
        self.files = files
        self.store = store
        self.failed = failed

    @classmethod
    def of(cls, config: Warc, store: Store, failed: Callable[[Exception], None]
           ) -> CrawlArchive | None:
        """The crawl's archive, or None without a WARC directory."""
        if config.dir is None:
            return None
        return cls(WarcFiles(config.dir, config.max_size, config.prefix), store, failed)

    def recorded(self, db: Database, action: CrawlAction) -> None:
        """The action was recorded: its records are written after it, read back as written
        (on the database thread, in its order)."""
        db.later(self.keep, action).add_done_callback(self._kept)

    def fetched(self, db: Database, resp: Fetched, most: int) -> None:
        """A response no crawl action records (robots.txt, its redirects; a body of `most`
        bytes was cut there): its records are written after the writes queued so far."""
        when = clock.now() - resp.elapsed
        db.later(self._write_received, resp.url, when, (resp.request, resp.head, resp.body),
                 "length" if len(resp.body) >= most else None).add_done_callback(self._kept)

    def keep(self, action: CrawlAction) -> None:
        """Write the action's records (ArchiveError: they could not be written)."""
        if action.exchange is not None or action.received is not None:
            with _write_errors():
                archive_action(self.files, self.store, action)

    def _write_received(self, url: str, fetched: float, received: Received,
                        truncated: str | None) -> None:
        with _write_errors():
            self.files.write_received(url, fetched, received, truncated)

    def _kept(self, done: asyncio.Future[None]) -> None:
        exc = done.exception()
        if isinstance(exc, Exception):
            self.failed(exc)

    def close(self) -> None:
        """Close the last file (and index it)."""
        self.files.close()


@contextlib.contextmanager
def _write_errors() -> Iterator[None]:
    """An OSError while writing records is an ArchiveError (one line: the crawl stops)."""
    try:
        yield
    except OSError as exc:
        raise ArchiveError(f"cannot write WARC file: {one_line(exc)}") from None


def add_to_index(index: Path, warc: Path) -> None:
    """Merge a WARC file's CDXJ lines (cdxj-indexer, sorted) into the sorted index beside it."""
    from cdxj_indexer.main import write_cdx_index

    fresh = index.with_name(f".{warc.name}.cdxj")
    write_cdx_index(str(fresh), [str(warc)], {"sort": True})
    merged = index.with_name(f".{INDEX}.new")
    with open(fresh, encoding="utf-8") as new, open(merged, "w", encoding="utf-8") as out:
        if index.exists():
            with open(index, encoding="utf-8") as old:
                out.writelines(heapq.merge(old, new))
        else:
            out.writelines(new)
    merged.replace(index)
    fresh.unlink()
