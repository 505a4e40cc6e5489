"""The MCP server (llmframe_ray/tools/mcp_server.py) driven by the MCP SDK's own client, over stdio
(the client spawns the server) and over streamable HTTP (the server in a subprocess on a free
port), against a real app: uvicorn in a thread, in-process stages, no Ray. Every wait is bounded
and every process started here is stopped here (the stdio client stops the one it spawns)."""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import anyio
import httpx
import pytest
import uvicorn
from mcp import Client, StdioServerParameters

from llmframe_ray.api.auth import ApiKeys
from llmframe_ray.api.http import create_app
from llmframe_ray.api.local import LocalStages
from llmframe_ray.api.service import RagService
from llmframe_ray.config import load_settings
from llmframe_ray.ingest.build import build_index
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.tools.mcp_server import build_server
from tests.unit.test_http_api import DOCS as HTTP_DOCS
from tests.serving import free_port
from llmframe_ray.tools.schema import (
    ANSWER, QUERY_REWRITES, RETRIEVAL_STRATEGIES, RETRIEVE_CONTEXT, TOOLS, anthropic_tools, openai_tools, request_body,
)

KEY = "mcp-test-key-0123456789"
REPO = Path(__file__).resolve().parents[2]
CLI = ["-m", "llmframe_ray.cli", "mcp"]  # `llmframe-ray mcp`, as the package installs it
WAIT_S = 30.0  # the bound on every wait: a start, a request, a stop

DOCS = HTTP_DOCS[:6]
QUESTION = "What drives the ocean tides?"


def wait_until(ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ready():
        assert time.monotonic() < deadline, f"{what} within {WAIT_S:g} s"
        time.sleep(0.05)


def accepts_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def stop(process: subprocess.Popen) -> None:
    """Terminate, then kill by pid if it does not exit in time."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def app_url(tmp_path_factory, embedder):
    """A real llmframe app (extractive answers: no language model key) on a free port."""
    settings = load_settings(chunk_size=64, chunk_overlap=8, api_secret_key=KEY, llm_providers="extractive")
    index = tmp_path_factory.mktemp("mcp") / "index"
    build_index(DOCS, index, settings.params().index, embedder)
    from llmframe_ray.index.versions import IndexDirectory

    pipeline = Pipeline.open(index, embedder, settings.params().retrieval)
    stages = LocalStages(index, pipeline, IndexDirectory(index).current_version())
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "uvicorn started")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=WAIT_S)


@pytest.fixture(scope="module")
def mcp_http_url(app_url, tmp_path_factory):
    """`python -m llmframe_ray.tools.mcp_server --http PORT` in a subprocess; its MCP endpoint URL."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("mcp-http") / "server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, *CLI, "--url", app_url, "--http", str(port)],
            env={**os.environ, "API_SECRET_KEY": KEY}, cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )
    try:
        wait_until(lambda: process.poll() is not None or accepts_connections(port), "the MCP server listening")
        assert process.poll() is None, f"the MCP server exited: {log_path.read_text()}"
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(process)


def stdio(app_url: str, key: str = KEY) -> StdioServerParameters:
    """The stdio server as an agent would configure it: the command, the key in its environment."""
    return StdioServerParameters(
        command=sys.executable, args=[*CLI, "--url", app_url], env={"API_SECRET_KEY": key}, cwd=str(REPO),
    )


@pytest.fixture(params=["stdio", "http"])
def target(request, app_url):
    """What the SDK's Client connects to: stdio parameters, or the streamable HTTP URL."""
    return stdio(app_url) if request.param == "stdio" else request.getfixturevalue("mcp_http_url")


def with_client(target: Any, steps: Callable[[Client], Awaitable[Any]]) -> Any:
    """Connect the SDK's Client to `target`, run `steps` with it, disconnect; bounded throughout."""
    async def main() -> Any:
        with anyio.fail_after(2 * WAIT_S):
            async with Client(target, read_timeout_seconds=WAIT_S) as client:
                return await steps(client)

    return anyio.run(main)


def call(target: Any, name: str, arguments: dict[str, Any]) -> Any:
    return with_client(target, lambda client: client.call_tool(name, arguments))


def error_text(result: Any) -> str:
    assert result.is_error, result
    return " ".join(block.text for block in result.content)


def post(app_url: str, route: str, body: dict[str, Any], key: str = KEY) -> httpx.Response:
    return httpx.post(f"{app_url}{route}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=WAIT_S)


def hit_keys(hits: list[dict[str, Any]]) -> list[tuple]:
    return [(h["doc_id"], h["chunk_id"], h["rank"], h["score"]) for h in hits]


def test_tools_are_listed_with_the_schema_module_definitions(target):
    tools = with_client(target, lambda client: client.list_tools()).tools
    assert [t.name for t in tools] == list(TOOLS)
    for tool in tools:
        assert tool.input_schema == TOOLS[tool.name].input_schema
        assert tool.description == TOOLS[tool.name].description
        assert tool.output_schema is not None


def test_retrieve_context_returns_the_search_hits(target, app_url):
    cases = [{"retrieval_strategy": s} for s in ("hybrid", "dense", "sparse")] + [{"retrieval_strategy": "hybrid", "alpha": 0.8}]

    async def steps(client: Client) -> list[Any]:
        return [await client.call_tool("retrieve_context", {"query": QUESTION, "top_k": 4, **case}) for case in cases]

    for case, result in zip(cases, with_client(target, steps)):
        arguments = {"query": QUESTION, "top_k": 4, **case}
        direct = post(app_url, "/v1/search", request_body(RETRIEVE_CONTEXT, arguments))
        assert direct.status_code == 200, direct.text
        expected = direct.json()
        assert not result.is_error, result.content
        got = result.structured_content
        assert hit_keys(got["hits"]) == hit_keys(expected["hits"]) and got["hits"], case
        assert got["hits"] == [{k: h[k] for k in got["hits"][0]} for h in expected["hits"]]
        assert (got["version"], got["retrieval_strategy"]) == (expected["version"], case["retrieval_strategy"])


def test_a_wrong_key_is_a_tool_error_naming_401(app_url):
    assert "HTTP 401" in error_text(call(stdio(app_url, key="not-the-key"), "retrieve_context", {"query": QUESTION}))


def test_graph_is_a_tool_error_with_the_apps_422_message(target, app_url):
    arguments = {"query": QUESTION, "retrieval_strategy": "graph"}
    direct = post(app_url, "/v1/search", request_body(RETRIEVE_CONTEXT, arguments))
    assert direct.status_code == 422, direct.text
    text = error_text(call(target, "retrieve_context", arguments))
    assert f"HTTP 422: {direct.json()['error']['message']}" in text and "retrieval_strategy" in text


def test_an_unreachable_app_is_a_tool_error_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    assert f"{url}/v1/search" in error_text(call(stdio(url), "retrieve_context", {"query": QUESTION}))


def test_answer_cites_the_passages(target, app_url):
    result = call(target, "answer", {"question": QUESTION, "top_k": 3})
    assert not result.is_error, result.content
    got = result.structured_content
    expected = post(app_url, "/v1/query", request_body(ANSWER, {"question": QUESTION, "top_k": 3})).json()
    assert got == {key: expected[key] for key in ("answer", "citations", "provider", "model", "version")}
    assert got["provider"] == "extractive" and got["citations"][0]["doc_id"] == "tides"
    assert "gravitational pull of the Moon. [1]" in got["answer"]


def test_request_bodies_say_only_what_was_chosen():
    assert request_body(RETRIEVE_CONTEXT, {"query": "q"}) == {"query": "q", "retrieval_strategy": "hybrid", "top_k": 10}
    chosen = {"query": "q", "filter": {"lang": "en"}, "alpha": 0.0, "query_rewrite": "prf", "namespace": "ns"}
    assert request_body(RETRIEVE_CONTEXT, chosen) == {"retrieval_strategy": "hybrid", "top_k": 10, **chosen}
    assert request_body(ANSWER, {"question": "q", "session_id": "s1"}) == {
        "question": "q", "top_k": 5, "retrieval_strategy": "hybrid", "session_id": "s1",
    }
    with pytest.raises(ValueError, match="unknown argument"):
        request_body(ANSWER, {"question": "q", "mode": "bm25"})


def test_openai_and_anthropic_tools_carry_the_mcp_schemas():
    listed = anyio.run(build_server("http://127.0.0.1:1", KEY).list_tools)
    mcp = {t.name: (t.description, t.input_schema) for t in listed}
    openai = {t["function"]["name"]: (t["function"]["description"], t["function"]["parameters"]) for t in openai_tools()}
    anthropic = {t["name"]: (t["description"], t["input_schema"]) for t in anthropic_tools()}
    assert mcp == openai == anthropic and set(mcp) == {"retrieve_context", "answer"}
    assert all(t["type"] == "function" for t in openai_tools())


def enum_of(schema: dict[str, Any]) -> list[str]:
    """The enum of an OpenAPI property, also when it is nullable (anyOf [..., null])."""
    if "enum" in schema:
        return schema["enum"]
    return [value for option in schema.get("anyOf", []) for value in option.get("enum", [])]


def test_the_tool_vocabulary_is_the_apis(app_url):
    bodies = httpx.get(f"{app_url}/openapi.json", timeout=WAIT_S).json()["components"]["schemas"]
    for body in ("SearchRequest", "QueryRequest"):
        properties = bodies[body]["properties"]
        assert enum_of(properties["retrieval_strategy"]) == list(RETRIEVAL_STRATEGIES), body
        assert enum_of(properties["query_rewrite"]) == list(QUERY_REWRITES), body
