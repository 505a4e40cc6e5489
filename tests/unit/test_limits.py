"""Per-key limits (rate, requests in flight), the admin role, and the cap on generated tokens."""

import asyncio
import json

import httpx
import pytest
from fastapi.testclient import TestClient

from llmframe_ray.api.auth import ApiKeys
from llmframe_ray.api.http import create_app
from llmframe_ray.api.limits import KeyLimiter, LimitExceeded, LimitRequests
from llmframe_ray.api.local import LocalStages
from llmframe_ray.api.params import KeyLimits
from llmframe_ray.api.service import RagService
from llmframe_ray.config import load_settings
from llmframe_ray.generate.base import Completion, Usage
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import build_index
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.types import Document

MAIN, TENANT, OTHER = "main-key-0001", "tenant-key-0002", "tenant-key-0003"
DOCS = [
    Document("tides", title="Tides", text="Ocean tides are driven mainly by the gravitational pull of the Moon."),
    Document("bread", title="Bread", text="A sourdough starter is a culture of wild yeast and lactic acid bacteria."),
]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def refused(limiter, key):
    with pytest.raises(LimitExceeded) as caught:
        limiter.acquire(key)
    return str(caught.value), caught.value.retry_after_s


def test_the_rate_refills_at_its_rate_up_to_the_burst():
    clock = Clock()
    limiter = KeyLimiter(KeyLimits(rate_per_s=2, burst=3), clock=clock)
    for _ in range(3):
        limiter.acquire("a")
    assert refused(limiter, "a") == (
        "rate limit exceeded for this API key: 2 requests/s with bursts of 3 "
        "(LLMFRAME_RATE_LIMIT_PER_S, LLMFRAME_RATE_LIMIT_BURST)", 1)
    limiter.acquire("b")  # every key has its own bucket
    clock.now += 0.5  # one token back
    limiter.acquire("a")
    refused(limiter, "a")
    clock.now += 60  # never more than the burst
    for _ in range(3):
        limiter.acquire("a")
    refused(limiter, "a")


def test_a_slow_rate_says_how_long_to_wait():
    clock = Clock()
    limiter = KeyLimiter(KeyLimits(rate_per_s=0.1, burst=1), clock=clock)
    limiter.acquire("a")
    clock.now += 2.5
    assert refused(limiter, "a")[1] == 8  # 7.5 s until the next token, rounded up


def test_requests_in_flight_are_counted_until_released():
    limiter = KeyLimiter(KeyLimits(max_concurrent=2))
    limiter.acquire("a")
    limiter.acquire("a")
    assert refused(limiter, "a") == (
        "too many requests in flight for this API key: the limit is 2 at once (LLMFRAME_MAX_CONCURRENT_PER_KEY)", 1)
    limiter.acquire("b")
    limiter.release("a")
    limiter.acquire("a")


def test_replicas_split_the_limits_and_say_so():
    limiter = KeyLimiter(KeyLimits(rate_per_s=4, burst=5, max_concurrent=3), replicas=2, clock=Clock())
    assert limiter.local == KeyLimits(rate_per_s=2, burst=3, max_concurrent=2)
    for _ in range(2):
        limiter.acquire("a")
    message, _ = refused(limiter, "a")
    assert message.endswith("(LLMFRAME_MAX_CONCURRENT_PER_KEY; shared by 2 replicas)") and "limit is 3 at once" in message


@pytest.fixture(scope="module")
def index(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("limits") / "index"
    build_index(DOCS, root, load_settings().params().index, embedder)
    return root


class Recording:
    name, model = "recording", "rec-1"

    def __init__(self):
        self.max_tokens = []

    async def generate(self, messages, *, system=None, max_tokens=1024, temperature=0.0):
        self.max_tokens.append(max_tokens)
        return Completion("answer [1]", Usage(10, 3), self.model, self.name, "stop")


def app_for(index, embedder, provider=None, **overrides):
    settings = load_settings(api_secret_key=MAIN, api_keys=f"{TENANT},{OTHER}", **overrides)
    pipeline = Pipeline.open(index, embedder, settings.params().retrieval)
    stages = LocalStages(index, pipeline, IndexDirectory(index).current_version(), provider=provider)
    return create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))


def test_429_with_retry_after_over_http(index, embedder):
    search = {"query": "tides", "mode": "bm25"}
    with TestClient(app_for(index, embedder, rate_limit_per_s=0.5, rate_limit_burst=2)) as c:
        assert [c.post("/v1/search", headers={"X-API-Key": TENANT}, json=search).status_code for _ in range(2)] == [200, 200]
        over = c.post("/v1/search", headers={"X-API-Key": TENANT}, json=search)
        assert over.status_code == 429 and over.headers["retry-after"] == "2"
        assert over.json() == {"error": {
            "type": "rate_limited", "field": None,
            "message": "rate limit exceeded for this API key: 0.5 requests/s with bursts of 2 "
                       "(LLMFRAME_RATE_LIMIT_PER_S, LLMFRAME_RATE_LIMIT_BURST)",
        }}
        assert c.post("/v1/search", headers={"X-API-Key": OTHER}, json=search).status_code == 200
        # a wrong key is refused as unauthorized, and spends nobody's budget
        assert c.post("/v1/search", headers={"X-API-Key": "wrong"}, json=search).status_code == 401
        assert c.get("/healthz").status_code == 200  # probes are not limited


def test_requests_in_flight_over_the_limit_are_429_until_one_ends():
    started, finish = asyncio.Event(), asyncio.Event()

    async def slow_app(scope, receive, send):
        started.set()
        await finish.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    keys = ApiKeys.configured([MAIN])
    limiter = KeyLimiter(KeyLimits(max_concurrent=1))
    app = LimitRequests(slow_app, limiter, keys, reject=lambda exc: _reject(exc))

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            first = asyncio.create_task(client.post("/v1/search", headers={"X-API-Key": MAIN}))
            await started.wait()
            second = await client.post("/v1/search", headers={"X-API-Key": MAIN})
            finish.set()
            done = await first
            third = await client.post("/v1/search", headers={"X-API-Key": MAIN})
        return second, done, third

    second, done, third = asyncio.run(run())
    assert (second.status_code, second.headers["retry-after"]) == (429, "1")
    assert done.status_code == 200 and third.status_code == 200  # the slot came back when the first ended
    assert limiter._in_flight == {}


def _reject(exc):
    from llmframe_ray.api.http import _too_many

    return _too_many(exc)


def test_reload_and_stats_need_an_admin_key(index, embedder):
    with TestClient(app_for(index, embedder)) as c:
        for method, route in (("POST", "/v1/index/reload"), ("GET", "/v1/stats")):
            tenant = c.request(method, route, headers={"X-API-Key": TENANT})
            assert (tenant.status_code, tenant.json()) == (403, {"error": {
                "type": "forbidden", "field": None,
                "message": "this route needs an admin key (LLMFRAME_ADMIN_KEYS; by default API_SECRET_KEY)",
            }})
            assert c.request(method, route, headers={"X-API-Key": MAIN}).status_code == 200
            assert c.request(method, route, headers={"X-API-Key": "wrong"}).status_code == 401
        assert c.post("/v1/search", headers={"X-API-Key": TENANT}, json={"query": "tides"}).status_code == 200
    with TestClient(app_for(index, embedder, admin_keys=OTHER)) as c:  # set: exactly those keys
        assert c.get("/v1/stats", headers={"X-API-Key": OTHER}).status_code == 200
        assert c.get("/v1/stats", headers={"X-API-Key": MAIN}).status_code == 403


def test_chat_max_tokens_is_capped_by_the_setting(index, embedder):
    provider = Recording()
    with TestClient(app_for(index, embedder, provider=provider, llm_max_tokens=300)) as c:
        for asked in ({"max_tokens": 65536}, {"max_completion_tokens": 5000}, {"max_tokens": 50}, {}):
            body = {"messages": [{"role": "user", "content": "What drives the tides?"}], **asked}
            assert c.post("/v1/chat/completions", headers={"X-API-Key": MAIN}, json=body).status_code == 200
    assert provider.max_tokens == [300, 300, 50, 300]


def call_asgi(app, path, receive, headers=()):
    """Run one request through an ASGI app; returns (status, JSON body)."""
    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(k.encode(), v.encode()) for k, v in headers]}
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, (json.loads(body) if body.startswith(b"{") else body)


def test_a_body_that_trickles_in_is_408_and_an_unknown_key_never_gets_read():
    from llmframe_ray.api.http import BodyLimit

    reached = []

    async def app(scope, receive, send):
        reached.append(await receive())

    reads = []

    async def slow_receive():
        reads.append(1)
        if len(reads) == 1:
            return {"type": "http.request", "body": b'{"qu', "more_body": True}
        await asyncio.sleep(30)

    limit = BodyLimit(app, limit=1024, keys=ApiKeys.configured([MAIN]), read_timeout_s=0.05)
    assert call_asgi(limit, "/v1/search", slow_receive, [("x-api-key", MAIN)]) == (408, {"error": {
        "type": "request_timeout", "field": None,
        "message": "the request body did not arrive within 0.05 s (LLMFRAME_BODY_READ_TIMEOUT_S)"}})
    reads.clear()
    status, body = call_asgi(limit, "/v1/search", slow_receive, [("x-api-key", "wrong")])
    assert (status, body["error"]["type"], reads, reached) == (401, "unauthorized", [], [])


def test_a_request_without_an_answer_by_the_deadline_is_cancelled_and_504():
    from llmframe_ray.api.http import Deadline

    cancelled = []

    async def stuck(scope, receive, send):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def fast(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    assert call_asgi(Deadline(stuck, 0.05), "/v1/query", receive) == (504, {"error": {
        "type": "request_timeout", "field": None,
        "message": "no answer within 0.05 s (LLMFRAME_REQUEST_TIMEOUT_S); the request was cancelled"}})
    assert cancelled == [True]
    assert call_asgi(Deadline(fast, 0.05), "/v1/query", receive) == (200, b"ok")


def test_the_token_ledger_counts_per_key_per_utc_day():
    from llmframe_ray.generate.sessions import TokenLedger, seconds_to_utc_midnight

    clock = Clock()
    clock.now = 86400 * 20000 + 86000  # 400 s before midnight UTC
    ledger = TokenLedger(clock=clock)
    assert ledger.charge("a", 100) == 100 and ledger.charge("a", 20) == 120 and ledger.spent("b") == 0
    assert seconds_to_utc_midnight(clock.now) == 400
    clock.now += 400  # a new day
    assert ledger.spent("a") == 0 and ledger.charge("a", 5) == 5


def test_a_key_over_its_daily_token_budget_gets_429_until_midnight(index, embedder):
    provider = Recording()  # 10 input + 3 output tokens per answer
    with TestClient(app_for(index, embedder, provider=provider, daily_tokens_per_key=30)) as c:
        ask = {"question": "What drives the tides?"}
        assert [c.post("/v1/query", headers={"X-API-Key": TENANT}, json=ask).status_code for _ in range(3)] == [200] * 3
        over = c.post("/v1/query", headers={"X-API-Key": TENANT}, json=ask)
        assert over.status_code == 429 and 1 <= int(over.headers["retry-after"]) <= 86400
        assert over.json() == {"error": {
            "type": "budget_exceeded", "field": None,
            "message": "this API key has used its 30 generation tokens for today (LLMFRAME_DAILY_TOKENS_PER_KEY); "
                       "the count restarts at 00:00 UTC",
        }}
        stream = c.post("/v1/query", headers={"X-API-Key": TENANT}, json={**ask, "stream": True})
        chat = c.post("/v1/chat/completions", headers={"X-API-Key": TENANT}, json={"messages": [{"role": "user", "content": "tides?"}]})
        assert (stream.status_code, chat.status_code) == (429, 429)
        assert c.post("/v1/search", headers={"X-API-Key": TENANT}, json={"query": "tides"}).status_code == 200  # search is free
        assert c.post("/v1/query", headers={"X-API-Key": OTHER}, json=ask).status_code == 200  # another key's budget
    assert len(provider.max_tokens) == 4  # refused generations never reached the provider


def test_a_cancelled_request_cancels_its_work_and_frees_its_slot():
    from llmframe_ray.api.http import Deadline

    cancelled, started = [], asyncio.Event()

    async def slow(scope, receive, send):
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    limiter = KeyLimiter(KeyLimits(max_concurrent=1))
    app = LimitRequests(Deadline(slow, 60), limiter, ApiKeys.configured([MAIN]), reject=_reject)
    scope = {"type": "http", "method": "POST", "path": "/v1/query", "headers": [(b"x-api-key", MAIN.encode())]}

    async def run():
        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            pass

        request = asyncio.create_task(app(scope, receive, send))
        await started.wait()
        request.cancel()  # what Serve does when the client goes away
        with pytest.raises(asyncio.CancelledError):
            await request
        await asyncio.sleep(0.05)
        return list(cancelled)  # before the event loop closes (which cancels every task left)

    assert asyncio.run(run()) == [True]
    assert limiter._in_flight == {}


class Breaking(Recording):
    """Streams a few deltas, then breaks (a vendor cut)."""

    async def stream(self, messages, *, system=None, max_tokens=1024, temperature=0.0):
        from llmframe_ray.generate.base import ProviderUnavailableError

        for word in ("The", " tides", " rise"):
            yield word
        raise ProviderUnavailableError("recording", "connection reset")


def test_a_stream_that_ends_early_is_still_counted_against_the_budget(index, embedder):
    from llmframe_ray.api.auth import key_owner

    settings = load_settings(api_secret_key=MAIN, daily_tokens_per_key=10_000)
    pipeline = Pipeline.open(index, embedder, settings.params().retrieval)
    stages = LocalStages(index, pipeline, IndexDirectory(index).current_version(), provider=Breaking())
    with TestClient(create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))) as c:
        body = c.post("/v1/query", headers={"X-API-Key": MAIN}, json={"question": "What drives the tides?", "stream": True}).text
    assert "event: error" in body
    assert stages.ledger.spent(key_owner(MAIN)) > 3  # an estimate: the prompt and the three deltas


def test_a_failure_to_count_tokens_never_fails_the_answer(index, embedder, caplog):
    settings = load_settings(api_secret_key=MAIN, daily_tokens_per_key=100)
    pipeline = Pipeline.open(index, embedder, settings.params().retrieval)

    class CannotCount(LocalStages):
        async def charge_tokens(self, owner, tokens):
            raise RuntimeError("sessions replica is down")

    stages = CannotCount(index, pipeline, IndexDirectory(index).current_version(), provider=Recording())
    with TestClient(create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))) as c:
        response = c.post("/v1/query", headers={"X-API-Key": MAIN}, json={"question": "What drives the tides?"})
    assert response.status_code == 200 and "could not count 13 tokens" in caplog.text
