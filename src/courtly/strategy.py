"""The crawling strategy API (Frontera's) and the built-in strategies.

A strategy is a class with Frontera's event handlers — `read_seeds`, `page_crawled`,
`filter_extracted_links`, `links_extracted`, `request_error`, `finished`, `close` — and helpers —
`schedule`, `create_request`, `refresh_states` — plus two courtly additions: `origin_opened`
(the origin's robots.txt is known, with its Sitemap lines) and `domain_metadata`, a persistent
mapping of origin → dict. See docs/strategies.md.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import math
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TextIO

from courtly.errors import describe
from courtly.model import LinkState
from courtly.urls import origin_of

if TYPE_CHECKING:
    from courtly.model import OriginState

log = logging.getLogger("courtly.strategy")


@dataclass(slots=True)
class Request:
    """A URL the strategy reasons about (Frontera's Request).

    `state` is the URL's link state: set for the requests the crawler hands to event handlers,
    None for one made by `create_request` until `refresh_states` fills it.
    """

    url: str
    depth: int = 0
    score: float = 1.0
    meta: dict[str, Any] = field(default_factory=dict)
    state: LinkState | None = None


@dataclass(slots=True)
class Response:
    """A crawled page as the strategy sees it (Frontera's Response)."""

    request: Request
    status: int | None
    exit_code: str
    headers: dict[str, str]
    body: bytes
    title: str | None = None

    @property
    def url(self) -> str:
        """The request's URL (Frontera's Response.url)."""
        return self.request.url

    @property
    def meta(self) -> dict[str, Any]:
        """The request's meta (Frontera's Response.meta)."""
        return self.request.meta


@dataclass(slots=True)
class Scheduled:
    """A request the strategy scheduled, with its score."""

    request: Request
    score: float
    dont_queue: bool


class StrategyContext(Protocol):
    """What a strategy may read and persist through the crawler (Frontera's states_context)."""

    def states(self, urls: list[str]) -> dict[str, LinkState]:
        """Known link states by URL (unknown URLs are absent)."""
        ...

    def load_metadata(self, origin: str) -> dict[str, Any]:
        """The persisted domain metadata of an origin ({} if none)."""
        ...

    def save_metadata(self, origin: str, data: dict[str, Any]) -> None:
        """Persist an origin's domain metadata."""
        ...


class MemoryContext:
    """A context with no database (a strategy used on its own, e.g. in a unit test)."""

    def __init__(self) -> None:
        self.link_states: dict[str, LinkState] = {}
        self.metadata: dict[str, dict[str, Any]] = {}

    def states(self, urls: list[str]) -> dict[str, LinkState]:
        """Known link states by URL."""
        return {u: self.link_states[u] for u in urls if u in self.link_states}

    def load_metadata(self, origin: str) -> dict[str, Any]:
        """A copy of the saved metadata."""
        return json.loads(json.dumps(self.metadata.get(origin, {})))  # type: ignore[no-any-return]

    def save_metadata(self, origin: str, data: dict[str, Any]) -> None:
        """Keep a copy."""
        self.metadata[origin] = json.loads(json.dumps(data))


class StateStore(Protocol):
    """What a StoreContext reads and writes: a Store, or the crawl loop's view of one."""

    def states(self, urls: list[str]) -> dict[str, LinkState]: ...
    def load_origin(self, origin: str) -> OriginState: ...
    def save_origin(self, state: OriginState) -> None: ...


class StoreContext:
    """A context backed by the crawl database.

    `live_state(origin)` gives the crawler's in-memory OriginState of an origin it crawls, so that
    the domain metadata and the rest of the origin's state are one record, saved together.
    """

    def __init__(
        self, store: StateStore, live_state: Callable[[str], OriginState | None] | None = None
    ) -> None:
        self.store = store
        self.live_state = live_state or (lambda origin: None)

    def states(self, urls: list[str]) -> dict[str, LinkState]:
        """Known link states, from the candidates' unique URL index."""
        return self.store.states(urls)

    def _state(self, origin: str) -> OriginState:
        return self.live_state(origin) or self.store.load_origin(origin)

    def load_metadata(self, origin: str) -> dict[str, Any]:
        """The origin's metadata as persisted (or as the crawler holds it)."""
        return self._state(origin).metadata

    def save_metadata(self, origin: str, data: dict[str, Any]) -> None:
        """Write the metadata with the rest of the origin's state."""
        state = self._state(origin)
        state.metadata = data
        self.store.save_origin(state)


class SeedingContext(StoreContext):
    """The seeds workflow's context: the database is read, and the domain metadata the strategy
    saves is held (`saved`), to be written with the seeds once the strategy has closed without
    an error (Store.add_seeds)."""

    def __init__(self, store: StateStore) -> None:
        super().__init__(store)
        self.saved: dict[str, dict[str, Any]] = {}

    def load_metadata(self, origin: str) -> dict[str, Any]:
        """The metadata saved in this workflow, else as persisted."""
        if origin in self.saved:
            return json.loads(json.dumps(self.saved[origin]))  # type: ignore[no-any-return]
        return super().load_metadata(origin)

    def save_metadata(self, origin: str, data: dict[str, Any]) -> None:
        """Hold a copy (JSON, as the database keeps it)."""
        self.saved[origin] = json.loads(json.dumps(data))


# built once: json.dumps(…, sort_keys=True) builds an encoder a call
_snapshot = json.JSONEncoder(sort_keys=True).encode


class DomainMetadata(MutableMapping[str, dict[str, Any]]):
    """Per-origin metadata that persists across runs (Frontera's DomainMetadata).

    Keys are origins (`http://host:port`); values are JSON-serializable dicts. Reading an unknown
    origin gives an empty dict to fill in. Changes are saved after each crawl action (`flush`);
    iteration covers the origins read or written in this process, not the whole database.
    """

    SWEEP = 8  # entries not used since the last save that each save checks too

    def __init__(self, context: StrategyContext) -> None:
        self._context = context
        self._cache: dict[str, dict[str, Any]] = {}
        self._saved: dict[str, str] = {}
        self._used: set[str] = set()
        self._sweep: list[str] = []

    def __getitem__(self, origin: str) -> dict[str, Any]:
        data = self._cache.get(origin)
        if data is None:
            data = self._context.load_metadata(origin)
            self._cache[origin] = data
            self._saved[origin] = _snapshot(data)
        self._used.add(origin)
        return data

    def __setitem__(self, origin: str, value: dict[str, Any]) -> None:
        self[origin]  # load the saved snapshot first
        self._cache[origin] = value

    def __delitem__(self, origin: str) -> None:
        self[origin] = {}

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._cache))

    def __len__(self) -> int:
        return len(self._cache)

    def changed(self, everything: bool = False) -> dict[str, dict[str, Any]]:
        """The entries changed since they were loaded or saved, from now on counted as saved:
        the caller writes them (a value that is not JSON raises TypeError naming its origin).

        It compares the entries used through this mapping since the last call, and `SWEEP`
        others in turn (a dict kept elsewhere and changed later), or `everything`: a call costs
        what the strategy used, not what the crawl has seen."""
        if everything:
            origins = set(self._cache)
        else:
            origins = self._used
            if not self._sweep:
                self._sweep = list(self._cache)
            for _ in range(min(self.SWEEP, len(self._sweep))):
                origins.add(self._sweep.pop())
        self._used = set()
        out = {}
        for origin in origins:
            data = self._cache[origin]
            try:
                text = _snapshot(data)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"domain_metadata[{origin!r}] cannot be saved: {exc} "
                                "(JSON values only: dict, list, str, int, float, bool, None)"
                                ) from None
            if text != self._saved.get(origin):
                out[origin] = data
                self._saved[origin] = text
        return out

    def flush(self) -> int:
        """Save the entries that changed since they were loaded or saved; returns how many."""
        changed = self.changed(everything=True)
        for origin, data in changed.items():
            self._context.save_metadata(origin, data)
        return len(changed)


def breadth_first_score(depth: int) -> float:
    """The default score of a link at this depth: 1 / (1 + depth), seeds 1.0."""
    return 1.0 / (1 + depth)


class CrawlingStrategy:
    """Base class: override the event handlers; call `schedule()` to queue URLs with a score.

    The default behaviour is breadth-first: seeds score 1.0 and a link at depth d scores
    1 / (1 + d). Subclasses take `(context, args)` in `__init__` and must call `super().__init__`.
    """

    name: ClassVar[str] = "base"
    #: how many URLs an origin's todo list takes from the database at a time; a strategy whose
    #: scores must be obeyed page by page (depth-first, topical) uses a small batch
    todo_batch: ClassVar[int] = 64

    def __init__(
        self, context: StrategyContext | None = None, args: dict[str, Any] | None = None
    ) -> None:
        self.context: StrategyContext = context or MemoryContext()
        self.args: dict[str, Any] = dict(args or {})
        self.domain_metadata = DomainMetadata(self.context)
        self.scheduled: list[Scheduled] = []
        self._thread: int | None = None  # the crawl's thread, once bound

    def bind(self, context: StrategyContext) -> None:
        """Attach the crawler's context (the crawler calls this before the first event, on the
        thread that runs the crawl: the helpers refuse to be called from another)."""
        self.context = context
        self.domain_metadata = DomainMetadata(context)
        self._thread = threading.get_ident()

    # -- events (Frontera names) ---------------------------------------------------------
    def read_seeds(self, stream: TextIO) -> None:
        """Schedule one request per non-empty, non-comment line (the add-seeds workflow)."""
        for line in stream:
            url = line.strip()
            if url and not url.startswith("#"):
                self.schedule(self.create_request(url), score=1.0)

    def origin_opened(self, origin: str, sitemaps: list[str]) -> None:
        """An origin's robots.txt is known for this run (its Sitemap lines given); courtly's."""

    def page_crawled(self, response: Response) -> None:
        """A page was crawled successfully."""

    def filter_extracted_links(self, request: Request, links: list[Request]) -> list[Request]:
        """Keep only the links `links_extracted` needs (their states are read after this)."""
        return links

    def links_extracted(self, request: Request, links: list[Request]) -> None:
        """Schedule the extracted links that were never crawled (breadth-first by default)."""
        for link in links:
            if link.state in (None, LinkState.NOT_CRAWLED):
                self.schedule(link, score=breadth_first_score(link.depth))

    def request_error(self, request: Request, error: str) -> None:
        """A crawl action ended in an error (`error` is the exit code name)."""

    def finished(self) -> bool:
        """True once the crawl's goal is reached: the crawl stops."""
        return False

    def close(self) -> None:
        """The crawl is ending: the domain metadata is saved."""
        self.domain_metadata.flush()

    # -- helpers -------------------------------------------------------------------------
    def schedule(self, request: Request, score: float = 1.0, dont_queue: bool = False) -> None:
        """Queue a request with a score in [0, 1], a score outside it clamped to it
        (dont_queue: update the score only)."""
        self._on_crawl_thread("schedule")
        if not isinstance(request, Request):
            raise TypeError("schedule() takes a Request (an event's, or create_request(url)), "
                            f"not {type(request).__name__} {request!r:.80}")
        if isinstance(score, bool) or not isinstance(score, int | float) or math.isnan(score):
            raise TypeError(f"schedule(): the score must be a number in [0, 1], not {score!r:.80}")
        self.scheduled.append(Scheduled(request, max(0.0, min(1.0, score)), dont_queue))

    def create_request(
        self, url: str, depth: int = 0, meta: dict[str, Any] | None = None
    ) -> Request:
        """A new request; its state is None until `refresh_states`."""
        if not isinstance(url, str):
            raise TypeError(f"create_request(): the URL must be a str, not {url!r:.80}")
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise TypeError("create_request(url, depth=0, meta=None): the depth must be an int "
                            f">= 0, not {depth!r:.80}")
        return Request(url, depth, meta=dict(meta or {}))

    def refresh_states(self, requests: Iterable[Request] | Request) -> None:
        """Fill request.state from the crawl database (unknown URLs are NOT_CRAWLED), for a
        batch of requests or one (as Frontera's)."""
        self._on_crawl_thread("refresh_states")
        batch = [requests] if isinstance(requests, Request) else list(requests)
        wrong = next((r for r in batch if not isinstance(r, Request)), None)
        if wrong is not None:
            raise TypeError(f"refresh_states() takes Requests, not {type(wrong).__name__} "
                            f"{wrong!r:.80}")
        known = self.context.states([r.url for r in batch])
        for r in batch:
            state = known.get(r.url)
            r.state = LinkState.NOT_CRAWLED if state is None else state
            r.meta["known"] = state is not None

    def has_base_link_handlers(self) -> bool:
        """Whether extracted links go through this class's own handlers unchanged (the crawler
        then computes their result directly: breadth-first scores for the links never crawled)."""
        own = vars(self)
        return all(
            getattr(type(self), name) is getattr(CrawlingStrategy, name) and name not in own
            for name in ("filter_extracted_links", "refresh_states", "links_extracted",
                         "schedule", "take_scheduled")
        )

    def has_goal(self) -> bool:
        """Whether finished() is this strategy's own: the crawl then asks it after each crawl
        action is recorded and before the origin's next request (no request beside a record)."""
        return type(self).finished is not CrawlingStrategy.finished or "finished" in vars(self)

    def _on_crawl_thread(self, helper: str) -> None:
        """A helper called from a thread of the strategy's own would race with the crawl."""
        if self._thread is not None and threading.get_ident() != self._thread:
            raise RuntimeError(f"{helper}() called from another thread: call the strategy's "
                               "helpers from its event handlers, on the crawl's thread")

    def take_scheduled(self) -> list[Scheduled]:
        """Hand the scheduled requests to the crawler (and forget them)."""
        out, self.scheduled = self.scheduled, []
        return out


class BreadthFirst(CrawlingStrategy):
    """Shallow pages first (the default)."""

    name = "breadth-first"


class DepthFirst(CrawlingStrategy):
    """Deep pages first: a link scores higher the deeper it is; the todo list refills per page."""

    name = "depth-first"
    todo_batch = 1

    def links_extracted(self, request: Request, links: list[Request]) -> None:
        """Deeper links get higher scores."""
        for link in links:
            if link.state in (None, LinkState.NOT_CRAWLED):
                self.schedule(link, score=1.0 - 1.0 / (2 + link.depth))


class Discovery(CrawlingStrategy):
    """Find as many URLs as possible: sitemaps first, then links; at most N new URLs per origin.

    On each origin's first turn it schedules the sitemaps named in robots.txt, or /sitemap.xml
    when it names none (score 1.0); the crawler parses sitemaps and sitemap indexes (gzip too)
    and hands their <loc> entries to `links_extracted` like links. The cap
    (`max_pages_per_origin`, default 1000) counts the new URLs admitted per origin and persists
    in the domain metadata.
    """

    name = "discovery"
    SITEMAP_SCORE = 1.0

    def __init__(
        self, context: StrategyContext | None = None, args: dict[str, Any] | None = None
    ) -> None:
        super().__init__(context, args)
        cap = self.args.get("max_pages_per_origin", 1000)
        if type(cap) is not int or cap < 1:  # not bool, float or str
            raise ValueError(f"max_pages_per_origin must be a positive integer, not {cap!r}")
        self.cap = cap

    def origin_opened(self, origin: str, sitemaps: list[str]) -> None:
        """Schedule the robots.txt sitemaps, or the conventional /sitemap.xml when it names none."""
        for url in sitemaps or [origin + "/sitemap.xml"]:
            self.schedule(self.create_request(url, meta={"sitemap": True}), self.SITEMAP_SCORE)

    def read_seeds(self, stream: TextIO) -> None:
        """Seeds are admitted and counted against their origin's cap."""
        for line in stream:
            url = line.strip()
            if url and not url.startswith("#"):
                self._admit(self.create_request(url), 1.0)

    def links_extracted(self, request: Request, links: list[Request]) -> None:
        """New URLs (sitemap entries first) until the origin's cap is reached."""
        for link in links:
            if link.meta.get("known"):
                continue
            if link.meta.get("sitemap"):  # a sitemap named by a sitemap index
                self.schedule(link, self.SITEMAP_SCORE)
            else:
                score = 0.9 if link.meta.get("from_sitemap") else breadth_first_score(link.depth)
                self._admit(link, score)

    def _admit(self, link: Request, score: float) -> None:
        try:
            origin = origin_of(link.url)
        except ValueError:
            return
        meta = self.domain_metadata[origin]
        admitted = int(meta.get("discovered", 0))
        if admitted >= self.cap:
            meta["capped"] = True
            return
        meta["discovered"] = admitted + 1
        self.schedule(link, score)


class RecrawlOnly(CrawlingStrategy):
    """Crawl only what the database already knows (what is due, and known URLs never crawled).

    It schedules nothing: no seeds, no links, no redirect targets.
    """

    name = "recrawl-only"

    def read_seeds(self, stream: TextIO) -> None:
        """Seeds are ignored."""

    def links_extracted(self, request: Request, links: list[Request]) -> None:
        """Links are ignored."""


BUILTIN: dict[str, type[CrawlingStrategy]] = {
    cls.name: cls for cls in (BreadthFirst, DepthFirst, Discovery, RecrawlOnly)
}


class StrategyError(Exception):
    """The strategy named by the user cannot be loaded."""


def load_strategy(
    spec: str, context: StrategyContext | None = None, args: dict[str, Any] | None = None
) -> CrawlingStrategy:
    """A built-in name, or 'module:Class' naming a CrawlingStrategy subclass."""
    cls = BUILTIN.get(spec) or _import_strategy(spec)
    signature = inspect.signature(cls)
    try:
        signature.bind(context, args)
    except TypeError:
        raise StrategyError(
            f"cannot create strategy {spec!r}: {cls.__name__}.__init__ takes "
            f"({', '.join(signature.parameters)}); a strategy's takes (context=None, args=None) "
            "and calls super().__init__(context, args) (docs/strategies.md)") from None
    try:
        strategy = cls(context, args)
    except Exception as exc:
        raise StrategyError(f"cannot create strategy {spec!r}: {describe(exc)}") from None
    if not isinstance(vars(strategy).get("scheduled"), list):
        raise StrategyError(f"cannot create strategy {spec!r}: {cls.__name__}.__init__ does not "
                            "call super().__init__(context, args)")
    return strategy


def _import_strategy(spec: str) -> type[CrawlingStrategy]:
    module_name, _, class_name = spec.partition(":")
    if not class_name or not module_name:
        names = ", ".join(sorted(BUILTIN))
        raise StrategyError(f"unknown strategy {spec!r} (built-in: {names}; or module:Class)")
    if os.getcwd() not in sys.path and "" not in sys.path:  # the `courtly` script's path has
        sys.path.append(os.getcwd())  # its own directory, not the user's: theirs, last
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except Exception as exc:  # no such module or class, or the module fails (SyntaxError, …)
        why = describe(exc, where=False)
        raise StrategyError(f"cannot load strategy {spec!r}: {why}") from None
    if not (isinstance(cls, type) and issubclass(cls, CrawlingStrategy)):
        raise StrategyError(f"{spec!r} is not a courtly.strategy.CrawlingStrategy subclass")
    return cls
