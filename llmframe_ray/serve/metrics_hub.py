"""The app's Prometheus metrics added up over every replica of every deployment.

Each replica counts in its own process (telemetry.REGISTRY). `start_pushing()`, called in each
deployment's constructor, sends that registry's state to the app's hub every
`LLMFRAME_METRICS_PUSH_INTERVAL_S` seconds (the interval comes back with each answer); the
Ingress's `GET /metrics` sends its own state with the scrape and gets back the sum of all of
them. So one scrape, whichever Ingress replica answers it, counts the requests of every replica,
the provider calls of the Generator and the batches of the Retriever, QueryEncoder and Reranker,
each at most one interval old.

The hub (`MetricsHub`) is part of the Sessions deployment, the app's one replica of shared
state (conversations and token counts too): a process of its own cost about 230 MB of memory.

A replica that stops pushing (it died, or was scaled down) keeps its counters and histograms in
the sum, so totals never go back; its gauges (requests in flight, queue lengths, breakers) are
dropped after three intervals of silence. The state is the pushed state: if the hub's replica
restarts, each replica's totals come back with its next push.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from ray import serve

from llmframe_ray.telemetry import REGISTRY, Snapshot, describe, snapshot

logger = logging.getLogger("ray.serve")

HUB = "Sessions"  # the deployment that holds the hub (serve/sessions.py)
STALE_INTERVALS = 3
FIRST_PUSH_S = 1.0
RETRY_S = 5.0
SCRAPE_TIMEOUT_S = 5.0


@dataclass
class Source:
    deployment: str
    seen: float
    state: Snapshot


class MetricsHub:
    """The sum of the replicas' pushed states (one instance per app: in its Sessions replica)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.sources: dict[str, Source] = {}

    def push(self, replica: str, deployment: str, state: Snapshot) -> float:
        """Keep a replica's state; the answer is how long it waits before the next push."""
        self.sources[replica] = Source(deployment, time.monotonic(), state)
        return self.interval_s

    def exposition(self, replica: str, deployment: str, state: Snapshot) -> bytes:
        """The scraping replica's state kept, then every replica's summed, as Prometheus text."""
        self.push(replica, deployment, state)
        return merged_text(self.sources, time.monotonic(), self.interval_s)


def merged_text(sources: dict[str, Source], now: float, interval_s: float) -> bytes:
    """Prometheus text (0.0.4) of the sources' sum, with `llmframe_metrics_replicas{deployment}`
    (the replicas whose state is in it); a source silent for STALE_INTERVALS intervals adds its
    counters and histograms only."""
    live_after = now - STALE_INTERVALS * max(interval_s, FIRST_PUSH_S)
    states, replicas = [], {}
    for source in sources.values():
        live = source.seen >= live_after
        states.append(source.state if live else [f for f in source.state if f[1] != "gauge"])
        if live:
            replicas[source.deployment] = replicas.get(source.deployment, 0) + 1
    states.append([("llmframe_metrics_replicas", "gauge", "Replicas whose metrics this scrape adds up, by deployment",
                    [("llmframe_metrics_replicas", (("deployment", d),), float(n)) for d, n in sorted(replicas.items())])])
    registry = CollectorRegistry(auto_describe=False)
    registry.register(describe(states))
    return generate_latest(registry)


_started: list[str] = []


def start_pushing() -> None:
    """In a Serve replica of the app: push this process's metrics to the Metrics deployment
    until the replica stops (once per process). Elsewhere: nothing."""
    if _started:
        return
    try:
        context = serve.get_replica_context()
        loop = asyncio.get_running_loop()
    except Exception:  # noqa: BLE001 - not a replica (a test, the in-process app): nothing to push to
        return
    replica, deployment = context.replica_id.unique_id, context.deployment
    _started.append(replica)
    _tasks.append(loop.create_task(_push_forever(context.app_name, replica, deployment)))


_tasks: list[asyncio.Task] = []


async def _push_forever(app: str, replica: str, deployment: str) -> None:
    wait, warned, hub = FIRST_PUSH_S, False, None
    while True:
        await asyncio.sleep(wait)
        try:
            hub = hub or serve.get_deployment_handle(HUB, app)
            wait = float(await hub.push.remote(replica, deployment, snapshot()))
            warned = False
        except Exception as exc:  # noqa: BLE001 - the hub restarting, or not in this app: try again later
            hub = None
            if not warned:
                logger.warning("metrics of %s not pushed to the %s deployment: %s", deployment, HUB, exc)
                warned = True
            wait = RETRY_S


async def scrape(hub: object, deployment: str) -> bytes:
    """The app-wide metrics text, asked of the hub by a scraping Ingress replica with its own
    state. Where the hub does not answer (its replica restarting), this replica's own metrics,
    under a comment that says so: a scrape still gets numbers, never an error."""
    try:
        replica = serve.get_replica_context().replica_id.unique_id
        send = hub.exposition.remote(replica, deployment, snapshot())  # type: ignore[attr-defined]
        return await asyncio.wait_for(send, SCRAPE_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - answer with what this replica has
        logger.warning("the app-wide metrics are unavailable (%s: %s); answering this replica's own", type(exc).__name__, exc)
        note = f"# the app-wide sum is unavailable ({type(exc).__name__}); these are one {deployment} replica's metrics\n"
        return note.encode() + generate_latest(REGISTRY)
