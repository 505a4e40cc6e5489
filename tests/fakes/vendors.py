"""Local fake servers speaking the Anthropic Messages and OpenAI Chat Completions wire protocols,
so providers are tested through the real SDKs and their real HTTP layer (no mocks).

    with FakeAnthropic() as fake:   # serves {base_url}/v1/messages (FakeOpenAI: {base_url}/chat/completions)
        fake.script.append(Fail(429, "slow down", headers={"retry-after": "7"}))
        ...AnthropicProvider("key", "claude-test", base_url=fake.base_url)...
        fake.requests[0].body["max_tokens"], fake.requests[0].headers["anthropic-version"]

Each accepted request takes the first behaviour off `script` (`Answer()` when it is empty):
Answer(deltas, input_tokens, output_tokens) is JSON, or one server-sent event per delta when the
request streams; ToolCall(name, arguments) a tool_use block / message.tool_calls; Fail(status,
message, headers) a vendor-shaped error; Delay(seconds, then) waits, then behaves as `then`;
Cut(deltas) sends the deltas and drops the connection mid-body; Trickle(deltas, interval_s) streams
the deltas one every `interval_s` and records in `hangups` (time.monotonic()) when the client
closed the connection before the end. `requests` records each request's path, headers
(lower-case) and JSON body. As API version 2026-10-21 does, FakeAnthropic answers
400 to sampling parameters (temperature, top_p, top_k), using up no behaviour.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Mapping, Self, Union

CREATED = 1_700_000_000


@dataclass(frozen=True)
class Answer:
    deltas: tuple[str, ...] = ("Hello", " world")
    input_tokens: int = 12
    output_tokens: int = 3
    finish_reason: str | None = None  # None: the vendor's usual ("end_turn" / "stop")
    model: str | None = None  # None: echo the request's model


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Any  # the tool input; a non-object tests validation
    raw_arguments: str | None = None  # OpenAI only: sent verbatim instead of json.dumps(arguments)
    text: str = ""  # text written alongside the call
    input_tokens: int = 20
    output_tokens: int = 9


@dataclass(frozen=True)
class Fail:
    status: int
    message: str = "fake failure"
    headers: Mapping[str, str] = field(default_factory=dict)
    error_type: str | None = None  # None: the vendor's type for the status


@dataclass(frozen=True)
class Delay:
    seconds: float
    then: Behaviour = field(default_factory=Answer)


@dataclass(frozen=True)
class Cut:
    deltas: tuple[str, ...]


@dataclass(frozen=True)
class Trickle:
    deltas: tuple[str, ...]
    interval_s: float = 0.1


Behaviour = Union[Answer, ToolCall, Fail, Delay, Cut, Trickle]


@dataclass(frozen=True)
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any  # the ThreadingHTTPServer, with `fake` set on it

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output clean
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # the client went away (timeouts, dropped streams)
            pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length", "0")))
        body = json.loads(raw) if raw else {}
        self.server.fake._accept(self, Recorded(self.path, {k.lower(): v for k, v in self.headers.items()}, body))

    def send_json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None, *, cut: bool = False) -> None:
        """Send `payload`; with `cut`, announce its full length but send half, then drop."""
        data = json.dumps(payload).encode()
        self.start(status, {"content-type": "application/json", "content-length": str(len(data)), **(headers or {})})
        self.wfile.write(data[: len(data) // 2] if cut else data)
        if cut:
            self.drop()

    def send_events(self, events: list[str], *, cut: bool, interval_s: float = 0.0) -> None:
        """One HTTP chunk per event (`interval_s` apart); with `cut`, drop the connection instead
        of the last chunk."""
        self.start(200, {"content-type": "text/event-stream; charset=utf-8", "transfer-encoding": "chunked"})
        for event in events:
            data = event.encode()
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.server.fake.hangups.append(time.monotonic())
                raise
            if interval_s and self.server.fake._closing.wait(interval_s):
                return
        if cut:
            return self.drop()
        self.wfile.write(b"0\r\n\r\n")

    def start(self, status: int, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def drop(self) -> None:  # no final chunk / fewer bytes than announced
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


class _FakeVendor:
    """Server, script and record. A vendor sets `path` and `url_suffix`, writes its wire format in
    `_error_body`, `_answer`, `_tool_answer` and `_events`, and may `_reject(body)` with a 400."""

    path = ""
    url_suffix = ""

    def __init__(self) -> None:
        self.script: list[Behaviour] = []
        self.requests: list[Recorded] = []
        self.hangups: list[float] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)  # daemon handler threads
        self._server.fake = self
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}{self.url_suffix}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _reject(self, body: dict[str, Any]) -> str | None:
        return None

    def _accept(self, out: _Handler, request: Recorded) -> None:
        status, rejection = (400, self._reject(request.body)) if request.path == self.path else (404, "no such route")
        with self._lock:
            self.requests.append(request)
            behaviour = self.script.pop(0) if self.script and rejection is None else Answer()
        if rejection is not None:
            return out.send_json(status, self._error_body(Fail(status, rejection)))
        self._respond(out, request.body, behaviour)

    def _respond(self, out: _Handler, body: dict[str, Any], behaviour: Behaviour) -> None:
        if isinstance(behaviour, Delay):
            if not self._closing.wait(behaviour.seconds):
                self._respond(out, body, behaviour.then)
        elif isinstance(behaviour, Fail):
            out.send_json(behaviour.status, self._error_body(behaviour), behaviour.headers)
        elif isinstance(behaviour, ToolCall):
            out.send_json(200, self._tool_answer(body, behaviour))
        else:
            cut = isinstance(behaviour, Cut)
            answer = Answer(behaviour.deltas) if isinstance(behaviour, (Cut, Trickle)) else behaviour
            if body.get("stream"):
                interval = behaviour.interval_s if isinstance(behaviour, Trickle) else 0.0
                out.send_events(self._events(body, answer, cut), cut=cut, interval_s=interval)
            else:
                out.send_json(200, self._answer(body, answer), cut=cut)


def _sse(event: str | None, data: Any) -> str:
    line = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
    return f"event: {event}\n{line}" if event is not None else line


class FakeAnthropic(_FakeVendor):
    path = "/v1/messages"
    error_types = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}

    def _reject(self, body: dict[str, Any]) -> str | None:
        sampling = [key for key in ("temperature", "top_p", "top_k") if key in body]
        return f"{sampling[0]}: Extra inputs are not permitted" if sampling else None

    def _error_body(self, fail: Fail) -> Any:
        kind = fail.error_type or self.error_types.get(fail.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": fail.message}, "request_id": "req_fake"}

    def _message(self, body: dict[str, Any], content: list[Any], stop: str | None, tokens: tuple[int, int],
                 model: str | None = None) -> dict[str, Any]:
        return {"id": f"msg_fake_{len(self.requests)}", "type": "message", "role": "assistant",
                "model": model or body["model"], "content": content, "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]}}

    def _answer(self, body: dict[str, Any], answer: Answer) -> Any:
        return self._message(body, [{"type": "text", "text": "".join(answer.deltas)}],
                             answer.finish_reason or "end_turn", (answer.input_tokens, answer.output_tokens),
                             answer.model)

    def _tool_answer(self, body: dict[str, Any], call: ToolCall) -> Any:
        content = [{"type": "text", "text": call.text}] if call.text else []
        content.append({"type": "tool_use", "id": f"toolu_fake_{len(self.requests)}", "name": call.name,
                        "input": call.arguments})
        return self._message(body, content, "tool_use", (call.input_tokens, call.output_tokens))

    def _events(self, body: dict[str, Any], answer: Answer, cut: bool) -> list[str]:
        start = self._message(body, [], None, (answer.input_tokens, 1), answer.model)
        events = [_sse("message_start", {"type": "message_start", "message": start}),
                  _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                               "content_block": {"type": "text", "text": ""}}),
                  _sse("ping", {"type": "ping"})]
        events += [_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "text_delta", "text": text}})
                   for text in answer.deltas]
        stop = {"stop_reason": answer.finish_reason or "end_turn", "stop_sequence": None}
        return events if cut else events + [
            _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _sse("message_delta", {"type": "message_delta", "delta": stop,
                                   "usage": {"output_tokens": answer.output_tokens}}),
            _sse("message_stop", {"type": "message_stop"}),
        ]


class FakeOpenAI(_FakeVendor):
    path = "/v1/chat/completions"
    url_suffix = "/v1"

    def _error_body(self, fail: Fail) -> Any:
        kind = fail.error_type or ("server_error" if fail.status >= 500 else
                                   "requests" if fail.status == 429 else "invalid_request_error")
        code = "rate_limit_exceeded" if fail.status == 429 else None
        return {"error": {"message": fail.message, "type": kind, "param": None, "code": code}}

    def _completion(self, body: dict[str, Any], message: dict[str, Any], finish: str, tokens: tuple[int, int],
                    model: str | None = None) -> dict[str, Any]:
        message = {"role": "assistant", "content": None, "refusal": None, "annotations": [], **message}
        return {"id": f"chatcmpl-fake-{len(self.requests)}", "object": "chat.completion", "created": CREATED,
                "model": model or body["model"], "system_fingerprint": "fp_fake",
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
                "usage": _openai_usage(tokens)}

    def _answer(self, body: dict[str, Any], answer: Answer) -> Any:
        return self._completion(body, {"content": "".join(answer.deltas)}, answer.finish_reason or "stop",
                                (answer.input_tokens, answer.output_tokens), answer.model)

    def _tool_answer(self, body: dict[str, Any], call: ToolCall) -> Any:
        arguments = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)
        function = {"name": call.name, "arguments": arguments}
        message = {"content": call.text or None,
                   "tool_calls": [{"id": f"call_fake_{len(self.requests)}", "type": "function", "function": function}]}
        return self._completion(body, message, "tool_calls", (call.input_tokens, call.output_tokens))

    def _events(self, body: dict[str, Any], answer: Answer, cut: bool) -> list[str]:
        with_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        head = {"id": f"chatcmpl-fake-{len(self.requests)}", "object": "chat.completion.chunk", "created": CREATED,
                "model": answer.model or body["model"], "system_fingerprint": "fp_fake"}

        def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: Any = None) -> str:
            choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
            return _sse(None, {**head, "choices": choices, **({"usage": usage} if with_usage else {})})

        events = [chunk({"role": "assistant", "content": "", "refusal": None})]
        events += [chunk({"content": text}) for text in answer.deltas]
        if cut:
            return events
        events.append(chunk({}, answer.finish_reason or "stop"))
        if with_usage:  # the last chunk: no choices, the whole stream's usage
            events.append(chunk(None, usage=_openai_usage((answer.input_tokens, answer.output_tokens))))
        return events + [_sse(None, "[DONE]")]


def _openai_usage(tokens: tuple[int, int]) -> dict[str, int]:
    return {"prompt_tokens": tokens[0], "completion_tokens": tokens[1], "total_tokens": sum(tokens)}
