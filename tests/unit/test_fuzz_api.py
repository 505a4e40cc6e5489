"""Property-based fuzzing of the HTTP API from its own OpenAPI schema (schemathesis + hypothesis):
schema-valid and schema-invalid requests to every route of the app the Ingress serves (in
process here: the same FastAPI app over LocalStages, the extractive answerer). Every answer must
be below 500 and match what the schema documents (status, content type, body, headers).
Bounded and seeded: FUZZ_EXAMPLES examples per route, derandomized (LLMFRAME_FUZZ_EXAMPLES
changes the bound)."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis import checks  # noqa: E402
from schemathesis.specs.openapi import checks as openapi_checks  # noqa: E402

from llmframe_ray.api.auth import ApiKeys  # noqa: E402
from llmframe_ray.api.http import create_app  # noqa: E402
from llmframe_ray.api.local import LocalStages  # noqa: E402
from llmframe_ray.api.service import RagService  # noqa: E402
from llmframe_ray.config import load_settings  # noqa: E402
from llmframe_ray.index.versions import IndexDirectory  # noqa: E402
from llmframe_ray.ingest.build import build_index  # noqa: E402
from llmframe_ray.models.embedder import OnnxEmbedder, ensure_local_model  # noqa: E402
from llmframe_ray.retrieve.pipeline import Pipeline  # noqa: E402
from llmframe_ray.types import Document  # noqa: E402

pytestmark = [pytest.mark.fuzz, pytest.mark.model]  # builds a small index with the exported embedder

KEY = "fuzz-key-0123456789"
FUZZ_EXAMPLES = int(os.environ.get("LLMFRAME_FUZZ_EXAMPLES", "300"))
# Set LLMFRAME_FUZZ_URL (and LLMFRAME_FUZZ_KEY) to fuzz a running app instead, e.g. `llmframe-ray serve`.
FUZZ_URL = os.environ.get("LLMFRAME_FUZZ_URL")
DOCS = [
    Document("tides", title="Tides", text="Ocean tides are driven mainly by the gravitational pull of the Moon."),
    Document("bread", title="Bread", text="A sourdough starter is a culture of wild yeast and lactic acid bacteria."),
    Document("bees", title="Bees", text="Honey bees tell the direction of flowers with a waggle dance."),
]
# What a response must satisfy: no 5xx, and the status, content type, headers and body that the
# schema documents for it.
CHECKS = [
    checks.not_a_server_error, openapi_checks.status_code_conformance, openapi_checks.content_type_conformance,
    openapi_checks.response_schema_conformance, openapi_checks.response_headers_conformance,
]


class LengthReranker:
    def score(self, query, passages):
        return np.array([-float(len(p)) for p in passages], dtype=np.float32)


class LazyStages:
    """In-process stages over a small index, built on the first request (not at collection, so
    selecting other tests never exports the model or writes an index)."""

    def __init__(self) -> None:
        self._stages = None
        self._dir = None

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._stages is None:
            import tempfile
            from pathlib import Path

            self._dir = tempfile.TemporaryDirectory(prefix="llmframe-fuzz-")
            embedder = OnnxEmbedder(ensure_local_model(SETTINGS.models_dir), max_length=256, batch_size=16, threads=1)
            index = Path(self._dir.name) / "index"
            build_index(DOCS, index, SETTINGS.params().index, embedder)
            params = SETTINGS.params()
            pipeline = Pipeline.open(index, embedder, params.retrieval, reranker=LengthReranker(), rerank=params.rerank)
            self._stages = LocalStages(index, pipeline, IndexDirectory(index).current_version(), LengthReranker())
        return getattr(self._stages, name)


SETTINGS = load_settings(api_secret_key=KEY, chunk_size=64, chunk_overlap=8, max_top_k=20, llm_providers="extractive")


def _schema():
    config = schemathesis.Config()
    config.projects.default.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
    if FUZZ_URL:
        return schemathesis.openapi.from_url(f"{FUZZ_URL}/openapi.json", config=config)
    app = create_app(RagService(LazyStages(), SETTINGS.params().service), ApiKeys.from_settings(SETTINGS))
    return schemathesis.openapi.from_asgi("/openapi.json", app, config=config)


schema = _schema()


@pytest.fixture(scope="module")
def tally():
    """Answers by route and status; printed (the README's figures) and checked once every route
    has been fuzzed."""
    seen: collections.Counter = collections.Counter()
    yield seen
    by_route: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for (route, status), n in seen.items():
        by_route[route][status] += n
    for route, statuses in sorted(by_route.items()):
        print(f"{route}: {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
    if len(by_route) == len(list(schema.get_all_operations())):
        assert sum(n for (_, status), n in seen.items() if 400 <= status < 500) > 0  # bad input was sent


@schema.parametrize()
@settings(max_examples=FUZZ_EXAMPLES, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_answer_is_documented_and_never_5xx(case, tally):
    response = case.call(headers={"X-API-Key": os.environ.get("LLMFRAME_FUZZ_KEY", KEY)})
    tally[(case.operation.label, response.status_code)] += 1
    case.validate_response(response, checks=CHECKS)
