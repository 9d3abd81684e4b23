"""The `courtly` command."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import logging
import os
import sqlite3
import ssl
import sys
from collections.abc import Callable, Coroutine, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, TypeVar, cast

import click

from courtly.config import WARC_MAX_SIZE, ConfigError, CrawlConfig, Politeness, load_config
from courtly.errors import describe
from courtly.store import Store, StoreError, open_store
from courtly.store.sqlite import SqliteStore, read_only

if TYPE_CHECKING:
    from courtly.crawler import Crawler
    from courtly.stats import CrawlStats
    from courtly.store.postgres import PostgresStore

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, status: int = 2) -> NoReturn:
    """Print one clear line and exit."""
    click.echo(f"courtly: {message}", err=True)
    sys.exit(status)


def default(key: str) -> Any:
    """A configuration key's default, for a flag's help (the flags default to the config's)."""
    return CrawlConfig.model_fields[key].default


def db_option(func: F) -> F:
    """--db, shared by every command."""
    return click.option(
        "--db", default=None, help="Crawl database: a file path or a postgresql:// URL.  "
        f"[default: {default('db')}]"
    )(func)


def config_options(func: F) -> F:
    """The options that map to configuration keys."""
    options = [
        click.option("--config", "config_path", type=click.Path(), help="TOML config file."),
        db_option,
        click.option("--seeds-file", type=click.Path(),
                     help="File with one seed URL per line (# comments)."),
        click.option("--user-agent", help="User-Agent header (its product token is what "
                     f"robots.txt groups match).  [default: {default('user_agent')}]"),
        click.option("--strategy", help="Built-in strategy name or module:Class.  "
                     f"[default: {default('strategy')}]"),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def crawl_options(func: F) -> F:
    """The options of a crawl run, shared by `crawl` and `worker`."""
    options = [
        click.option("--max-actions", type=int, help="Stop after this many crawl actions "
                     f"(0: no budget).  [default: {default('max_actions')}]"),
        click.option("--min-delay", type=float, help="Minimum seconds between requests to one "
                     f"origin.  [default: {Politeness.model_fields['min_delay'].default}]"),
        click.option("--concurrency", type=int, help="Origins crawled at once.  "
                     f"[default: {default('concurrency')}]"),
        click.option(
            "--force-recrawl", is_flag=True, default=None, help="Make every known URL due now."
        ),
        click.option(
            "--progress", type=click.Choice(["auto", "live", "log", "off"]),
            help=f"Progress display.  [default: {default('progress')}]",
        ),
        click.option("--warc", "warc_dir", type=click.Path(file_okay=False),
                     help="Write the kept pages as WARC files (and their CDXJ index) here."),
        click.option(
            "--serve", metavar="[HOST:]PORT",
            help="Serve the live view (page, JSON, /metrics) while crawling (HOST: 127.0.0.1).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_config(config_path: str | None, **flags: Any) -> CrawlConfig:
    """Load the config file and apply the flags, or exit 2 with the reason."""
    if "warc_dir" in flags:  # a key of a section
        flags["warc.dir"] = flags.pop("warc_dir")
    try:
        return load_config(config_path, flags)
    except ConfigError as exc:
        fail(str(exc))


def read_seeds(config: CrawlConfig) -> list[str]:
    """Seeds from the config/flags and --seeds-file, validated and normalized; a seed that
    cannot be crawled is one line naming it (and its line in the seeds file)."""
    from courtly.urls import has_userinfo, host_name_fault, host_of, normalize

    given = [("", seed) for seed in config.seeds]
    if config.seeds_file:
        given += seeds_in_file(config.seeds_file)
    seeds = []
    for where, seed in given:
        url = normalize(seed, None, config.normalize)
        if url is None:
            fail(f"{where}invalid seed URL (need an absolute http or https URL): {seed!r}")
        if has_userinfo(seed):  # shown without them: an error line may end up in a log
            fail(f"{where}invalid seed URL (a user name or password in it: courtly sends no "
                 f"credentials and keeps none; give the URL without them): {url!r}")
        if (fault := host_name_fault(host_of(url))) is not None:
            fail(f"{where}invalid seed URL ({fault}): {seed!r}")
        seeds.append(url)
    return seeds


def seeds_in_file(path: str) -> list[tuple[str, str]]:
    """The seeds of a seeds file, each after where it is ("seeds file F, line N: ")."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig", errors="surrogateescape")
    except OSError as exc:
        fail(f"cannot read seeds file {path}: {exc.strerror}")
    found = []
    # a line's first word is its URL (a URL has no spaces: the rest is a note); # is a comment
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        where = f"seeds file {path}, line {number}: "
        try:  # bytes that are not UTF-8 (a Latin-1 file): refused, not guessed at
            words[0].encode()
        except UnicodeEncodeError:
            shown = words[0].encode(errors="surrogateescape")
            fail(f"{where}not UTF-8 text: {shown[:80]!r}{'…' if len(shown) > 80 else ''}")
        found.append((where, words[0]))
    return found


def shown(db: str) -> str:
    """The --db value for a message: a postgresql:// URL without its user and password."""
    if "://" not in db:
        return db
    from courtly.store.postgres import shown_url

    return shown_url(db)


def db_exists(db: str) -> bool:
    """Whether a crawl database is there (a file, or courtly's tables at a postgresql:// URL)."""
    if "://" not in db:
        return Path(db).exists()
    from courtly.store.postgres import database_exists

    try:
        return database_exists(db)
    except StoreError as exc:
        fail(str(exc), 1)


def sqlite_tables(db: str) -> set[str] | None:
    """The tables in an existing SQLite file, read without changing it (else None)."""
    if "://" in db or not Path(db).is_file():
        return None
    try:
        with read_only(db) as con:
            return {name for (name,) in con.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError:
        return None  # damaged or not SQLite: opening the store explains it


@contextmanager
def crawl_db(db: str, must_exist: bool = False, config: CrawlConfig | None = None
             ) -> Iterator[Store]:
    """The open crawl database (PostgreSQL: waited for up to the config's `[fleet]
    reconnect_seconds`); a database failure is one line and exit status 1.

    An SQLite file without courtly's tables is refused, not migrated: it may be another program's
    (an empty file may become a crawl database, unless the command only reads).
    """
    if must_exist and not db_exists(db):
        fail(f"no crawl database at {shown(db)}")
    tables = sqlite_tables(db)
    if tables is not None and "schema_version" not in tables and (tables or must_exist):
        fail(f"{db} is not a courtly crawl database")
    try:
        store = open_store(db, None if config is None else config.fleet.reconnect_seconds)
    except StoreError as exc:
        fail(str(exc), 1)
    try:
        yield store
    except StoreError as exc:
        fail(str(exc), 1)
    finally:
        store.close()


def inject_seeds(store: Store, config: CrawlConfig, seeds: list[str]) -> int:
    """Pass seeds through the strategy's read_seeds; returns how many became candidates. Its
    decisions (the seeds it scheduled, the domain metadata it saved) are written together once
    it has closed without an error: a strategy that raises leaves the database as it was."""
    from courtly.model import Link
    from courtly.strategy import SeedingContext, StrategyError, load_strategy
    from courtly.urls import normalize, origin_of

    context = SeedingContext(store)
    try:
        strategy = load_strategy(config.strategy, context, config.strategy_args)
    except StrategyError as exc:
        fail(str(exc))
    with strategy_hook(config.strategy, "read_seeds"):
        strategy.read_seeds(io.StringIO("\n".join(seeds)))
    links, given = [], set(seeds)  # the seeds are normalized already (read_seeds)
    for item in strategy.take_scheduled():
        given_url = item.request.url
        url = given_url if given_url in given else normalize(given_url, None, config.normalize)
        if url is not None and not item.dont_queue:
            links.append(Link(url, origin_of(url), item.request.depth, item.score))
    with strategy_hook(config.strategy, "close"):
        strategy.close()  # saves the domain metadata read_seeds wrote (held by the context)
    return store.add_seeds(links, context.saved)


@contextmanager
def strategy_hook(spec: str, hook: str) -> Iterator[None]:
    """Around a call of the strategy's event handler: its exception is one line naming both."""
    try:
        yield
    except Exception as exc:
        fail(f"strategy {spec!r} failed in {hook}: {describe(exc, where=False)}")


class Command(click.Group):
    """The `courtly` group: Ctrl-C in a command (outside a crawl's loop, which stops on it) exits
    quietly with status 130, as a shell's command stopped by SIGINT (click said `Aborted!` and
    exited 1, the status of a failed database)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            sys.exit(130)


@click.group(cls=Command, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="courtly")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """courtly: a polite, persistent web crawler."""
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s")


@main.command()
@click.argument("seeds", nargs=-1)
@config_options
@crawl_options
def crawl(seeds: tuple[str, ...], config_path: str | None, **flags: Any) -> None:
    """Crawl the seeds' origins (with no seeds: resume the crawl in --db)."""
    config = build_config(config_path, seeds=seeds, **flags)
    seed_urls = read_seeds(config)
    if not seed_urls and not db_exists(config.db):
        fail(f"no seeds given and no crawl database at {shown(config.db)} to resume")
    with crawl_db(config.db, config=config) as store:
        status = _crawl(store, config, seed_urls)
    sys.exit(status)


def _crawl(store: Store, config: CrawlConfig, seeds: list[str], continuous: bool = False) -> int:
    from courtly.crawler import Crawler
    from courtly.progress import Progress
    from courtly.strategy import StrategyError, load_strategy

    check_surroundings(config)
    if isinstance(store, SqliteStore):  # a second crawl on the file stops before its seeds
        store.claim()
    if seeds:
        inject_seeds(store, config, seeds)
    if not store.configured_origins() and not continuous:
        fail(f"no seed became a crawl candidate: strategy {config.strategy!r} scheduled none"
             if seeds else "the crawl database has no origins: give seed URLs")
    try:
        strategy = load_strategy(config.strategy, args=config.strategy_args)
    except StrategyError as exc:
        fail(str(exc))
    if not config.robots.obey:
        click.echo("courtly: warning: obey_robots is off: robots.txt is ignored", err=True)
    progress = Progress(config.progress, worker=store.shared)
    _install_uvloop()
    if store.shared:  # a worker of the fleet (docs/distributed.md)
        from courtly.distributed import run_worker

        with progress, serve_errors(config):
            stats = run_worker(cast("PostgresStore", store), config, strategy, progress.update,
                               continuous, run=crawl_runner(config))
        progress.summary(stats)
        return 1 if stats.stop is not None and stats.stop.failed else 0
    crawler = Crawler(config, store, strategy, on_progress=progress.update)
    with progress, serve_errors(config):
        stats = asyncio.run(crawl_runner(config)(crawler))
    progress.summary(stats)
    return 1 if stats.stop is not None and stats.stop.failed else 0


def check_surroundings(config: CrawlConfig) -> None:
    """What the crawl needs around it: its proxy (the key or the environment's), its CA bundle
    and its WARC directory; exit 2 with one line for one it cannot use."""
    from courtly.proxy import Proxies

    try:  # the environment's proxies, as the fetcher will read them
        Proxies.from_environment(os.environ, config.proxy)
    except ValueError as exc:
        fail(str(exc))
    # the key replaces the system's CAs, else SSL_CERT_FILE does (which OpenSSL skips quietly
    # when it cannot load it: every HTTPS site then failed its certificate check)
    source, cafile = (("ca_bundle", config.ca_bundle) if config.ca_bundle is not None
                      else ("SSL_CERT_FILE", os.environ.get("SSL_CERT_FILE")))
    if cafile:
        try:
            ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            fail(f"{source}: cannot load CA certificates from {cafile}: {exc.strerror or exc}")
    if config.warc.dir is not None:
        try:
            Path(config.warc.dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            fail(f"cannot create the WARC directory {config.warc.dir}: {exc.strerror or exc}")


def crawl_runner(config: CrawlConfig) -> Callable[[Crawler], Coroutine[Any, Any, CrawlStats]]:
    """How a crawl runs: by itself, or with its live view served (--serve)."""
    address = config.serve
    if address is None:
        return lambda crawler: crawler.run()
    from courtly.view.server import serve_crawl

    return lambda crawler: serve_crawl(crawler, address)


@contextmanager
def serve_errors(config: CrawlConfig) -> Iterator[None]:
    """The live view cannot be served: one line, before any request is sent."""
    if config.serve is None:  # no view: aiohttp not imported (0.2 s of the crawl's CPU)
        yield
        return
    from courtly.view.server import ViewError

    try:
        yield
    except ViewError as exc:
        fail(str(exc))


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional on some platforms
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


@main.command()
@config_options
@crawl_options
@click.option("--continuous", is_flag=True, help="Keep waiting for new work instead of exiting.")
def worker(config_path: str | None, continuous: bool, **flags: Any) -> None:
    """Join the crawl in a postgresql:// database as one worker of the fleet."""
    config = build_config(config_path, **flags)
    if "://" not in config.db:
        fail("courtly worker needs a shared database: --db postgresql://…")
    seed_urls = read_seeds(config)
    with crawl_db(config.db, config=config) as store:
        status = _crawl(store, config, seed_urls, continuous)
    sys.exit(status)


@main.command("add-seeds")
@click.argument("seeds", nargs=-1)
@config_options
def add_seeds(seeds: tuple[str, ...], config_path: str | None, **flags: Any) -> None:
    """Add seeds (through the strategy's read_seeds) without crawling."""
    config = build_config(config_path, seeds=seeds, **flags)
    seed_urls = read_seeds(config)
    if not seed_urls:
        fail("no seeds given")
    with crawl_db(config.db, config=config) as store:
        added = inject_seeds(store, config, seed_urls)
    click.echo(f"{added} new crawl candidates from {len(seed_urls)} seeds in {shown(config.db)}")


@main.command()
@db_option
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "warc"]), default="jsonl",
              help="jsonl or csv: one record per crawl candidate; warc: the pages kept and "
              "their revisits (every response: crawl --warc).")
@click.option("--out", type=click.Path(), help="Output file (default: standard output).")
@click.option("--warc", "warc_dir", type=click.Path(file_okay=False),
              help="With --format warc: rolling WARC files and their CDXJ index in this "
                   "directory.")
@click.option("--warc-max-size", type=click.IntRange(min=1), default=WARC_MAX_SIZE,
              show_default=True, help="With --warc: bytes after which a new WARC file begins.")
def export(db: str | None, fmt: str, out: str | None, warc_dir: str | None,
           warc_max_size: int) -> None:
    """One record per crawl candidate, or the stored pages as WARC records."""
    db = build_config(None, db=db).db
    if out and is_database_file(out, db):
        fail(f"--out {out} is the crawl database (or its journal): write the export elsewhere")
    if warc_dir and (fmt != "warc" or out):
        fail("--warc DIR goes with --format warc, without --out")
    if fmt == "warc" and not out and not warc_dir and sys.stdout.isatty():
        fail("a WARC file is binary: give --out FILE, --warc DIR or redirect standard output")
    with crawl_db(db, must_exist=True) as store:
        if warc_dir:  # as `crawl --warc` says it (not "cannot write standard output")
            try:
                Path(warc_dir).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                fail(f"cannot create the WARC directory {warc_dir}: {exc.strerror or exc}")
        try:
            if fmt == "warc":
                export_warc(store, out, warc_dir, warc_max_size)
            elif out:
                with written_whole(out, "w", encoding="utf-8", newline="") as stream:
                    write_records(stream, fmt, store.export())
            else:
                write_records(sys.stdout, fmt, store.export())
        except BrokenPipeError:  # `courtly export | head`: the reader has what it wanted
            if out:
                fail(f"cannot write {out}: broken pipe")
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
            sys.exit(141)  # quietly, as a tool the pipe's signal stopped (128 + SIGPIPE)
        except OSError as exc:
            fail(f"cannot write {out or warc_dir or 'standard output'}: {exc.strerror or exc}")


def export_warc(store: Store, out: str | None, directory: str | None, max_size: int) -> None:
    """The stored pages and revisits as WARC records (one file, or rolling files with their
    index); damaged ones are left out and named."""
    from courtly.warc import Archive, WarcFiles, write_all

    pages, revisits = store.stored_pages(), store.stored_revisits()
    if directory:
        files = WarcFiles(directory, max_size)
        try:
            written, damaged = write_all(files, pages, revisits)
        finally:
            files.close()
    elif out:
        with written_whole(out, "wb") as stream:
            written, damaged = write_all(Archive(stream, Path(out).name), pages, revisits)
    else:
        written, damaged = write_all(Archive(sys.stdout.buffer, "-"), pages, revisits)
        sys.stdout.buffer.flush()
    if damaged:
        fail(f"damaged stored pages left out of the WARC file: {len(damaged)} ({written} "
             f"written), the first: {damaged[0]}", 1)


@contextmanager
def written_whole(path: str, mode: str, **options: Any) -> Iterator[Any]:
    """The file --out names, written whole or not at all: into a file beside it, renamed over it
    once complete (an export that fails leaves an older file as it was); a device or a pipe
    (/dev/stdout) is written as it is. By hand: os.replace is the whole of it."""
    target = Path(path)
    if target.exists() and not target.is_file():
        with open(path, mode, **options) as stream:
            yield stream
        return
    part = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        with open(part, mode, **options) as stream:
            yield stream
        if target.exists():  # its permissions kept
            part.chmod(target.stat().st_mode & 0o7777)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)


def is_database_file(path: str, db: str) -> bool:
    """Whether the path is the SQLite crawl database's file, -wal or -shm."""
    files = {Path(db + suffix).resolve() for suffix in ("", "-wal", "-shm")}
    return "://" not in db and Path(path).resolve() in files


def write_records(stream: TextIO, fmt: str, records: Iterable[dict[str, Any]]) -> None:
    """The export as JSON lines or CSV, flushed."""
    from courtly.store.sql import EXPORT_COLUMNS

    if fmt == "csv":
        writer = csv.DictWriter(stream, fieldnames=list(EXPORT_COLUMNS))
        writer.writeheader()
        writer.writerows(records)
    else:
        for record in records:
            stream.write(json.dumps(record, ensure_ascii=False) + "\n")
    stream.flush()


@main.command()
@db_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def stats(db: str | None, as_json: bool) -> None:
    """Counts by link state, exit code and origin."""
    from courtly.progress import print_stats

    with crawl_db(build_config(None, db=db).db, must_exist=True) as store:
        data = store.stats()
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        print_stats(data)
        if "fleet" in data:
            from courtly.distributed import print_fleet

            print_fleet(data["fleet"])


@main.command()
@db_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (another than 127.0.0.1 is reachable by others).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port (0: any free one).")
def serve(db: str | None, host: str, port: int) -> None:
    """Serve a read-only view of the crawl in --db: a page, JSON, and /metrics."""
    from courtly.view.server import ViewError, serve_database

    # an empty host would listen on every address (aiohttp): the page has no login
    address = host.strip().removeprefix("[").removesuffix("]")
    if not address:
        fail("--host: give an address to listen on (0.0.0.0 for every one)")
    db = build_config(None, db=db).db
    check_readable(db)
    try:
        serve_database(db, address, port)
    except ViewError as exc:
        fail(str(exc))
    except StoreError as exc:
        fail(str(exc), 1)


@main.command()
@db_option
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="The HTML file to write.")
def report(db: str | None, out: str) -> None:
    """Write one self-contained HTML file with the charts of the crawl in --db."""
    from courtly.store.reader import open_reader
    from courtly.view.report import write_report

    db = build_config(None, db=db).db
    if is_database_file(out, db):
        fail(f"--out {out} is the crawl database (or its journal): write the report elsewhere")
    check_readable(db)
    try:
        reader = open_reader(db)
        try:
            actions = write_report(reader, Path(out))
        finally:
            reader.close()
    except StoreError as exc:
        fail(str(exc), 1)
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    click.echo(f"{out}: the report of {actions} crawl actions", err=True)


def check_readable(db: str) -> None:
    """Refuse (one line) a database that is not there or not courtly's, without opening it
    for writing."""
    if not db_exists(db):
        fail(f"no crawl database at {shown(db)}")
    tables = sqlite_tables(db)
    if tables is not None and "schema_version" not in tables:
        fail(f"{db} is not a courtly crawl database")


@main.command()
@click.option("--port", type=int, default=0, help="First port of the demo site (0: any free).")
@click.option("--db", default="courtly-demo.db", help="Crawl database for the demo.")
def demo(port: int, db: str) -> None:
    """Serve a small bundled multi-origin site on 127.0.0.1, crawl it, show the stats."""
    from courtly.demo import DemoError, run_demo

    try:
        status = run_demo(port, build_config(None, db=db).db)
    except DemoError as exc:
        fail(str(exc))
    sys.exit(status)


@main.command()
@click.argument("url")
@click.option("--config", "config_path", type=click.Path(), help="TOML config file.")
@db_option
def check(url: str, config_path: str | None, db: str | None) -> None:
    """Explain what courtly would do with URL, and why."""
    from courtly.explain import explain_url

    config = build_config(config_path, db=db)
    if db_exists(config.db):
        with crawl_db(config.db, must_exist=True) as store:
            lines = explain_url(url, config, store)
    else:
        lines = explain_url(url, config, None)
    for label, value in lines:
        click.echo(f"{label:>11}: {value}")
