"""An MCP server whose tools are the served HTTP API: `retrieve_context` posts to /v1/search and
`answer` to /v1/query, with the API key as a Bearer token.

It holds no index and no model: it is a client of a running llmframe app, so one app can serve
any number of agents, and it runs wherever the agent does. The tools' names, descriptions and
input schemas come from `llmframe_ray.tools.schema` (the same definitions the OpenAI and
Anthropic tool lists are made from). Values are checked by the app, not here: a refused request
comes back as a tool error that names the HTTP status and the app's message.

    python -m llmframe_ray.tools.mcp_server --url http://127.0.0.1:8000              # stdio
    python -m llmframe_ray.tools.mcp_server --url http://127.0.0.1:8000 --http 8765  # streamable HTTP at /mcp

The key comes from the environment (API_SECRET_KEY), never from the command line, where other
users of the machine could read it.
"""

from __future__ import annotations

import argparse
import inspect
import os
from typing import Any, Callable

import httpx
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool

from llmframe_ray.tools.schema import (
    ANSWER,
    RETRIEVE_CONTEXT,
    AnswerResult,
    RetrieveContextResult,
    ToolSpec,
    answer_result,
    request_body,
    retrieve_context_result,
)

KEY_ENV = "API_SECRET_KEY"
MCP_PATH = "/mcp"
# An answer waits on a language model; the app bounds its own requests (LLMFRAME_REQUEST_TIMEOUT_S).
REQUEST_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 10.0
INSTRUCTIONS = (
    "Tools over an llmframe document index. Call retrieve_context to get passages that ground an "
    "answer (cite them by doc_id), or answer to have the server write a cited answer itself."
)


def http_error_message(response: httpx.Response) -> str:
    """`HTTP <status>: <the app's message>`: the app's error body is {"error": {"message": ...}};
    anything else (a proxy's page) is quoted, shortened."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text.strip()[:300] or response.reason_phrase
    return f"HTTP {response.status_code}: {message}"


class ApiClient:
    """Posts JSON to the app with the key as a Bearer token, and turns every failure into a
    `ToolError`, whose text the MCP client sees (other exceptions reach it only as 'error')."""

    def __init__(self, url: str, key: str | None) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)

    async def post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """The JSON of a 2xx answer to `POST {url}{route}`. A client per call: nothing is bound
        to an event loop between calls, and a loopback connection costs little next to a search."""
        target = f"{self.url}{route}"
        try:
            async with httpx.AsyncClient(headers=self.headers, timeout=self.timeout) as http:
                response = await http.post(target, json=body)
        except httpx.TransportError as exc:
            raise ToolError(f"cannot reach the llmframe API at {target}: {type(exc).__name__}: {exc}") from exc
        if response.is_error:
            raise ToolError(http_error_message(response))
        try:
            return response.json()
        except ValueError as exc:
            raise ToolError(f"the llmframe API at {target} answered HTTP {response.status_code} without JSON") from exc


_REQUIRED = object()


def _check_signature(fn: Callable[..., Any], spec: ToolSpec) -> None:
    """Refuse a tool function whose parameters or defaults differ from the spec's schema: the
    function's signature validates the call, the spec's schema is what clients are shown."""
    declared = {
        name: _REQUIRED if p.default is inspect.Parameter.empty else p.default
        for name, p in inspect.signature(fn).parameters.items()
    }
    defaults = spec.defaults()
    expected = {name: defaults.get(name, _REQUIRED) for name in spec.input_schema["properties"]}
    if declared != expected:
        raise TypeError(f"{fn.__name__}() does not match the {spec.name!r} tool schema in llmframe_ray.tools.schema")


def _tool(fn: Callable[..., Any], spec: ToolSpec) -> Tool:
    """An MCP tool running `fn` and advertising the spec's name, description and input schema."""
    _check_signature(fn, spec)
    tool = Tool.from_function(fn, name=spec.name, description=spec.description, structured_output=True)
    return tool.model_copy(update={"parameters": spec.parameters()})


def build_server(url: str, key: str | None) -> MCPServer:
    """The MCP server for the app at `url` (its base URL), calling it with `key`."""
    api = ApiClient(url, key)

    async def retrieve_context(
        query: str,
        retrieval_strategy: str = "hybrid",
        top_k: int = 10,
        filter: dict[str, Any] | None = None,
        alpha: float | None = None,
        query_rewrite: str = "none",
        namespace: str | None = None,
    ) -> RetrieveContextResult:
        arguments = {
            "query": query, "retrieval_strategy": retrieval_strategy, "top_k": top_k, "filter": filter,
            "alpha": alpha, "query_rewrite": query_rewrite, "namespace": namespace,
        }
        response = await api.post(RETRIEVE_CONTEXT.route, request_body(RETRIEVE_CONTEXT, arguments))
        return retrieve_context_result(response, retrieval_strategy)

    async def answer(
        question: str,
        top_k: int = 5,
        retrieval_strategy: str = "hybrid",
        query_rewrite: str = "none",
        filter: dict[str, Any] | None = None,
        session_id: str | None = None,
        namespace: str | None = None,
    ) -> AnswerResult:
        arguments = {
            "question": question, "top_k": top_k, "retrieval_strategy": retrieval_strategy,
            "query_rewrite": query_rewrite, "filter": filter, "session_id": session_id, "namespace": namespace,
        }
        return answer_result(await api.post(ANSWER.route, request_body(ANSWER, arguments)))

    tools = [_tool(retrieve_context, RETRIEVE_CONTEXT), _tool(answer, ANSWER)]
    return MCPServer("llmframe-ray", instructions=INSTRUCTIONS, tools=tools)


def run(url: str, key: str | None, http_port: int | None = None, host: str = "127.0.0.1") -> None:
    """Serve the tools until stopped: over stdio when `http_port` is None (the agent starts this
    process), else over streamable HTTP at http://host:http_port/mcp. `key` None: $API_SECRET_KEY
    (and no Authorization header when that is unset too, for an app with auth disabled)."""
    server = build_server(url, key if key is not None else os.environ.get(KEY_ENV))
    if http_port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host=host, port=http_port, streamable_http_path=MCP_PATH)


def main(argv: list[str] | None = None) -> None:
    """The command line: `--url` the app's base URL, `--http PORT` for streamable HTTP."""
    parser = argparse.ArgumentParser(
        prog="python -m llmframe_ray.tools.mcp_server",
        description=f"MCP server with retrieve_context and answer tools over an llmframe app (key: ${KEY_ENV}).",
    )
    parser.add_argument("--url", required=True, help="the app's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--http", type=int, metavar="PORT", help=f"serve streamable HTTP on PORT (path {MCP_PATH}); default: stdio")
    parser.add_argument("--host", default="127.0.0.1", help="the address --http listens on (default: 127.0.0.1)")
    args = parser.parse_args(argv)
    run(args.url, None, args.http, args.host)


if __name__ == "__main__":
    main()
