"""`courtly check URL`: the normalized form, scope, the deciding rule, and the stored state."""

from __future__ import annotations

from courtly.config import CrawlConfig
from courtly.model import ExitCode
from courtly.outcome import refusal
from courtly.policy import Policy, url_shape
from courtly.robots import rules_for_status
from courtly.store import Store
from courtly.urls import normalize, origin_of


def explain_url(url: str, config: CrawlConfig, store: Store | None) -> list[tuple[str, str]]:
    """(label, value) lines answering 'why was this page (not) crawled?'."""
    normalized = normalize(url, None, config.normalize)
    if normalized is None:
        return [("url", url), ("verdict", "refused: not a valid http(s) URL")]
    lines = [("url", url), ("normalized", normalized)]
    origins = store.configured_origins() if store is not None else []
    seeds = [s for s in (normalize(s, None, config.normalize) for s in config.seeds) if s]
    seeds += [o + "/" for o in origins]
    record = store.candidate(normalized) if store is not None else None
    origin = origin_of(normalized)
    policy = Policy(config.policies, config.traps, seeds)
    in_scope = policy.in_scope(normalized)
    scope = config.policies.scope
    lines.append(("scope", f"{'in' if in_scope else 'NOT in'} scope ({scope}; "
                           f"{len(seeds)} seeds/origins known)"))
    depth = int(record["depth"]) if record else 0
    verdict = policy.check(normalized, depth)
    lines.append(("policy", f"{'allowed' if verdict.allowed else 'refused'}: {verdict.rule}"))
    robots_line = "not fetched yet (checked right before the fetch)"
    rules, unreachable = None, False
    if not config.robots.obey:
        robots_line = "ignored (obey_robots = false)"
    elif store is not None:
        state = store.load_origin(origin)
        if state.robots_status is not None:
            rules = rules_for_status(
                state.robots_status, state.robots_body or b"", config.user_agent,
                config.robots.max_size,
            )
            allowed, rule = rules.explain(normalized)
            robots_line = f"{'allowed' if allowed else 'disallowed'}: {rule}"
            if state.robots_error:
                robots_line += f" (stored copy; the last fetch failed: {state.robots_error})"
        elif state.robots_error:
            unreachable = True
            robots_line = (f"unreachable at the last try ({state.robots_error}): the origin's "
                           "URLs wait until it answers")
    lines.append(("robots.txt", robots_line))
    traps = config.traps
    budget, recombinations = traps.max_actions_per_shape, traps.max_query_recombinations
    spent = record is not None and record["exit_code"] == ExitCode.BLOCKED_BY_TRAP_BUDGET
    recombined = spent and "max_query_recombinations" in str(record and record["detail"])
    lines.append(("trap budget", (
        f"shape {url_shape(normalized)}: at most {budget} crawl actions a run on this origin's "
        f"URLs of this shape found more than {config.traps.shape_depth_slack} links deeper than "
        "the shallowest (traps.max_actions_per_shape)"
        + (", spent when this URL's turn came" * (spent and not recombined))
    ) if budget else "off (traps.max_actions_per_shape = 0)"))
    lines.append(("recombined", (
        f"at most {recombinations} URLs a run of this path whose query (two parameters or more) "
        "brings no value new to it (traps.max_query_recombinations)"
        + (", spent when this URL's turn came" * recombined)
    ) if recombinations else "off (traps.max_query_recombinations = 0)"))
    refused = refusal(normalized, depth, policy, rules)  # as the crawl decides it
    if not in_scope:
        final = "not crawled: out of scope"
    elif refused is not None:
        final = f"not crawled: {refused.exit_code}"
    elif unreachable:
        final = "not crawled yet: robots.txt unreachable"
    elif spent:
        final = f"not crawled in its last run: {ExitCode.BLOCKED_BY_TRAP_BUDGET}"
    else:
        final = "crawlable"
    lines.append(("verdict", final))
    if record is None:
        lines.append(("database", "unknown URL" if store is not None else "no database"))
    else:
        lines.append(("database", f"{record['state']}, last exit code {record['exit_code']}, "
                                  f"HTTP {record['http_status']}, depth {record['depth']}, "
                                  f"next due {record['next_due']}"))
        if record["detail"]:
            lines.append(("detail", str(record["detail"])))
    return lines
