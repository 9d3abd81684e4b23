"""The crawl configuration: a TOML file, overridden by CLI flags, validated with clear errors."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from courtly.patterns import compile_pattern
from courtly.proxy import parse_proxy


class ConfigError(Exception):
    """A user's configuration mistake; the message is one line naming the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Politeness(_Section):
    """Delays, backoff and patience (docs/politeness.md)."""

    min_delay: float = Field(1.0, ge=0)
    max_crawl_delay: float = Field(30.0, ge=0)
    crawl_delay_above_cap: Literal["clamp", "skip"] = "clamp"
    adaptive_factor: float = Field(0.0, ge=0)  # 0 turns the adaptive delay off
    retry_after_cap: float = Field(600.0, ge=0)
    backoff_base: float = Field(1.0, ge=0)
    backoff_max: float = Field(300.0, ge=0)
    backoff_forgive_after: float = Field(60.0, ge=0)
    patience: int = Field(5, ge=1)
    #: what shares one request at a time and one delay: each origin, each host (http and
    #: https), each registered domain (public-suffix aware) or each IP address
    politeness_key: Literal["origin", "host", "domain", "ip"] = "origin"
    max_retries: int = Field(2, ge=0)


#: RFC 9309 2.5: a robots.txt parse limit, if any, must be at least 500 KiB
ROBOTS_MIN_PARSE_LIMIT = 500 * 1024


class Robots(_Section):
    """robots.txt handling (RFC 9309)."""

    obey: bool = True
    expiry: float = Field(1800.0, gt=0)
    max_size: int = Field(512 * 1024, ge=ROBOTS_MIN_PARSE_LIMIT)
    max_redirects: int = Field(5, ge=0)
    stale_cache_limit: float = Field(86400.0, ge=0)


#: limits.max_connections = 0: descriptors left to the rest of the process (stdio, the event loop,
#: the database and its journal files, the page worker's socket and pipes, the resolver's
#: threads, logs), or an eighth of RLIMIT_NOFILE if more (pool.connection_limit)
FD_RESERVE = 32
#: limits.max_connections = 0: the bound RLIMIT_NOFILE gives, at most (idle connections also hold
#: memory)
MAX_AUTO_CONNECTIONS = 4096


class Limits(_Section):
    """Per-request limits (docs/reliability.md)."""

    connect_timeout: float = Field(10.0, gt=0)
    first_byte_timeout: float = Field(20.0, gt=0)
    read_timeout: float = Field(20.0, gt=0)
    total_timeout: float = Field(60.0, gt=0)
    #: bytes a second a response must average from its first byte, checked every min_rate_window
    #: seconds (a server that drips its headers or body is cut then, not at total_timeout); 0: off
    min_rate: int = Field(1024, ge=0)
    min_rate_window: float = Field(10.0, gt=0)
    max_body_size: int = Field(10 * 1024 * 1024, gt=0)
    #: bytes a body may have once decoded (Content-Encoding; a gzipped sitemap's gzip too), and
    #: an XML, RSS or Atom body at all (a sitemap's, sitemaps.org's 50 MB)
    max_decompressed_size: int = Field(50 * 1024 * 1024, gt=0)
    max_header_size: int = Field(64 * 1024, gt=0)
    max_header_count: int = Field(100, gt=0)
    max_links_per_page: int = Field(5000, gt=0)
    max_sitemap_entries: int = Field(50_000, gt=0)  # <loc>s read from one sitemap (its protocol's)
    max_parse_size: int = Field(4 * 1024 * 1024, gt=0)  # HTML bytes parsed per page
    #: seconds the page worker may spend on one page before it is replaced (TOO_COMPLEX); a
    #: real page of max_parse_size takes about 0.1 s
    max_parse_seconds: float = Field(10.0, gt=0)
    max_redirect_chain: int = Field(10, ge=1)
    allow_private_addresses: bool = False
    #: open connections at most; 0: what RLIMIT_NOFILE leaves to them (pool.connection_limit)
    max_connections: int = Field(0, ge=0)
    keep_alive: float = Field(4.0, ge=0)  # seconds an idle connection is kept (servers: 5-75)
    #: how long a request waits for courtly's own machine (descriptors, memory) before the
    #: crawl stops
    local_error_wait: float = Field(60.0, gt=0)
    dns_cache_size: int = Field(10_000, ge=1)  # host names whose addresses are kept
    dns_ttl: float = Field(300.0, ge=0)  # seconds an answer is kept
    #: host name → address, used instead of the system's resolver (like curl --resolve)
    dns_hosts: dict[str, str] = Field(default_factory=dict)


    @field_validator("dns_hosts")
    @classmethod
    def _addresses(cls, hosts: dict[str, str]) -> dict[str, str]:
        """Each value an IP address; names compared in lower case."""
        for name, address in hosts.items():
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise ValueError(f"{name}: {address!r} is not an IP address") from None
        return {name.lower().rstrip("."): address for name, address in hosts.items()}


class Normalize(_Section):
    """URL normalization rules (docs/urls.md); each is switchable."""

    sort_query: bool = True
    remove_params: list[str] = Field(
        default_factory=lambda: [
            "utm_*", "gclid", "fbclid", "msclkid", "mc_cid", "mc_eid", "_ga", "yclid",
            # click ids and campaign tags of ad, mail and analytics tools (Google, TikTok,
            # X, LinkedIn, Instagram, HubSpot, Marketo, Matomo, Yandex, Openstat)
            "gclsrc", "dclid", "gbraid", "wbraid", "srsltid", "_gl", "ttclid", "twclid",
            "li_fat_id", "igshid", "_hsenc", "_hsmi", "__hstc", "__hssc", "__hsfp",
            "hsctatracking", "mkt_tok", "mtm_*", "pk_campaign", "pk_kwd", "pk_source", "pk_medium",
            "pk_content", "ysclid", "_openstat",
        ]
    )
    #: session parameters (query names, globs) removed from the query and, as ";name=value", from
    #: the path: a site that links itself with a fresh session id is then one URL, not thousands
    session_params: list[str] = Field(
        default_factory=lambda: [
            "sid", "sessionid", "jsessionid", "phpsessid", "aspsessionid*", "cfid", "cftoken",
        ]
    )
    drop_fragment: bool = True
    collapse_slashes: bool = False
    drop_index: bool = False
    drop_trailing_slash: bool = False


class QueryParameters(_Section):
    """One url_query_parameters entry: under path_prefix, the allowed parameter-name sets."""

    path_prefix: str = Field("/", pattern=r"^/")
    allow: list[list[str]] = Field(default_factory=list)


class Policies(_Section):
    """Which URLs are refused (docs/urls.md, "Scope and policies")."""

    scope: Literal["origin", "host", "subdomains", "domain"] = "origin"
    do_not_crawl: list[str] = Field(default_factory=list)
    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    url_query_parameters: list[QueryParameters] = Field(default_factory=list)

    @field_validator("do_not_crawl", "allow", "deny")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        """Reject empty patterns and invalid regexes at load time, naming the pattern."""
        for pattern in patterns:
            compile_pattern(pattern)
        return patterns


class Traps(_Section):
    """Trap guards; 0 disables a guard."""

    max_url_length: int = Field(2048, ge=0)
    max_path_depth: int = Field(32, ge=0)
    max_segment_repeats: int = Field(3, ge=0)
    max_query_params: int = Field(16, ge=0)
    max_depth: int = Field(0, ge=0)
    max_pages_per_origin: int = Field(0, ge=0)
    #: crawl actions an origin may spend in one run on URLs of one shape (courtly.policy.url_shape:
    #: digit runs, opaque tokens and query values abstracted) found more than shape_depth_slack
    #: links deeper than the shallowest of them: a calendar or an endless counter costs about this
    #: many
    max_actions_per_shape: int = Field(50, ge=0)
    shape_depth_slack: int = Field(2, ge=0)
    #: URLs of one path an origin may spend in one run whose query (two parameters or more)
    #: brings no value new to the path: a faceted search's filters and orders recombined
    max_query_recombinations: int = Field(100, ge=0)


class Recrawl(_Section):
    """Recrawl intervals in seconds by exit code category (docs/recrawl.md)."""

    ok: float = Field(7 * 86400.0, ge=0)
    error: float = Field(86400.0, ge=0)
    blocked: float = Field(1800.0, ge=0)
    redirect: float = Field(7 * 86400.0, ge=0)
    min_interval: float = Field(3600.0, ge=0)
    max_interval: float = Field(90 * 86400.0, ge=0)
    adaptive: bool = True
    changed_factor: float = Field(0.5, gt=0, le=1)  # interval × this when the content changed
    unchanged_factor: float = Field(1.5, ge=1)  # interval × this when it did not
    error_backoff: float = Field(2.0, ge=1)  # error interval × this after each repeated error


class FleetConfig(_Section):
    """Distributed mode: workers sharing a PostgreSQL crawl database (docs/distributed.md)."""

    #: a worker that stops renewing its leases loses them after this long (a second at least:
    #: a shorter lease expired between renewals, and its worker fetched pages it could not keep)
    lease_seconds: float = Field(30.0, ge=1)
    #: partitions of the registered domains; fixed when a crawl database first gets them
    partitions: int = Field(64, ge=1, le=65536)
    #: how long an unreachable database is retried (with backoff) before the worker stops
    reconnect_seconds: float = Field(60.0, ge=0)
    #: once a worker's database thread is busy, how long each of its round trips waits for
    #: more of the crawl's writes and reads to go with it (docs/distributed.md, batches)
    batch_window: float = Field(0.005, ge=0, le=1)
    #: a worker finds the other workers of its host name that have died (by process id) and frees
    #: their leases at once; turn off when workers of one host name run in separate process id
    #: namespaces (containers sharing the host's name), where another's id means nothing
    same_host_pid_check: bool = True


class Dedup(_Section):
    """Duplicate content detection."""

    exact: bool = True
    near: bool = True
    min_similarity: float = Field(0.8, gt=0, le=1)  # estimated Jaccard of word shingles
    #: a page whose main content has fewer words gets no signature: too short to judge (tiny
    #: pages look alike by chance; a book's index page is its chrome and a few links)
    min_words: int = Field(50, ge=1)
    #: an exact duplicate's links are the original's (or a session-id trap's): not followed
    follow_links_of_exact_duplicates: bool = False
    follow_links_of_near_duplicates: bool = True
    #: a near-duplicate whose path is deeper than its original's (a site answering every
    #: unknown path with one page, whose relative links then nest for ever): links not followed
    follow_links_of_deeper_near_duplicates: bool = False


#: bytes after which a new WARC file begins (Heritrix's default)
WARC_MAX_SIZE = 1_000_000_000


class Warc(_Section):
    """WARC files written during the crawl (docs/warc.md)."""

    dir: str | None = None  # None: no WARC files (`courtly crawl --warc DIR` sets it)
    max_size: int = Field(WARC_MAX_SIZE, gt=0)
    prefix: str = Field("courtly", pattern=r"^[A-Za-z0-9._-]+$")


class CrawlConfig(_Section):
    """The whole crawl configuration."""

    seeds: list[str] = Field(default_factory=list)
    seeds_file: str | None = None
    db: str = "courtly.db"
    max_actions: int = Field(0, ge=0)  # 0: no budget
    min_delay: float | None = Field(None, ge=0)  # shorthand for politeness.min_delay
    concurrency: int = Field(32, ge=1)
    user_agent: str = "courtly/0.1 (+https://example.invalid/courtly)"
    strategy: str = "breadth-first"
    strategy_args: dict[str, Any] = Field(default_factory=dict)  # passed to the strategy
    obey_robots: bool | None = None  # shorthand for robots.obey
    store_content: bool = True
    commit_interval: float = Field(2.0, ge=0)  # group commit window (SQLite); 0: every action
    force_recrawl: bool = False
    parse_workers: int = Field(1, ge=0, le=1)  # 1: HTML analysed in a worker process; 0: inline
    progress: Literal["auto", "live", "log", "off"] = "auto"
    #: "[HOST:]PORT": serve the live view while crawling (courtly.view; HOST 127.0.0.1)
    serve: str | None = None
    politeness: Politeness = Field(default_factory=Politeness)
    robots: Robots = Field(default_factory=Robots)
    limits: Limits = Field(default_factory=Limits)
    normalize: Normalize = Field(default_factory=Normalize)
    policies: Policies = Field(default_factory=Policies)
    traps: Traps = Field(default_factory=Traps)
    recrawl: Recrawl = Field(default_factory=Recrawl)
    dedup: Dedup = Field(default_factory=Dedup)
    fleet: FleetConfig = Field(default_factory=FleetConfig)
    warc: Warc = Field(default_factory=Warc)
    #: an HTTP proxy for every request (else HTTP_PROXY, HTTPS_PROXY… are read: proxy.py)
    proxy: str | None = None
    #: a file of CA certificates that replaces the system's (else SSL_CERT_FILE, if set);
    #: loaded when the crawl starts
    ca_bundle: str | None = None

    @field_validator("proxy")
    @classmethod
    def _proxy_is_usable(cls, proxy: str | None) -> str | None:
        """Reject a proxy URL courtly cannot use (another scheme, no host, a bad port)."""
        if proxy:
            parse_proxy(proxy)
        return proxy


    @field_validator("serve")
    @classmethod
    def _serve_address(cls, serve: str | None) -> str | None:
        """[HOST:]PORT with a port from 0 (any free one) to 65535."""
        if serve is None:
            return None
        host, colon, port = serve.rpartition(":")
        # ASCII digits only: str.isdigit() accepts "²", which int() refuses
        if not (port.isascii() and port.isdigit()) or int(port) > 65535 or (
                colon and not host.strip("[]")):
            raise ValueError(f"{serve!r} is not [HOST:]PORT with a port from 0 to 65535")
        return serve

    @field_validator("warc")
    @classmethod
    def _warc_needs_the_bodies(cls, warc: Warc, info: ValidationInfo) -> Warc:
        """WARC records are written from what the crawl keeps: without bodies, none would be."""
        if warc.dir is not None and info.data.get("store_content") is False:
            raise ValueError("WARC files are written from the kept pages: they need "
                             "store_content = true")
        return warc

    @field_validator("db")
    @classmethod
    def _db_keeps_the_crawl(cls, db: str) -> str:
        """Reject an empty path, SQLite's in-memory database (nothing would be saved) and URLs of
        other databases."""
        if db in ("", ":memory:"):
            raise ValueError(f"{db!r} is not a crawl database: give a file path or a URL")
        if "://" in db and not db.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"{db.partition('://')[0]}:// is not supported: give a SQLite file "
                             "path or a postgresql:// URL")
        return db

    @field_validator("user_agent")
    @classmethod
    def _user_agent_is_one_header_line(cls, agent: str) -> str:
        """Reject control characters (CR, LF, …): the User-Agent header could not be sent."""
        if any(ord(c) < 32 or ord(c) == 127 for c in agent):
            raise ValueError("control characters (CR, LF, tab, …) are not allowed")
        return agent

    def model_post_init(self, __context: Any) -> None:
        """Fold the top-level shorthands into their sections."""
        if self.min_delay is not None:
            self.politeness.min_delay = self.min_delay
        if self.obey_robots is not None:
            self.robots.obey = self.obey_robots


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "value_error":  # our validators' messages, without "Value error, "
        msg = str(err["ctx"]["error"])
    return f"{key}: {msg}"


#: top-level keys that set a key of a section (the flags' names): a file may set one or the other
SHORTHANDS = {"min_delay": ("politeness", "min_delay"), "obey_robots": ("robots", "obey")}


def _one_of_each_shorthand(data: dict[str, Any], path: str) -> None:
    """Refuse a file that sets a shorthand and its section's key to different values (before,
    the shorthand won without a word)."""
    for short, (section, name) in SHORTHANDS.items():
        part = data.get(section)
        if short in data and isinstance(part, dict) and name in part \
                and part[name] != data[short]:
            given = [json.dumps(value, default=str) for value in (data[short], part[name])]
            raise ConfigError(f"{path}: {short} = {given[0]} and {section}.{name} = {given[1]} "
                              "both set it: keep one")


def load_config(path: str | None, overrides: dict[str, Any]) -> CrawlConfig:
    """Read the TOML file (if any), apply CLI overrides (None values ignored), validate."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
        _one_of_each_shorthand(data, path)
    for key, value in overrides.items():
        if value is None or value == () or value == []:
            continue
        if "." in key:  # a key of a section: "warc.dir"
            section, _, name = key.partition(".")
            part = data.setdefault(section, {})  # not a table: validation names the mistake
            if isinstance(part, dict):
                part[name] = value
        elif key == "seeds":
            listed = data.get("seeds", [])  # not a list: validation names the mistake
            data["seeds"] = listed + list(value) if isinstance(listed, list) else listed
        else:
            data[key] = value
    try:
        return CrawlConfig.model_validate(data)
    except ValidationError as exc:
        where = f"{path}: " if path else ""
        raise ConfigError(f"{where}{_first_error(exc)}") from None
