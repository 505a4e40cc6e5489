"""The `llmframe-ray` command, run as a user runs it (a subprocess), on small data."""

import json
import subprocess
import sys

import pytest

from tests.conftest import cli_env


@pytest.fixture(scope="module")
def env(tmp_path_factory, model_dir):
    return cli_env(tmp_path_factory.mktemp("cli") / "home", model_dir, LLMFRAME_NUM_THREADS="2")


def cli(env, *args):
    return subprocess.run(
        [sys.executable, "-m", "llmframe_ray.cli", *map(str, args)],
        env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    (root / "rrf.md").write_text("# Rank fusion\n\nReciprocal rank fusion merges ranked lists from BM25 and dense retrieval.\n")
    (root / "faiss.txt").write_text("FAISS performs similarity search over dense vectors with inner product.\n")
    (root / "ray.html").write_text("<html><title>Ray Serve</title><body><p>Ray Serve batches requests.</p></body></html>")
    (root / "broken.pdf").write_bytes(b"%PDF-1.7\nthis is not really a pdf")
    return root


@pytest.fixture(scope="module")
def built(env, corpus, tmp_path_factory):
    index = tmp_path_factory.mktemp("idx") / "index"
    result = cli(env, "index", "build", corpus, "--index", index)
    return index, result


def test_build_skips_corrupt_pdf_and_reports_it(built, corpus):
    index, result = built
    assert result.returncode == 1, result.stderr
    assert f"skipped cannot read {corpus / 'broken.pdf'}: corrupt PDF" in result.stderr
    assert "3 documents" in result.stdout
    assert (index / "CURRENT").is_file()


def test_search_prints_hits(env, built):
    index, _ = built
    result = cli(env, "search", "reciprocal rank fusion", "--index", index, "--mode", "bm25", "--top-k", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "1 hits for 'reciprocal rank fusion' (mode bm25):"
    assert lines[1].startswith("  1. rrf.md  score=") and lines[1].endswith("[bm25 #1]")


def test_index_info_names_each_shards_dense_kind(env, built):
    index, _ = built
    result = cli(env, "index", "info", index)
    assert result.returncode == 0, result.stderr
    shard_lines = [line for line in result.stdout.splitlines() if line.startswith("  shard ")]
    assert len(shard_lines) == 1
    assert shard_lines[0].startswith("  shard 0: 3 documents, 3 chunks, ")
    assert shard_lines[0].endswith(" MiB, dense flat")  # auto: 3 rows are far under the threshold


def test_search_unknown_mode(env, built):
    index, _ = built
    result = cli(env, "search", "x", "--index", index, "--mode", "semantic")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: unknown search mode 'semantic'; valid search modes: bm25, dense, hybrid, graph, hybrid-graph"


def test_search_empty_query(env, built):
    index, _ = built
    result = cli(env, "search", "  ", "--index", index)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: query is empty or whitespace only"


def test_search_missing_index(env, tmp_path):
    result = cli(env, "search", "x", "--index", tmp_path / "none", "--mode", "bm25")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and str(tmp_path / "none") in result.stderr


def test_build_missing_source(env, tmp_path):
    result = cli(env, "index", "build", tmp_path / "nope", "--index", tmp_path / "idx")
    assert result.returncode == 2
    assert "no such file, folder or glob match" in result.stderr
    assert not (tmp_path / "idx").exists()


def test_eval_missing_file(env, tmp_path):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "corpus.jsonl").write_text("")
    result = cli(env, "eval", "--dataset", tmp_path / "ds", "--mode", "bm25")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"error: dataset folder {tmp_path / 'ds'} is missing {tmp_path / 'ds' / 'queries.jsonl'}, "
        f"{tmp_path / 'ds' / 'qrels' / 'test.tsv'} (a BEIR folder holds corpus.jsonl, queries.jsonl "
        "and qrels/<split>.tsv)"
    )


def test_eval_writes_trec_runs_with_corpus_ids(env, tmp_path):
    ds = tmp_path / "tiny"
    (ds / "qrels").mkdir(parents=True)
    docs = [
        {"_id": "doc-a", "title": "Bread", "text": "Sourdough bread rises with wild yeast."},
        {"_id": "doc-b", "title": "Tides", "text": "The Moon's gravity drives ocean tides."},
        {"_id": "doc-c", "title": "Lava", "text": "Shield volcanoes erupt basaltic lava."},
    ]
    (ds / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    queries = [{"_id": "1", "text": "yeast bread"}, {"_id": "2", "text": "ocean tides moon"}, {"_id": "3", "text": "unjudged"}]
    (ds / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (ds / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\tdoc-a\t1\n2\tdoc-b\t1\n")
    runs = tmp_path / "runs"
    result = cli(env, "eval", "--dataset", ds, "--mode", "bm25", "--mode", "hybrid", "--runs-dir", runs)
    assert result.returncode == 0, result.stderr
    for mode in ("bm25", "hybrid"):
        lines = [line.split() for line in (runs / f"{mode}.trec").read_text().splitlines()]
        assert {line[0] for line in lines} == {"1", "2"}
        assert {line[2] for line in lines} <= {"doc-a", "doc-b", "doc-c"}
        assert all(line[1] == "Q0" and line[5] == f"llmframe-{mode}" for line in lines)
        assert [line[2] for line in lines if line[3] == "1"] == ["doc-a", "doc-b"]
    table = result.stdout.splitlines()
    assert table[0] == "dataset tiny (3 docs, 2 judged test queries)"
    assert table[2].split()[:3] == ["bm25", "1.0000", "1.0000"]
    assert table[3].split()[:3] == ["hybrid", "1.0000", "1.0000"]


def test_ingest_with_an_llm_graph_extractor_and_no_key_fails_before_any_work(env, corpus, tmp_path):
    keyless = {k: v for k, v in env.items() if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    result = cli({**keyless, "LLM_PROVIDERS": "extractive"}, "ingest", corpus, "--index", tmp_path / "idx", "--graph",
                 "--graph-extractor", "llm")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the llm graph extractor needs an LLM in the provider chain (ANTHROPIC_API_KEY or OPENAI_API_KEY)")
    assert not (tmp_path / "idx" / "CURRENT").exists()
    bad = cli(env, "ingest", corpus, "--index", tmp_path / "idx", "--graph-extractor", "spacy")
    assert (bad.returncode, bad.stderr.strip().splitlines()[-1]) == (2, "error: graph extractor must be one of offline, llm, got 'spacy'")
