"""Reranker training from a corpus alone (train-reranker --synthetic): pseudo-queries made from
the documents' sentences, the sentence taken out of its positive, no judgments read."""

import json
import random
import shutil
from dataclasses import replace

import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.eval.beir import load_beir, load_corpus
from llmframe_ray.eval.runner import check_reranker_data
from llmframe_ray.models.cross_encoder import read_card
from llmframe_ray.train import reranker as reranker_module
from llmframe_ray.train.reranker import TrainConfig
from llmframe_ray.train.run import train_reranker
from llmframe_ray.train.synthetic import pick_sentence, sentences, synthetic_dataset
from llmframe_ray.types import Document

DOCS = {
    "bread": ("Sourdough", "Sourdough bread rises because wild yeast ferments the dough. The starter is fed with flour and water every day. Bakers keep it warm."),
    "tides": ("Tides", "Ocean tides follow the gravitational pull of the Moon. Spring tides happen when the Sun and Moon line up together. Neap tides are weaker."),
    "lava": ("Volcanoes", "Shield volcanoes erupt runny basaltic lava in long flows. Explosive eruptions come from sticky silica rich magma instead. Ash clouds can ground planes."),
    "bikes": ("Cycling", "Cycling to work improves cardiovascular fitness over months. Riders in cities also avoid traffic jams on most days. Helmets reduce injuries."),
    "ice": ("Glaciers", "Glaciers flow slowly downhill under their own great weight. Meltwater at the base makes them slide faster in summer. Crevasses open at bends."),
    "bees": ("Bees", "Honey bees communicate the direction of flowers by dancing. The waggle run points at the food relative to the sun. Colonies split in spring."),
    "short": ("Short", "Too short."),
}


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus-only")
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": k, "title": t, "text": x}) + "\n" for k, (t, x) in DOCS.items())
    )
    return root  # no queries.jsonl, no qrels


def test_a_pseudo_query_is_one_sentence_taken_out_of_its_document():
    doc = Document("d", "Glaciers flow slowly. Meltwater at the base makes them slide faster in summer! Is that so? Yes.", title="Glaciers flow slowly.")
    assert sentences(doc.text) == ["Glaciers flow slowly.", "Meltwater at the base makes them slide faster in summer!", "Is that so?", "Yes."]
    # the only sentence of 5-40 words that is not the title
    assert pick_sentence(doc, random.Random(0)) == (
        "Meltwater at the base makes them slide faster in summer!", "Glaciers flow slowly. Is that so? Yes."
    )
    assert pick_sentence(Document("e", "One sentence alone is not enough here."), random.Random(0)) is None


def test_synthetic_dataset_is_seeded_and_judged_by_source(corpus_dir):
    corpus = load_corpus(corpus_dir)
    dataset, positives = synthetic_dataset(corpus, 4, seed=3)
    again, _ = synthetic_dataset(corpus, 4, seed=3)
    other, _ = synthetic_dataset(corpus, 6, seed=4)
    assert dict(dataset.queries) == dict(again.queries) and dataset.qrels_sha256 == again.qrels_sha256
    assert len(dataset.queries) == 4 and len(other.queries) == 6  # "short" never qualifies
    assert dataset.split == "synthetic" and dataset.corpus_sha256 == corpus.corpus_sha256
    for qid, query in dataset.queries.items():
        (source,) = dataset.qrels[qid]
        title, text = DOCS[source]
        assert query in sentences(text) and query not in positives[qid]
        assert positives[qid] == title + "\n" + " ".join(s for s in sentences(text) if s != query)
    with pytest.raises(ValueError, match="no document of .* has a sentence of 5-40 words besides its title"):
        synthetic_dataset(replace(corpus, corpus=(Document("short", "Too short."),)), 3, seed=1)


def test_train_on_a_corpus_without_judgments(corpus_dir, model_dir, tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("home")
    (home / "models").mkdir()
    (home / "models" / model_dir.name).symlink_to(model_dir)
    params = load_settings(home=home, num_threads=2).params()
    seen = []
    real = reranker_module.train
    monkeypatch.setattr("llmframe_ray.train.run.train", lambda groups, *a, **k: seen.extend(groups) or real(groups, *a, **k))
    out = tmp_path_factory.mktemp("models") / "adapted"
    config = TrainConfig(epochs=1, seed=5, negatives=2, mining_depth=5, groups_per_step=2, max_length=48, threads=2, max_steps=2, layers=2)
    card = train_reranker(
        corpus_dir, "train", out, config, lambda line: None, embedder=params.embedder, index=params.index,
        indexes_dir=params.indexes_dir, retrieval=params.retrieval, rerank_rrf_k=params.rerank.rrf_k, synthetic_queries=5,
    )
    assert card == read_card(out) and "validation" not in card
    assert card["data"]["split"] == "synthetic" and card["data"]["train_queries"] == 5 and card["data"]["validation_queries"] == 0
    assert card["data"]["pseudo_queries"].startswith("one sentence (5-40 words, not the title) of each of 5 documents sampled with seed 5")
    assert card["config"]["validation_fraction"] == 0.0
    assert len(seen) == 5
    for group in seen:
        assert group.query not in group.positive  # the sentence was taken out of its positive
        source = next(k for k, (t, x) in DOCS.items() if group.query in x)
        assert group.positive.startswith(DOCS[source][0] + "\n")
        assert not any(n.startswith(DOCS[source][0] + "\n") for n in group.negatives)  # its source is no negative
    # judged on real queries of the same corpus later: no judgments were used, so allowed
    judged = tmp_path_factory.mktemp("judged")
    shutil.copy(corpus_dir / "corpus.jsonl", judged / "corpus.jsonl")
    (judged / "qrels").mkdir()
    (judged / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "why do tides happen"}) + "\n")
    (judged / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\ttides\t1\n")
    check_reranker_data(card, load_beir(judged, "test"))
