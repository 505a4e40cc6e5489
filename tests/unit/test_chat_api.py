"""The OpenAI-compatible endpoint driven by the official `openai` client over real HTTP (uvicorn
in a thread, in-process stages, no Ray), and sessions in /v1/query."""

import httpx
import openai
import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.ingest.build import build_index
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.api.auth import ApiKeys
from llmframe_ray.api.http import create_app
from llmframe_ray.api.local import LocalStages
from llmframe_ray.api.service import RagService
from llmframe_ray.types import Document
from tests.serving import uvicorn_in_thread

KEY = "chat-key"
DOCS = [
    Document("tides", title="Tides", text="Ocean tides are driven mainly by the gravitational pull of the Moon."),
    Document("bread", title="Bread", text="A sourdough starter is a culture of wild yeast and lactic acid bacteria."),
    Document("lava", title="Volcanoes", text="Basaltic lava flows erupt from shield volcanoes such as Mauna Loa."),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedder):
    settings = load_settings(api_secret_key=KEY, llm_providers="extractive")
    index = tmp_path_factory.mktemp("chat") / "index"
    build_index(DOCS, index, settings.params().index, embedder)
    from llmframe_ray.index.versions import IndexDirectory

    stages = LocalStages(index, Pipeline.open(index, embedder, settings.params().retrieval), IndexDirectory(index).current_version())
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    with uvicorn_in_thread(app) as url:
        yield url


def test_openai_client_non_streaming(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY)
    reply = client.chat.completions.create(
        model="anything", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What drives the ocean tides?"}]
    )
    text = reply.choices[0].message.content
    assert text.startswith("Extractive answer (no language model configured)")
    assert "Ocean tides are driven mainly by the gravitational pull of the Moon. [1]" in text
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "extractive-v1"
    assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    extra = reply.model_extra
    assert extra["citations"][0]["doc_id"] == "tides" and extra["citations"][0]["n"] == 1
    assert extra["llmframe"]["provider"] == "extractive" and extra["llmframe"]["cost_usd"] == 0.0


def test_openai_client_streaming(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY)
    whole = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What drives the ocean tides?"}])
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "What drives the ocean tides?"}],
        stream=True, stream_options={"include_usage": True},
    ))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "stop"
    assert finals[0].model_extra["citations"] == whole.model_extra["citations"]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_openai_client_errors(server):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server}/v1", api_key="wrong").chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY)
    with pytest.raises(openai.UnprocessableEntityError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "assistant", "content": "hello"}])
    assert err.value.response.json()["error"] == {
        "type": "invalid_request", "field": "messages",
        "message": "messages: the last message must have role 'user' (it is the question)",
    }


def test_query_sessions_carry_the_conversation(server):
    with httpx.Client(base_url=server, headers={"X-API-Key": KEY}, timeout=60) as c:
        first = c.post("/v1/query", json={"question": "What drives the ocean tides?", "session_id": "conv-1"}).json()
        second = c.post("/v1/query", json={"question": "And what is a sourdough starter?", "session_id": "conv-1"}).json()
        assert first["session_id"] == second["session_id"] == "conv-1"
        # the extractive answerer counts every message it is given: the follow-up carries turn one
        alone = c.post("/v1/query", json={"question": "And what is a sourdough starter?"}).json()
        assert second["usage"]["input_tokens"] > alone["usage"]["input_tokens"] + len(first["answer"].split()) - 1
        bad = c.post("/v1/query", json={"question": "x", "session_id": "bad id"})
        assert bad.status_code == 422 and bad.json()["error"]["field"] == "session_id"


def test_sessions_are_kept_per_api_key(tmp_path, embedder):
    settings = load_settings(api_keys="key-a,key-b", llm_providers="extractive")
    index = tmp_path / "index"
    build_index(DOCS, index, settings.params().index, embedder)
    from fastapi.testclient import TestClient

    from llmframe_ray.index.versions import IndexDirectory

    stages = LocalStages(index, Pipeline.open(index, embedder, settings.params().retrieval), IndexDirectory(index).current_version())
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    with TestClient(app) as c:
        c.post("/v1/query", headers={"X-API-Key": "key-a"}, json={"question": "What drives the ocean tides?", "session_id": "shared"})
        assert len(stages.sessions) == 1
        other = c.post("/v1/query", headers={"X-API-Key": "key-b"}, json={"question": "And bread?", "session_id": "shared"}).json()
        mine = c.post("/v1/query", headers={"X-API-Key": "key-a"}, json={"question": "And bread?", "session_id": "shared"}).json()
    assert len(stages.sessions) == 2  # one per key, though the client's id is the same
    assert mine["usage"]["input_tokens"] > other["usage"]["input_tokens"]


def test_provider_failures_are_502_without_vendor_details(tmp_path, embedder):
    from fastapi.testclient import TestClient

    from llmframe_ray.generate.base import ProviderRequestError
    from llmframe_ray.index.versions import IndexDirectory

    class Refusing:
        name, model = "openai", "gpt-test"

        async def generate(self, *args, **kwargs):
            raise ProviderRequestError("openai", "HTTP 400 request rejected: Incorrect API key provided: sk-proj-Ab****", status=400)

        async def stream(self, *args, **kwargs):
            raise ProviderRequestError("openai", "HTTP 400 request rejected: Incorrect API key provided: sk-proj-Ab****", status=400)
            yield  # an async generator

    settings = load_settings(api_secret_key=KEY)
    index = tmp_path / "index"
    build_index(DOCS, index, settings.params().index, embedder)
    stages = LocalStages(index, Pipeline.open(index, embedder, settings.params().retrieval), IndexDirectory(index).current_version(), provider=Refusing())
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    with TestClient(app) as c:
        for body in ({"question": "tides?"}, {"question": "tides?", "stream": True}):
            response = c.post("/v1/query", headers={"X-API-Key": KEY}, json=body)
            assert response.status_code == 502
            assert response.json()["error"] == {"type": "provider_error", "message": "no answer provider could answer; the server log has the details", "field": None}
        chat = c.post("/v1/chat/completions", headers={"X-API-Key": KEY}, json={"messages": [{"role": "user", "content": "tides?"}], "stream": True})
        assert chat.status_code == 502 and "sk-proj" not in chat.text


def test_a_follow_up_is_sent_with_the_earlier_turn(tmp_path, embedder):
    from fastapi.testclient import TestClient

    from llmframe_ray.generate.base import Completion, Usage
    from llmframe_ray.index.versions import IndexDirectory

    class Recording:
        name, model = "recording", "rec-1"

        def __init__(self):
            self.calls = []

        async def generate(self, messages, *, system=None, max_tokens=1024, temperature=0.0):
            self.calls.append(list(messages))
            return Completion(f"answer {len(self.calls)} [1]", Usage(10, 3), self.model, self.name, "stop")

    settings = load_settings(api_secret_key=KEY)
    index = tmp_path / "index"
    build_index(DOCS, index, settings.params().index, embedder)
    provider = Recording()
    stages = LocalStages(index, Pipeline.open(index, embedder, settings.params().retrieval), IndexDirectory(index).current_version(), provider=provider)
    app = create_app(RagService(stages, settings.params().service), ApiKeys.from_settings(settings))
    with TestClient(app) as c:
        first = c.post("/v1/query", headers={"X-API-Key": KEY}, json={"question": "What drives the tides?", "session_id": "t"}).json()
        c.post("/v1/query", headers={"X-API-Key": KEY}, json={"question": "And bread?", "session_id": "t"})
    assert first["answer"] == "answer 1 [1]" and first["citations"][0]["n"] == 1 and first["usage"]["cost_usd"] is None
    follow_up = provider.calls[1]
    assert [(m.role, m.content) for m in follow_up[:2]] == [("user", "What drives the tides?"), ("assistant", "answer 1 [1]")]
    assert follow_up[2].role == "user" and follow_up[2].content.endswith("Question: And bread?")
    assert len(provider.calls[0]) == 1
