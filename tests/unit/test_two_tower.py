"""Two-tower reranking (models/two_tower.py, train/towers.py): a trained reranker's query and
passage sides read alone, passage vectors computed once."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from llmframe_ray.errors import ModelError
from llmframe_ray.models.cross_encoder import CrossEncoder
from llmframe_ray.models.sources import RerankerModelParams, load_reranker
from llmframe_ray.models.two_tower import TOWER_CARD, TOWER_FILES, TwoTowerScorer, has_towers
from llmframe_ray.serve.reranker import score_each
from llmframe_ray.train.towers import QUERY_ROOM, add_towers, main
from llmframe_ray.train.warm_start import load_weights, torch_scores
from tests.unit.test_warm_start import fresh
from tests.unit.tiny_beir import CONFIG, TOPICS, tiny_settings, train_tiny, write_tiny_beir

QUERIES = ["why do tides happen", "what makes sourdough rise"]
PAIRS = [(q, text) for q in QUERIES for text in TOPICS.values()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, model_dir):
    dataset_dir = write_tiny_beir(tmp_path_factory.mktemp("collection"))
    settings = tiny_settings(tmp_path_factory.mktemp("home"), model_dir)
    folder, _ = train_tiny(dataset_dir, settings, tmp_path_factory.mktemp("models") / "tiny-reranker")
    return folder


def shut_gates_scores(folder, pairs):
    """The trained pair model in torch, its cross-segment gates shut."""
    model, tokenizer = fresh()
    load_weights(model, folder, tokenizer)
    with torch.no_grad():
        model.gates.fill_(-1e4)
    return torch_scores(model, tokenizer, pairs)


def test_training_writes_towers_that_score_as_the_pair_model_with_its_gates_shut(trained):
    card = json.loads((trained / TOWER_CARD).read_text())
    assert has_towers(trained) and (trained / TOWER_FILES["fp32"]).is_file() and (trained / TOWER_FILES["int8"]).is_file()
    assert card["max_length"] == CONFIG.max_length - QUERY_ROOM and card["layers"] == [0, 1, 2, 3, 4, 5]
    towers = TwoTowerScorer(trained, precision="fp32", threads=2)
    assert towers.max_length == 32 and towers.precision.value == "fp32"
    expected = shut_gates_scores(trained, PAIRS)
    np.testing.assert_allclose(towers.score_pairs(PAIRS), expected, atol=1e-4)
    # the gates are nearly shut (-6 at the start), so the pair model is close: scores spanning
    # about 15 move by at most 0.13 here, and each query's best passage stays the same
    pair = CrossEncoder(trained, precision="fp32").score_pairs(PAIRS)
    np.testing.assert_allclose(pair, expected, atol=0.2)
    assert (pair.reshape(2, -1).argmax(1) == expected.reshape(2, -1).argmax(1)).all()
    assert towers.score(QUERIES[0], list(TOPICS.values())).tolist() == towers.score_pairs(PAIRS[: len(TOPICS)]).tolist()


def test_int8_vectors_do_not_depend_on_their_company_and_are_computed_once(trained):
    towers = TwoTowerScorer(trained, threads=2)  # auto: the int8 tower
    assert towers.precision.value == "int8"
    texts = list(TOPICS.values())
    together = towers.encode(texts)
    alone = np.stack([towers.encode([t])[0] for t in texts])
    np.testing.assert_array_equal(together, alone)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    first = towers.score_pairs(PAIRS)
    assert towers.cache.stats() == {"vector_hits": 0, "vector_misses": len(TOPICS), "vector_passages": len(TOPICS)}
    again = towers.score_pairs(list(reversed(PAIRS)))
    assert towers.cache.stats() == {"vector_hits": len(TOPICS), "vector_misses": len(TOPICS), "vector_passages": len(TOPICS)}
    np.testing.assert_array_equal(again[::-1], first)
    uncached = TwoTowerScorer(trained, threads=1, cache_size=0)
    assert uncached.cache is None
    np.testing.assert_array_equal(uncached.score_pairs(PAIRS), first)
    small = TwoTowerScorer(trained, threads=1, cache_size=2)
    small.score_pairs(PAIRS[:3])
    assert len(small.cache) == 2
    assert towers.score_pairs([]).shape == (0,)


def test_load_reranker_takes_the_towers_unless_told_not_to(trained, tiny_reranker_dir, tmp_path):
    def params(model, **extra):  # prepacked copies under tmp_path, not the working folder
        return RerankerModelParams(model=str(model), threads=1, models_dir=tmp_path, **extra)

    assert isinstance(load_reranker(params(trained)), TwoTowerScorer)
    assert isinstance(load_reranker(params(trained, towers=False)), CrossEncoder)
    # a passage window depends on the query; a tower's passage vector must not
    assert isinstance(load_reranker(params(trained, window=True)), CrossEncoder)
    assert isinstance(load_reranker(params(tiny_reranker_dir)), CrossEncoder)
    chosen = load_reranker(params(trained, vector_cache=7))
    assert chosen.cache.capacity == 7
    # the Serve deployment's batch path splits the scores back per request
    items = [(QUERIES[0], tuple(TOPICS.values())[:2]), (QUERIES[1], tuple(TOPICS.values())[1:4])]
    scores = score_each(chosen, items)
    assert scores == [chosen.score(q, list(p)).tolist() for q, p in items]


def test_the_command_makes_towers_for_a_folder_trained_before(trained, tmp_path, capsys):
    older = tmp_path / "older"
    shutil.copytree(trained, older)
    for name in (*TOWER_FILES.values(), TOWER_CARD):
        (older / name).unlink()
    assert isinstance(load_reranker(RerankerModelParams(model=str(older), threads=1, models_dir=tmp_path)), CrossEncoder)
    assert main([str(older)]) == 0
    assert capsys.readouterr().out == f"{older}: tower.onnx, tower.int8.onnx, tower.json\n"
    assert json.loads((older / TOWER_CARD).read_text()) == json.loads((trained / TOWER_CARD).read_text())
    np.testing.assert_allclose(
        TwoTowerScorer(older, precision="fp32").score_pairs(PAIRS),
        TwoTowerScorer(trained, precision="fp32").score_pairs(PAIRS), atol=1e-5,
    )
    assert sorted(p.name for p in older.iterdir() if p.name.startswith(".")) == []
    add_towers(older)  # again: replaced in place
    assert has_towers(older)
    capsys.readouterr()
    assert main([str(tmp_path)]) == 2  # not a reranker folder: said, no traceback
    assert capsys.readouterr().err == (
        f"error: {tmp_path} is not a reranker made by train-reranker (it needs model.onnx and a card with its layers): "
        "its towers are made from its weights\n"
    )


def test_towers_that_do_not_fit_the_folder_are_refused(trained, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(trained, folder)
    card = json.loads((folder / TOWER_CARD).read_text())
    (folder / TOWER_CARD).write_text(json.dumps({**card, "made_from_sha256": "0" * 64}))
    with pytest.raises(ModelError, match=r"the towers in .* were made from another model.onnx than the one there now; "
                                         r"make them again: python -m llmframe_ray.train.towers "):
        TwoTowerScorer(folder)
    (folder / TOWER_CARD).write_text("{not json")
    with pytest.raises(ModelError, match="cannot read the two-tower card"):
        TwoTowerScorer(folder)
    (folder / TOWER_CARD).write_text(json.dumps({**card, "weights": []}))
    with pytest.raises(ModelError, match="`weights` must be a non-empty list of numbers"):
        TwoTowerScorer(folder)
    (folder / TOWER_CARD).write_text(json.dumps({**card, "weights": card["weights"][:-1]}))
    with pytest.raises(ModelError, match=r"the tower gave vectors of shape \(1, 384\), its head has 383 weights"):
        TwoTowerScorer(folder, precision="fp32").score_pairs(PAIRS[:1])
    (folder / TOWER_CARD).write_text(json.dumps(card))
    (folder / TOWER_FILES["int8"]).unlink()
    assert TwoTowerScorer(folder).precision.value == "fp32"  # auto falls back to what is there
    with pytest.raises(ModelError, match=r"has no tower.int8.onnx"):
        TwoTowerScorer(folder, precision="int8")


def test_vectors_computed_ahead_are_read_by_the_next_scorer(trained, tmp_path, caplog):
    store = tmp_path / "tower-vectors"
    first = TwoTowerScorer(trained, threads=2, store_dir=store)
    passages = list(TOPICS.values())
    assert first.warm(passages + passages[:2]) == len(passages)  # each distinct passage once
    assert first.store_path.parent == store and first.store_path.is_file()
    assert first.warm(passages) == 0
    second = TwoTowerScorer(trained, threads=2, store_dir=store)
    assert len(second.cache) == len(passages)
    scores = second.score_pairs(PAIRS)
    assert second.cache.stats() == {"vector_hits": len(passages), "vector_misses": 0, "vector_passages": len(passages)}
    np.testing.assert_array_equal(scores, first.score_pairs(PAIRS))
    # each tower file and text length has its own store: the fp32 tower starts empty, and so do
    # texts read at another length
    assert len(TwoTowerScorer(trained, precision="fp32", store_dir=store).cache) == 0
    assert len(TwoTowerScorer(trained, max_length=24, store_dir=store).cache) == 0
    # a store larger than the cache keeps its most recent vectors
    assert len(TwoTowerScorer(trained, store_dir=store, cache_size=3).cache) == 3
    with pytest.raises(ModelError, match=r"^8 distinct passages do not fit a vector cache of 3: raise LLMFRAME_RERANKER_VECTOR_CACHE$"):
        TwoTowerScorer(trained, store_dir=tmp_path / "other", cache_size=3).warm(passages)
    with pytest.raises(ModelError, match="warming needs a vector cache"):
        TwoTowerScorer(trained).warm(passages)
    # a broken store costs the head start, not the service
    first.store_path.write_bytes(b"not a numpy file")
    with caplog.at_level("WARNING", logger="llmframe_ray.models.two_tower"):
        broken = TwoTowerScorer(trained, store_dir=store)
    assert len(broken.cache) == 0
    assert caplog.messages[-1].startswith(f"cannot read the kept passage vectors {first.store_path}: ")
    assert caplog.messages[-1].endswith("; the passages' vectors will be computed as they are asked for")
    np.testing.assert_array_equal(broken.score_pairs(PAIRS), scores)


def test_the_rerank_vectors_command_computes_every_chunk_of_an_index(trained, tiny_reranker_dir, tmp_path, monkeypatch, embedder):
    from llmframe_ray.config import load_settings
    from llmframe_ray.index.versions import IndexDirectory
    from llmframe_ray.ingest.build import build_index
    from llmframe_ray.types import Document

    root = tmp_path / "index"
    build_index([Document(k, text=t, title=k) for k, t in TOPICS.items()], root, load_settings().params().index, embedder, shards=2)
    monkeypatch.setenv("LLMFRAME_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LLMFRAME_NUM_THREADS", "2")
    command = [sys.executable, "-m", "llmframe_ray.cli", "rerank-vectors", "--index", str(root), "--reranker"]
    result = subprocess.run([*command, str(trained)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    served = load_reranker(load_settings(reranker_model=str(trained)).params().reranker_model)
    assert result.stdout == (
        f"{root}: {len(TOPICS)} chunks, {len(TOPICS)} vectors computed in 0 s; {len(TOPICS)} kept in {served.store_path}\n"
    )
    chunks = [c.indexed_text for s in IndexDirectory(root).load().shards for c in s.store]
    served.score("why do tides happen", chunks)
    assert served.cache.stats()["vector_misses"] == 0
    refused = subprocess.run([*command, str(tiny_reranker_dir)], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == (
        f"error: {tiny_reranker_dir} has no two towers (tower.json), or LLMFRAME_RERANKER_TOWERS is off: nothing to compute ahead\n"
    )
