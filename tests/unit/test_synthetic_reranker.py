"""Reranker training from a corpus alone (train-reranker --synthetic): pseudo-queries made from
the documents' titles (every passage then read without its title) or sentences (the sentence
taken out of its positive), no judgments read."""

import json
import random
import re
import shutil
import sys
from dataclasses import replace

import pytest

from llmframe_ray.config import load_settings
from llmframe_ray.eval.beir import load_beir, load_corpus
from llmframe_ray.eval.runner import check_reranker_data
from llmframe_ray.models.cross_encoder import CARD_FILE, read_card
from llmframe_ray.train import reranker as reranker_module
from llmframe_ray.train.reranker import TrainConfig
from llmframe_ray.train.run import train_reranker
from llmframe_ray.train.synthetic import SYNTHETIC_EPOCHS, SYNTHETIC_QUERIES, PseudoQueries, pick_sentence, pick_title, sentences, synthetic_dataset
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


BODY = "Measurements in a wind tunnel gave the lift of the wing at several angles of attack and speeds, and the theory was compared with them."
TITLED = {
    "wing": ("Lift of a wing in a propeller slipstream", "lift of a wing in a propeller slipstream . " + BODY),
    "shell": ("Buckling of thin cylindrical shells under axial load", "Thin shells buckle suddenly under axial load. " + BODY),
    "flow": ("Hypersonic flow around blunt bodies", "The Newtonian theory of impact gives the pressure on blunt bodies. " + BODY),
    "short": ("Wings", "A title of one word names a document rather than asks about it. " + BODY),
}


def test_a_title_pseudo_query_reads_its_document_without_its_title():
    """The title is the pseudo-query and the positive is the text without it (and without a
    first sentence that repeats it, in any case and spacing); a document with no title lends
    its first sentence; a title under 3 words, or under 20 words left, gives none."""
    title, text = TITLED["wing"]
    assert pick_title(Document("wing", text, title=title)) == (title, BODY)
    title, text = TITLED["shell"]
    assert pick_title(Document("shell", text, title=title)) == (title, text)  # no repeat to take out
    assert pick_title(Document("medline", "The crystalline lens in vertebrates. " + BODY)) == ("The crystalline lens in vertebrates.", BODY)
    assert pick_title(Document("short", TITLED["short"][1], title="Wings")) is None
    assert pick_title(Document("thin", "Too little is left of this one.", title="A title of five words")) is None


def test_a_heading_that_repeats_the_title_is_taken_out_of_markdown_and_html(tmp_path):
    """A Markdown or HTML heading has no full stop: the title is taken out as a first line
    too, but not when the text merely begins with the title's words mid-sentence."""
    from llmframe_ray.ingest.readers import read_document
    from llmframe_ray.train.synthetic import split_title

    heading = "Configuring the ingest pipeline"
    (tmp_path / "guide.md").write_text(f"# {heading}\n\n{BODY}\n")
    (tmp_path / "guide.html").write_text(f"<html><head><title>{heading}</title></head><body><h1>{heading}</h1><p>{BODY}</p></body></html>")
    for name in ("guide.md", "guide.html"):
        document = read_document(tmp_path / name)
        assert document.title == heading and document.text.lstrip("# ").startswith(heading)
        assert pick_title(document) == (heading, BODY)
    spoken = Document("h", "Meet Corliss Archer, a program from radio's Golden Age. " + BODY, title="Meet Corliss Archer")
    assert split_title(spoken) == ("Meet Corliss Archer", spoken.text)
    crlf = Document("c", "LIFT OF A WING IN A PROPELLER SLIPSTREAM\r\n" + BODY, title=TITLED["wing"][0])
    assert split_title(crlf) == (TITLED["wing"][0], BODY)


def test_auto_takes_titles_where_most_documents_have_them(corpus_dir):
    titled = replace(load_corpus(corpus_dir), corpus=tuple(Document(k, x, title=t) for k, (t, x) in TITLED.items()))
    assert PseudoQueries.AUTO.resolve(titled) is PseudoQueries.TITLE  # 3 of 4
    assert PseudoQueries.AUTO.resolve(load_corpus(corpus_dir)) is PseudoQueries.SENTENCE  # one-word titles
    half = replace(titled, corpus=titled.corpus[2:])  # 1 of 2: half is enough
    assert PseudoQueries.AUTO.resolve(half) is PseudoQueries.TITLE
    assert PseudoQueries.SENTENCE.resolve(titled) is PseudoQueries.SENTENCE
    dataset, positives = synthetic_dataset(titled, 10, seed=1, source=PseudoQueries.AUTO)
    assert sorted(dataset.queries.values()) == sorted(t for k, (t, _) in TITLED.items() if k != "short")
    assert all(positives[q] == pick_title(Document(k, TITLED[k][1], title=TITLED[k][0]))[1]
               for q in dataset.queries for k in dataset.qrels[q])
    with pytest.raises(ValueError, match="unknown pseudo-query source 'titles'; valid pseudo-query sources: auto, title, sentence"):
        PseudoQueries.from_str("titles")
    with pytest.raises(ValueError, match="no document of .* has a title of 3 or more words .* try --pseudo-queries sentence"):
        synthetic_dataset(replace(titled, corpus=titled.corpus[3:]), 3, seed=1, source=PseudoQueries.TITLE)


def test_title_pseudo_queries_train_on_passages_without_titles(corpus_dir, model_dir, tmp_path_factory, monkeypatch):
    """Every training passage, positive and negatives, is read without its title, so that
    neither copying the query nor the absence of a title marks the positive; the card says so."""
    root = tmp_path_factory.mktemp("titled")
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": k, "title": t, "text": x}) + "\n" for k, (t, x) in TITLED.items()))
    home = tmp_path_factory.mktemp("home-titled")
    (home / "models").mkdir()
    (home / "models" / model_dir.name).symlink_to(model_dir)
    params = load_settings(home=home, num_threads=2).params()
    seen, lines = [], []
    real = reranker_module.train
    monkeypatch.setattr("llmframe_ray.train.run.train", lambda groups, *a, **k: seen.extend(groups) or real(groups, *a, **k))
    config = TrainConfig(epochs=1, seed=5, negatives=2, mining_depth=3, groups_per_step=2, max_length=48, threads=2, max_steps=1, layers=1)
    card = train_reranker(
        root, "train", tmp_path_factory.mktemp("models") / "titled", config, lines.append, embedder=params.embedder,
        index=params.index, indexes_dir=params.indexes_dir, retrieval=params.retrieval, rerank_rrf_k=params.rerank.rrf_k,
        synthetic_queries=5, pseudo_queries=PseudoQueries.AUTO,
    )
    assert "3 pseudo-queries (titles) from titled0's documents (no judgments read)" in lines
    assert card["data"]["pseudo_queries"].startswith("the title (3+ words; with no title field, a first sentence of 3-40 words) of each of 3 documents")
    assert sorted(g.query for g in seen) == sorted(t for k, (t, _) in TITLED.items() if k != "short")
    untitled = {pick_title(Document(k, x, title=t))[1] if k != "short" else x for k, (t, x) in TITLED.items()}
    def words(text):
        return " ".join(re.findall(r"\w+", text.lower()))

    for group in seen:
        assert group.positive in untitled and all(n in untitled for n in group.negatives)
        assert group.positive not in group.negatives
        for passage in (group.positive, *group.negatives):  # no passage begins with a title, in any case
            assert not any(words(passage).startswith(words(t)) for t, _ in TITLED.values())


def test_synthetic_dataset_is_seeded_and_judged_by_source(corpus_dir):
    corpus = load_corpus(corpus_dir)
    dataset, positives = synthetic_dataset(corpus, 4, seed=3, source=PseudoQueries.SENTENCE)
    again, _ = synthetic_dataset(corpus, 4, seed=3, source=PseudoQueries.SENTENCE)
    other, _ = synthetic_dataset(corpus, 6, seed=4, source=PseudoQueries.SENTENCE)
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
        pseudo_queries=PseudoQueries.SENTENCE,
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


LONG = {
    "river": ("Rivers", " ".join(f"Sentence {i} of the river text says water number {i} flows downstream to the sea." for i in range(40))),
    "stars": ("Stars", " ".join(f"Star {i} burns hydrogen in its core for {i} billion years and then swells." for i in range(30))),
    "tiny": ("Tiny", "One short text with a single sentence only here."),
}


def test_an_index_gives_back_its_documents_from_their_chunks(tmp_path, embedder):
    """Chunks overlap (and may leave gaps between them): put back together by their offsets,
    every document's text is the one ingested."""
    from llmframe_ray.ingest.build import build_index
    from llmframe_ray.train.synthetic import corpus_of_index

    settings = load_settings(chunk_size=48, chunk_overlap=12)
    root = tmp_path / "my-index"
    docs = [Document(k, text=x, title=t) for k, (t, x) in LONG.items()]
    build_index(docs, root, settings.params().index, embedder, shards=2)
    corpus = corpus_of_index(root)
    assert corpus.name == "my-index" and corpus.split == "corpus"
    assert {d.doc_id: (d.title, d.text) for d in corpus.corpus} == {k: (t, x) for k, (t, x) in LONG.items()}
    from llmframe_ray.index.versions import IndexDirectory
    assert max(s.store.max_chunks_per_doc for s in IndexDirectory(root).load().shards) > 3  # really stitched
    assert corpus_of_index(root).corpus_sha256 == corpus.corpus_sha256


def test_train_on_an_index_without_judgments(tmp_path, corpus_dir, model_dir, tmp_path_factory, embedder):
    from llmframe_ray.ingest.build import build_index
    from llmframe_ray.errors import DatasetError

    home = tmp_path_factory.mktemp("home-index")
    (home / "models").mkdir()
    (home / "models" / model_dir.name).symlink_to(model_dir)
    params = load_settings(home=home, num_threads=2).params()
    root = tmp_path / "user-index"
    build_index(load_corpus(corpus_dir).corpus, root, params.index, embedder)
    config = TrainConfig(epochs=1, seed=5, negatives=2, mining_depth=5, groups_per_step=2, max_length=48, threads=2, max_steps=1, layers=2)
    common = dict(embedder=params.embedder, index=params.index, indexes_dir=params.indexes_dir, retrieval=params.retrieval,
                  rerank_rrf_k=params.rerank.rrf_k, index_dir=root)
    card = train_reranker(None, "train", tmp_path / "adapted", config, lambda line: None, synthetic_queries=4, **common)
    assert card["data"]["dataset"] == "user-index" and card["data"]["train_queries"] == 4
    assert len(card["domain"]["centroid"]) == 384
    assert not any(params.indexes_dir.glob("beir-*"))  # the index given was searched, no cache built
    with pytest.raises(DatasetError, match="an index has no relevance judgments: train on it with --synthetic"):
        train_reranker(None, "train", tmp_path / "judged", config, lambda line: None, **common)


@pytest.mark.parametrize("given", [[], ["--dataset", "d", "--index", "i"]])
def test_the_command_takes_a_dataset_or_an_index(given, tmp_path):
    import subprocess
    import sys

    args = [sys.executable, "-m", "llmframe_ray.cli", "train-reranker", "--out", str(tmp_path / "m"), "--synthetic", *given]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "error: give exactly one of --dataset DIR (a BEIR folder) or --index DIR (with --synthetic)" in result.stderr


def test_the_command_holds_out_the_share_it_is_given(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from llmframe_ray import cli
    from llmframe_ray.train import run

    configs = []
    monkeypatch.setattr(run, "train_reranker", lambda dataset, split, out, config, *a, **k: configs.append(config) or
                        {"steps": 0, "data": {"groups": 0}})
    args = ["train-reranker", "--dataset", str(tmp_path), "--out", str(tmp_path / "m")]
    for given, share in (([], 0.1), (["--held-out", "0.5"], 0.5)):
        result = CliRunner().invoke(cli.app, [*args, *given])
        assert result.exit_code == 0, result.output
        assert configs.pop().validation_fraction == share
    refused = CliRunner().invoke(cli.app, [*args, "--held-out", "0.95"])
    assert refused.exit_code == 2 and "--held-out" in refused.output and "less than or equal to 0.9" in refused.output


def test_the_command_passes_the_pseudo_query_source_and_the_model_to_start_from(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from llmframe_ray import cli
    from llmframe_ray.train import run

    calls = []
    monkeypatch.setattr(run, "train_reranker", lambda dataset, split, out, config, *a, **k:
                        calls.append({**k, "epochs": config.epochs}) or {"steps": 0, "data": {"groups": 0}})
    args = ["train-reranker", "--dataset", str(tmp_path), "--out", str(tmp_path / "m"), "--synthetic"]
    assert CliRunner().invoke(cli.app, args).exit_code == 0
    assert (calls[-1]["pseudo_queries"], calls[-1]["init"]) == (PseudoQueries.AUTO, None)  # titles where there are
    assert (calls[-1]["synthetic_queries"], calls[-1]["epochs"]) == (SYNTHETIC_QUERIES, SYNTHETIC_EPOCHS) == (1500, 1)
    judged = CliRunner().invoke(cli.app, [a for a in args if a != "--synthetic"])
    assert judged.exit_code == 0 and (calls[-1]["synthetic_queries"], calls[-1]["epochs"]) == (None, 2)
    for given in (["--synthetic"], []):
        assert CliRunner().invoke(cli.app, [*args[:-1], *given, "--epochs", "3"]).exit_code == 0 and calls[-1]["epochs"] == 3
    given = CliRunner().invoke(cli.app, [*args, "--pseudo-queries", "Title", "--init", str(tmp_path / "start")])
    assert given.exit_code == 0, given.output
    assert (calls[-1]["pseudo_queries"], calls[-1]["init"]) == (PseudoQueries.TITLE, tmp_path / "start")
    refused = CliRunner().invoke(cli.app, [*args, "--pseudo-queries", "headings"])
    assert refused.exit_code == 2 and len(calls) == 5
    assert "error: --pseudo-queries: unknown pseudo-query source 'headings'; valid pseudo-query sources: auto, title, sentence" in refused.output


def test_ingest_adapts_a_teacher_with_the_measured_recipe(tmp_path, monkeypatch, capsys):
    """`ingest --adapt-reranker OUT --adapt-teacher M` adapts M itself (starts from it); with
    --adapt-layers a student from MiniLM is distilled from M instead; either way (and with no
    teacher) from `train-reranker --synthetic`'s default pseudo-queries: titles where the corpus
    has them, up to 1,500, one epoch. The training runs once the job is done."""
    from typer.testing import CliRunner

    from llmframe_ray import cli
    from llmframe_ray.batch import job
    from llmframe_ray.batch.report import IngestResult
    from llmframe_ray.train import run

    order = []
    monkeypatch.setattr(job, "ingest", lambda sources, index, params, **k: order.append("ingest") or IngestResult(index, "v1", None))
    monkeypatch.setattr(run, "train_reranker", lambda dataset, split, out, config, *a, **k:
                        order.append((dataset, out, config.epochs, config.layers, k)) or {"steps": 0, "data": {"groups": 0}})
    index, out, teacher = tmp_path / "index", tmp_path / "adapted", tmp_path / "teacher"
    args = ["ingest", str(tmp_path), "--index", str(index), "--adapt-reranker", str(out), "--adapt-teacher", str(teacher)]
    teacher.mkdir()
    (teacher / "model.onnx").write_bytes(b"")  # a folder from elsewhere: no card with its layers
    monkeypatch.setattr(sys, "argv", ["llmframe-ray", *args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2 and order == []  # refused before the job runs
    assert capsys.readouterr().err == (
        f"error: --adapt-teacher {teacher} cannot be adapted: it is not a reranker made by train-reranker (it needs "
        "model.onnx and a card with its layers); give --adapt-layers N to distil an N-layer MiniLM student from it\n")
    (teacher / CARD_FILE).write_text(json.dumps({"layers": [0, 1, 2, 3, 4, 5]}))
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert order[0] == "ingest" and order[1][:4] == (None, out, 1, None)
    passed = order[1][4]
    assert (passed["index_dir"], passed["teacher"], passed["init"]) == (index, teacher, teacher)
    assert (passed["pseudo_queries"], passed["synthetic_queries"]) == (PseudoQueries.AUTO, 1500)
    order.clear()
    result = CliRunner().invoke(cli.app, [*args, "--adapt-layers", "3"])
    assert result.exit_code == 0, result.output
    assert order[1][:4] == (None, out, 1, 3)
    passed = order[1][4]
    assert (passed["teacher"], passed["init"], passed["pseudo_queries"], passed["synthetic_queries"]) == (
        teacher, None, PseudoQueries.AUTO, 1500)
    order.clear()
    result = CliRunner().invoke(cli.app, args[:-2])
    assert result.exit_code == 0, result.output
    assert order[1][:4] == (None, out, 1, None) and (order[1][4]["teacher"], order[1][4]["init"]) == (None, None)


def test_ingest_can_end_by_adapting_a_reranker_to_the_corpus(corpus_dir, model_dir, tmp_path, monkeypatch, embedder):
    """`ingest --adapt-reranker OUT`: once the version is published, a reranker is trained on
    that index's own documents (the Ray job is replaced here by the in-process build, which
    writes the same index)."""
    from typer.testing import CliRunner

    from llmframe_ray import cli
    from llmframe_ray.batch import job
    from llmframe_ray.batch.report import IngestResult
    from llmframe_ray.ingest.build import build_index

    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    (home / "models" / model_dir.name).symlink_to(model_dir)
    monkeypatch.setenv("LLMFRAME_HOME", str(home))
    monkeypatch.setenv("LLMFRAME_NUM_THREADS", "2")

    def fake_ingest(sources, index, params, **kwargs):
        version = build_index(load_corpus(corpus_dir).corpus, index, params.index, embedder)
        return IngestResult(index, version, None)

    monkeypatch.setattr(job, "ingest", fake_ingest)
    index, out = tmp_path / "index", tmp_path / "adapted"
    result = CliRunner().invoke(cli.app, ["ingest", str(corpus_dir), "--index", str(index), "--adapt-reranker", str(out), "--adapt-layers", "1"])
    assert result.exit_code == 0, result.output
    card = read_card(out)
    assert card["data"]["dataset"] == "index" and card["data"]["split"] == "synthetic"
    assert card["layers"] == [5] and card["data"]["train_queries"] == 6  # every document but "short"
    # one-word titles: `auto`, the default, takes a sentence of each document
    assert card["data"]["pseudo_queries"].startswith("one sentence (5-40 words, not the title) of each of 6 documents")
    assert f"wrote {out}: " in result.output
