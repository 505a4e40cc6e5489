"""The HTTP API over in-process stages (no Ray): parity with the pipeline, auth, validation,
size limits, errors and Server-Sent Events."""

import json
import logging

import httpx_sse
import numpy as np
import pytest
from fastapi.testclient import TestClient

from llmframe_ray.config import load_settings
from llmframe_ray.errors import ConfigError
from llmframe_ray.ingest.build import build_index
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.api.auth import ApiKeys, presented_key
from llmframe_ray.api.http import create_app
from llmframe_ray.api.local import LocalStages
from llmframe_ray.api.service import RagService
from llmframe_ray.types import Document

KEY = "test-key-0123456789"
AUTH = {"X-API-Key": KEY}

DOCS = [
    Document("tides", title="Tides", text="Ocean tides are driven mainly by the gravitational pull of the Moon. Spring tides follow new and full moons."),
    Document("lunar", title="Lunar phases", text="The Moon's phases follow its orbit: new moon, crescent, full moon."),
    Document("currents", title="Ocean currents", text="Ocean currents move heat from the equator towards the poles."),
    Document("eclipse", title="Eclipses", text="A solar eclipse happens when the Moon passes between Earth and the Sun."),
    Document("bikes", title="Cycling", text="Commuting by bicycle improves cardiovascular health and cuts traffic."),
    Document("sourdough", title="Sourdough", text="A sourdough starter is a culture of wild yeast and lactic acid bacteria."),
    Document("part", title="Inventory", text="Part ZQ7731 sits on shelf 14 next to the loading dock."),
]


class LengthReranker:
    """A stand-in cross-encoder: shorter passages score higher (deterministic, not the retrieval order)."""

    def score(self, query, passages):
        return np.array([-float(len(p)) for p in passages], dtype=np.float32)


@pytest.fixture(scope="module")
def settings():
    return load_settings(
        chunk_size=64, chunk_overlap=8, fusion_depth=4, reranker_depth=5, max_top_k=20,
        api_secret_key=KEY, max_request_bytes=2048,
    )


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, settings, embedder):
    root = tmp_path_factory.mktemp("api") / "index"
    build_index(DOCS, root, settings.params().index, embedder)
    return root


@pytest.fixture(scope="module")
def pipeline(index_dir, settings, embedder):
    return Pipeline.open(index_dir, embedder, settings.params().retrieval, reranker=LengthReranker(), rerank=settings.params().rerank)


@pytest.fixture(scope="module")
def client(index_dir, settings, pipeline):
    from llmframe_ray.index.versions import IndexDirectory

    stages = LocalStages(index_dir, pipeline, IndexDirectory(index_dir).current_version(), LengthReranker())
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    with TestClient(app) as test_client:
        yield test_client


def as_dicts(hits):
    return [
        {"rank": h.rank, "doc_id": h.doc_id, "chunk_id": h.chunk_id, "title": h.title, "text": h.text,
         "score": h.score, "ranks": dict(h.ranks), "metadata": dict(h.metadata)}
        for h in hits
    ]


@pytest.mark.parametrize("mode", ["bm25", "dense", "hybrid"])
@pytest.mark.parametrize("level", ["document", "chunk"])
@pytest.mark.parametrize("rerank", [False, True])
def test_search_equals_pipeline(client, pipeline, mode, level, rerank):
    query = "what pulls the ocean tides"
    response = client.post("/v1/search", headers=AUTH, json={"query": query, "top_k": 4, "mode": mode, "level": level, "rerank": rerank})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["hits"] == as_dicts(pipeline.search(query, mode, 4, level, rerank=rerank))
    assert (body["mode"], body["level"], body["reranked"]) == (mode, level, rerank)
    assert set(body["timings_ms"]) == ({"retrieve", "rerank", "total"} if rerank else {"retrieve", "total"})


def test_reranked_hits_carry_the_cross_encoder_rank(client):
    body = client.post("/v1/search", headers=AUTH, json={"query": "moon", "mode": "hybrid", "rerank": True, "top_k": 3}).json()
    assert all("rerank" in hit["ranks"] for hit in body["hits"])


@pytest.mark.parametrize(
    "headers",
    [{}, {"X-API-Key": "wrong"}, {"Authorization": f"Basic {KEY}"}, {"Authorization": "Bearer"}, {"X-API-Key": KEY[:-1]}],
)
def test_401_without_a_valid_key(client, headers):
    response = client.post("/v1/search", headers=headers, json={"query": "moon"})
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"] == {
        "type": "unauthorized",
        "message": "a valid API key is required (X-API-Key header or Authorization: Bearer)",
        "field": None,
    }


def test_bearer_token_and_open_probes(client):
    assert client.post("/v1/search", headers={"Authorization": f"Bearer {KEY}"}, json={"query": "moon"}).status_code == 200
    assert client.get("/v1/index").status_code == 401
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready", "stages": {"pipeline": "ready"}}


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"query": ""}, "query", "query: must not be empty or whitespace only"),
        ({"query": "  \n "}, "query", "query: must not be empty or whitespace only"),
        ({}, "query", "query: Field required"),
        ({"query": "moon", "top_k": 0}, "top_k", "top_k: Input should be greater than or equal to 1"),
        ({"query": "moon", "top_k": 21}, "top_k", "top_k: must be at most 20 (LLMFRAME_MAX_TOP_K), got 21"),
        ({"query": "moon", "top_k": "many"}, "top_k", "top_k: Input should be a valid integer, unable to parse string as an integer"),
        ({"query": "moon", "mode": "fuzzy"}, "mode", "mode: Input should be 'bm25', 'dense' or 'hybrid'"),
        ({"query": "moon", "level": "page"}, "level", "level: Input should be 'document' or 'chunk'"),
        ({"query": "moon", "topk": 3}, "topk", "topk: Extra inputs are not permitted"),
        ({"query": "moon " * 300, "mode": "dense"}, "query", None),
    ],
)
def test_422_names_the_field(client, body, field, message):
    response = client.post("/v1/search", headers=AUTH, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["type"], error["field"]) == ("invalid_request", field)
    if message is not None:
        assert error["message"] == message
    else:
        assert error["message"].startswith("query: query is ") and "the embedding model accepts at most 256" in error["message"]


def test_422_for_a_body_that_is_not_json(client):
    response = client.post("/v1/search", headers={**AUTH, "Content-Type": "application/json"}, content=b"{not json")
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "body"
    assert response.json()["error"]["message"].startswith("body: the body is not valid JSON")


BAD_TEXT = [
    (b'"a \\ud800 b"', "an unpaired UTF-16 surrogate (U+D800) at character 2"),
    (b'"moon\\u0000"', "a control character (U+0000) at character 4"),
    (b'"x\\u001b[31m"', "a control character (U+001B) at character 1"),
]


@pytest.mark.parametrize("text,problem", BAD_TEXT)
@pytest.mark.parametrize(
    "route,template,field",
    [
        ("/v1/search", b'{"query": %s, "mode": "dense"}', "query"),
        ("/v1/query", b'{"question": %s}', "question"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": %s}]}', "messages.0.content"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": %s}]}]}', "messages.0.content"),
    ],
)
def test_text_the_models_cannot_take_is_422_at_the_edge(client, route, template, field, text, problem):
    # sent as raw JSON: its \\u escapes decode to the characters themselves
    response = client.post(route, headers={**AUTH, "Content-Type": "application/json"}, content=template % text)
    assert response.status_code == 422, response.text
    assert response.json() == {"error": {
        "type": "invalid_request", "field": field,
        "message": f"{field}: contains {problem}; send valid Unicode text",
    }}


def test_framework_errors_keep_the_error_shape(client):
    missing = client.get("/v1/nowhere", headers=AUTH)
    assert (missing.status_code, missing.json()) == (404, {"error": {
        "type": "not_found", "message": "no such route; GET /openapi.json lists them", "field": None}})
    wrong = client.get("/v1/search", headers=AUTH)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json() == {"error": {
        "type": "method_not_allowed", "message": "GET is not allowed on /v1/search; allowed: POST", "field": None}}
    for route in ("/v1/search", "/v1/query", "/v1/chat/completions"):
        undecodable = client.post(route, headers={**AUTH, "Content-Type": "application/json"}, content=b'{"query": "\xff"}')
        assert (undecodable.status_code, undecodable.json()) == (400, {"error": {
            "type": "invalid_request", "message": "the body could not be read: send UTF-8 JSON", "field": "body"}})


def test_422_for_a_query_longer_than_the_character_limit(client, settings):
    long = "moon " * (settings.max_query_chars // 5 + 1)
    response = client.post("/v1/search", headers=AUTH, json={"query": long, "mode": "bm25"})
    assert response.status_code == 422
    assert response.json()["error"]["message"] == (
        f"query: is {len(long.strip())} characters long; the limit is {settings.max_query_chars} (LLMFRAME_MAX_QUERY_CHARS)"
    )


def test_413_for_an_oversized_body(client):
    body = json.dumps({"query": "x" * 3000}).encode()
    response = client.post("/v1/search", headers={**AUTH, "Content-Type": "application/json"}, content=body)
    assert response.status_code == 413
    assert response.json()["error"] == {
        "type": "request_too_large",
        "message": f"request body is {len(body)} bytes; the limit is 2048 (LLMFRAME_MAX_REQUEST_BYTES)",
        "field": None,
    }


def test_413_for_an_oversized_chunked_body(client):
    def chunks():
        yield b'{"query": "'
        for _ in range(10):
            yield b"y" * 500
        yield b'"}'

    response = client.post("/v1/search", headers={**AUTH, "Content-Type": "application/json"}, content=chunks())
    assert response.status_code == 413
    assert response.json()["error"]["message"] == "request body is more than 2048 bytes; the limit is 2048 (LLMFRAME_MAX_REQUEST_BYTES)"


def test_rerank_without_a_reranker_is_422(index_dir, settings, pipeline):
    stages = LocalStages(index_dir, pipeline, "v", None)
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    with TestClient(app) as plain:
        response = plain.post("/v1/search", headers=AUTH, json={"query": "moon", "rerank": True})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "rerank"


def test_query_answers_with_citations(client, pipeline):
    response = client.post("/v1/query", headers=AUTH, json={"question": "What drives the ocean tides?", "top_k": 3})
    assert response.status_code == 200, response.text
    body = response.json()
    top = pipeline.search("What drives the ocean tides?", "hybrid", 3)
    assert body["answer"].startswith("Extractive answer (no language model configured)")
    assert "Ocean tides are driven mainly by the gravitational pull of the Moon. [1]" in body["answer"]
    assert body["citations"][0]["doc_id"] == "tides" == top[0].doc_id
    assert body["cited"] is True and body["provider"] == "extractive"
    assert set(body["timings_ms"]) == {"retrieve", "generate", "total"}


def test_query_stream_is_server_sent_events(client):
    question = "What drives the ocean tides?"
    whole = client.post("/v1/query", headers=AUTH, json={"question": question, "top_k": 3}).json()
    with httpx_sse.connect_sse(client, "POST", "/v1/query", headers=AUTH, json={"question": question, "top_k": 3, "stream": True}) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        events = [(e.event, json.loads(e.data)) for e in source.iter_sse()]
    names = [name for name, _ in events]
    assert names[-2:] == ["citations", "done"] and set(names[:-2]) == {"delta"} and len(names) > 3
    assert "".join(data["text"] for name, data in events if name == "delta") == whole["answer"]
    assert events[-2][1] == {"cited": True, "citations": whole["citations"]}
    assert events[-1][1]["version"] == whole["version"]


def test_stream_errors_before_the_first_byte_are_http_errors(client):
    response = client.post("/v1/query", headers=AUTH, json={"question": " ", "stream": True})
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "question"


def test_index_manifest(client, index_dir):
    from llmframe_ray.index.versions import IndexDirectory

    body = client.get("/v1/index", headers=AUTH).json()
    version = IndexDirectory(index_dir).current_version()
    assert body["version"] == version and body["shards"] == 1
    assert body["shard_manifests"][0]["manifest"]["counts"]["chunks"] >= len(DOCS)


def test_openapi_schema_lists_the_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/search", "/v1/query", "/v1/index", "/healthz", "/readyz"} <= set(paths)


def test_keys_from_settings(caplog):
    with pytest.raises(ConfigError, match="no API key is configured: set API_SECRET_KEY"):
        ApiKeys.configured((), disabled=False)
    keys = ApiKeys.configured(load_settings(api_secret_key="a-key", api_keys=" b-key, ,c-key").api_key_list)
    assert [keys.allows(k) for k in ("a-key", "b-key", "c-key", "d-key", "", None, "a-ke")] == [True, True, True, False, False, False, False]
    with caplog.at_level(logging.WARNING):
        open_keys = ApiKeys.configured((), disabled=True)
    assert open_keys.allows(None)
    assert "authentication is DISABLED" in caplog.text


def test_presented_key():
    assert presented_key({"x-api-key": " k1 "}) == "k1"
    assert presented_key({"authorization": "Bearer k2"}) == "k2"
    assert presented_key({"authorization": "bearer  k3 "}) == "k3"
    assert presented_key({"authorization": "Token k4"}) is None
    assert presented_key({}) is None


def test_settings_never_show_keys():
    settings = load_settings(api_secret_key="sekrit-1", api_keys="sekrit-2")
    assert "sekrit" not in repr(settings)


def test_errors_and_hits_survive_pickling():
    """Replicas hand errors and hits to each other through pickle."""
    import pickle

    from llmframe_ray.errors import EmptyQueryError, QueryTooLongError
    from llmframe_ray.api.failures import FieldError
    from llmframe_ray.types import Hit

    too_long = pickle.loads(pickle.dumps(QueryTooLongError(300, 256)))
    assert (type(too_long), str(too_long), too_long.n_tokens, too_long.limit) == (
        QueryTooLongError, "query is 300 tokens long; the embedding model accepts at most 256", 300, 256,
    )
    assert str(pickle.loads(pickle.dumps(EmptyQueryError()))) == "query is empty or whitespace only"
    field = pickle.loads(pickle.dumps(FieldError("top_k", "too big")))
    assert (field.field, str(field)) == ("top_k", "top_k: too big")
    hit = Hit("d", "d#0", "text", 1.5, 1, title="T", ranks={"bm25": 1, "dense": 2})
    assert pickle.loads(pickle.dumps(hit)) == hit


@pytest.mark.parametrize(
    ("error", "status", "kind", "message"),
    [
        (RuntimeError("secret detail"), 500, "server_error", "internal error; the server log has the details"),
        ("unavailable", 503, "stage_unavailable", "the retriever stage is unavailable: replica died"),
    ],
)
def test_stage_failures_are_json_errors(index_dir, settings, pipeline, error, status, kind, message):
    from llmframe_ray.api.failures import StageUnavailableError

    class Failing(LocalStages):
        async def retrieve(self, *args, **kwargs):
            if error == "unavailable":
                raise StageUnavailableError("the retriever stage is unavailable: replica died")
            raise error

    app = create_app(RagService(Failing(index_dir, pipeline, "v"), settings.params().service), ApiKeys.from_settings(settings))
    with TestClient(app, raise_server_exceptions=False) as failing:
        response = failing.post("/v1/search", headers=AUTH, json={"query": "moon"})
    assert response.status_code == status
    assert response.json()["error"] == {"type": kind, "message": message, "field": None}


@pytest.mark.parametrize("fail_open", [True, False])
def test_a_reranker_that_is_down_gives_first_stage_order_with_a_warning(index_dir, embedder, pipeline, fail_open):
    from llmframe_ray.api.failures import StageUnavailableError
    from llmframe_ray.api.ranking import RERANK_SKIPPED

    class RerankerDown(LocalStages):
        async def rerank_scores(self, query, passages):
            raise StageUnavailableError("the reranker stage is unavailable; retry shortly")

    settings = load_settings(
        chunk_size=64, chunk_overlap=8, fusion_depth=4, reranker_depth=5, max_top_k=20, api_secret_key=KEY,
        reranker_fail_open=fail_open,
    )
    stages = RerankerDown(index_dir, pipeline, "v", LengthReranker())
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    search = {"query": "moon", "mode": "hybrid", "rerank": True, "top_k": 3}
    with TestClient(app) as c:
        response = c.post("/v1/search", headers=AUTH, json=search)
        query = c.post("/v1/query", headers=AUTH, json={"question": "What drives the tides?", "rerank": True, "top_k": 3})
    if not fail_open:
        assert response.status_code == 503 and query.status_code == 503
        return
    body = response.json()
    assert response.status_code == 200 and response.headers["x-llmframe-warning"] == RERANK_SKIPPED
    assert (body["reranked"], body["warnings"]) == (False, [RERANK_SKIPPED])
    assert body["hits"] == as_dicts(pipeline.search("moon", "hybrid", 3, rerank=False))
    assert query.status_code == 200 and query.json()["warnings"] == [RERANK_SKIPPED] and query.json()["reranked"] is False
    assert query.headers["x-llmframe-warning"] == RERANK_SKIPPED
