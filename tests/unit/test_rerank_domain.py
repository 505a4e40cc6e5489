"""The reranker's fusion weight by domain: corpus centroids, their similarity, the weight, and
how the service asks for it (index/domain.py, retrieve/rerank.py, api/service.py)."""

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from llmframe_ray.index import domain
from llmframe_ray.index.dense import DenseIndex, DenseIndexKind, DenseParams
from llmframe_ray.index.domain import card_domain, centroid, similarity, version_centroid
from llmframe_ray.index.versions import IndexDirectory
from llmframe_ray.ingest.build import build_index
from llmframe_ray.config import load_settings
from llmframe_ray.retrieve.rerank import DOMAIN_FLOOR, RerankParams, domain_weight
from llmframe_ray.types import Document

MODEL = {"name": "all-MiniLM-L6-v2", "dim": 8}


def unit_rows(n, seed):
    rows = np.random.default_rng(seed).normal(size=(n, 8)).astype(np.float32) + 0.5
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def shard(vectors, kind=DenseIndexKind.FLAT):
    return SimpleNamespace(dense=DenseIndex.build(vectors, DenseParams(kind=kind, ivf_nlist=2)))


@pytest.mark.parametrize("kind", list(DenseIndexKind))
def test_centroid_is_the_unit_mean_of_every_vector_read_in_blocks(monkeypatch, kind):
    monkeypatch.setattr(domain, "BLOCK_ROWS", 3)  # blocks end inside and at the end of a shard
    a, b = unit_rows(7, 1), unit_rows(6, 2)
    mean = np.concatenate([a, b]).astype(np.float64).mean(axis=0)
    got = centroid([shard(a, kind), None, shard(b, kind)])  # None: an empty shard
    np.testing.assert_allclose(got, mean / np.linalg.norm(mean), rtol=1e-5)
    assert got.dtype == np.float32


def test_no_vectors_no_centroid():
    assert centroid([]) is None
    assert centroid([None]) is None


def test_a_cards_domain_against_an_index():
    home = centroid([shard(unit_rows(20, 3))])
    card = {"domain": card_domain(home, MODEL)}
    assert similarity(card, home, MODEL) == pytest.approx(1.0, abs=1e-5)
    assert similarity(card, -home, MODEL) == pytest.approx(-1.0, abs=1e-5)
    assert similarity(card, home, {**MODEL, "name": "other"}) is None  # not comparable
    assert similarity(card, home, {**MODEL, "dim": 16}) is None
    assert similarity({}, home, MODEL) is None  # a card that says nothing
    assert similarity(card, None, MODEL) is None
    # trained without judgments: its home is not trusted over the first stage
    assert similarity({**card, "data": {"split": "synthetic"}}, home, MODEL) is None
    assert similarity({**card, "data": {"split": "train"}}, home, MODEL) == pytest.approx(1.0, abs=1e-5)
    assert card_domain(None, MODEL) is None


@pytest.mark.parametrize(
    "cosine, weight", [(None, DOMAIN_FLOOR), (-0.3, DOMAIN_FLOOR), (0.2, DOMAIN_FLOOR), (0.51, 0.51), (0.99, 0.99), (1.0, 1.0)]
)
def test_domain_weight_is_the_cosine_between_the_floor_and_one(cosine, weight):
    assert domain_weight(cosine) == pytest.approx(weight)
    assert RerankParams().weight_for(cosine) == pytest.approx(weight)
    assert RerankParams(weight=2.0).weight_for(cosine) == 2.0  # set: the domain is not asked


def test_a_negative_weight_is_refused():
    with pytest.raises(ValueError, match="fusion weight must be >= 0, got -1"):
        RerankParams(weight=-1)
    with pytest.raises(Exception, match="LLMFRAME_RERANKER_WEIGHT"):
        load_settings(reranker_weight=-1)


def test_version_centroid_reads_the_published_shards(tmp_path, embedder):
    docs = [Document(f"d{i}", title=f"T{i}", text=f"Document number {i} about topic {i % 3}.") for i in range(12)]
    settings = load_settings(chunk_size=64, chunk_overlap=8)
    root = tmp_path / "index"
    build_index(docs, root, settings.params().index, embedder, shards=3)
    index = IndexDirectory(root)
    loaded = index.load()
    vector, model = version_centroid(index, loaded.version)
    np.testing.assert_allclose(vector, centroid(loaded.shards), rtol=1e-6)
    assert model == dict(loaded.shards[0].manifest.model)


class FakeStages:
    """Just what the service's weight lookup touches."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.asked = []

    async def rerank_similarity(self, version):
        self.asked.append(version)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def service(stages, weight=None):
    from llmframe_ray.api.service import RagService

    params = load_settings(reranker_weight=weight).params().service
    return RagService(stages, params)


def test_the_service_asks_once_per_version_and_stays_safe_when_it_cannot():
    stages = FakeStages([RuntimeError("reranker replica restarting"), 0.8, 0.3])
    rag = service(stages)

    async def weights():
        return [await rag.ranking._rerank_weight(v) for v in ("v1", "v1", "v1", "v2", "v2")]

    assert asyncio.run(weights()) == [DOMAIN_FLOOR, 0.8, 0.8, DOMAIN_FLOOR, DOMAIN_FLOOR]
    assert stages.asked == ["v1", "v1", "v2"]  # a failure is not kept; an answer is, per version


def test_a_set_weight_never_asks():
    stages = FakeStages([])
    assert asyncio.run(service(stages, weight=0.7).ranking._rerank_weight("v1")) == 0.7
    assert stages.asked == []


def test_serve_stages_put_the_rerankers_card_against_the_retrievers_centroid():
    ingress = pytest.importorskip("llmframe_ray.serve.ingress")
    home = centroid([shard(unit_rows(20, 4))])

    def remote(value):
        async def answer(*args):
            return value
        return SimpleNamespace(remote=lambda *args: answer(*args))

    asked = []
    retriever = SimpleNamespace(domain_centroid=SimpleNamespace(remote=lambda v: (asked.append(v), remote((home.tolist(), MODEL)).remote())[1]))
    reranker = SimpleNamespace(card=remote({"domain": card_domain(home, MODEL)}))
    stages = ingress.ServeStages(retriever, reranker, None, None, {}, {})
    assert asyncio.run(stages.rerank_similarity("v7")) == pytest.approx(1.0, abs=1e-5)
    assert asked == ["v7"]
