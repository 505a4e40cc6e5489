"""A client that goes away mid-stream stops the provider call: the served app (Ray Serve, the
local layout, behind Serve's proxy and behind HAProxy) streams an answer from a fake OpenAI server that sends one delta every 0.1 s; the
client reads the first delta and disconnects; the fake vendor must see its connection closed
long before the answer would have ended."""

from __future__ import annotations

import time

import httpx
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.ingest.build import build_index
from llmframe_ray.models.embedder import OnnxEmbedder
from llmframe_ray.types import Document
from tests.fakes.vendors import FakeOpenAI, Trickle
from tests.serving import running_app

pytest.importorskip("ray")

KEY = "disconnect-key"
DOCS = [
    Document("tides", title="Tides", text="Ocean tides are driven mainly by the gravitational pull of the Moon."),
    Document("bread", title="Bread", text="A sourdough starter is a culture of wild yeast and lactic acid bacteria."),
]
DELTAS = 100  # 10 s of answer at 0.1 s per delta


@pytest.mark.parametrize("route,haproxy", [("/v1/query", True), ("/v1/chat/completions", False)])
def test_a_client_that_disconnects_mid_stream_stops_the_provider_call(tmp_path, model_dir, monkeypatch, route, haproxy):
    if haproxy:  # the ingress `llmframe-ray serve` starts (Ray's processes inherit this environment)
        monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    index = tmp_path / "index"
    build_index(DOCS, index, load_settings().params().index, OnnxEmbedder(model_dir, threads=1))
    with FakeOpenAI() as vendor:
        vendor.script.append(Trickle(tuple(f" w{i}" for i in range(DELTAS)), interval_s=0.1))
        overrides = {
            "api_secret_key": KEY, "llm_providers": "openai", "openai_api_key": "sk-test-disconnect",
            "openai_base_url": vendor.base_url, "llm_max_attempts": 1,
        }
        with running_app(index, overrides, local=True) as url:
            body = (
                {"question": "What drives the tides?", "stream": True} if route == "/v1/query"
                else {"messages": [{"role": "user", "content": "What drives the tides?"}], "stream": True}
            )
            with httpx.Client(base_url=url, timeout=60) as client:
                with client.stream("POST", route, headers={"X-API-Key": KEY}, json=body) as response:
                    assert response.status_code == 200
                    lines = response.iter_lines()
                    while "w0" not in next(lines):  # the first delta has arrived
                        pass
                left_at = time.monotonic()  # leaving the block closed the connection mid-stream
            deadline = left_at + 8.0  # well before the answer's 10 s
            while not vendor.hangups and time.monotonic() < deadline:
                time.sleep(0.05)
    assert len(vendor.requests) == 1
    assert vendor.hangups, "the vendor kept streaming to the end: the provider call was not stopped"
    delay = vendor.hangups[0] - left_at
    print(f"{route}: the vendor saw the connection closed {delay:.2f} s after the client left")
    assert delay < 8.0
