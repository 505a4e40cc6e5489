"""The Ray Data ingestion job on a real local Ray cluster (2 CPUs, started by this module).

Covers: sharded = unsharded rankings, upsert/delete rebuilding only the affected shard, the
bad-file report, a driver killed mid-embedding and run again, and CURRENT never naming an
incomplete version.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from llmframe_ray.batch.job import ingest
from llmframe_ray.batch.report import REPORT_FILE
from llmframe_ray.batch.plan import PlanError, shard_of
from llmframe_ray.batch.staging import STAGING_DIR
from llmframe_ray.config import load_settings
from llmframe_ray.graph.extract import OfflineExtractor
from llmframe_ray.errors import DocumentReadError
from llmframe_ray.index.versions import IndexDirectory, shard_dir_name
from llmframe_ray.models.embedder import load_embedder
from llmframe_ray.retrieve.pipeline import Pipeline
from llmframe_ray.types import SearchMode

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
WORDS = [f"{a}{b}" for a in ("kal", "mor", "tes", "vin", "qua", "lum", "dra", "pex", "sol", "ruk")
         for b in ("ane", "ost", "ira", "umb", "elt", "ock", "yss", "ard")]


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def settings():
    return load_settings(num_threads=1, ingest_batch_size=16)


def write_corpus(folder: Path, n_docs: int, seed: int = 7, long_every: int = 9) -> dict[str, str]:
    """n_docs Markdown files of seeded pseudo-words; every `long_every`-th is long enough to
    give several chunks. Returns doc_id -> text."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    docs = {}
    for i in range(n_docs):
        n_words = 420 if i % long_every == 0 else rng.randint(25, 70)
        sentences, words = [], [rng.choice(WORDS) for _ in range(n_words)]
        for start in range(0, n_words, 12):
            sentences.append(" ".join(words[start:start + 12]).capitalize() + ".")
        text = f"# Note {i}\n\n" + " ".join(sentences) + "\n"
        name = f"note-{i:03d}.md"
        (folder / name).write_text(text, encoding="utf-8")
        docs[name] = text
    return docs


def queries(n: int = 12, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(3)) for _ in range(n)]


def rankings(index_dir: Path, settings, embedder, mode: SearchMode, k: int = 10):
    """Per query: the chunk ids ranked, and their scores."""
    pipeline = Pipeline.open(index_dir, embedder, settings.params().retrieval)
    results = pipeline.search_batch(queries(), mode, k, "chunk")
    return [[h.chunk_id for h in hits] for hits in results], [[h.score for h in hits] for hits in results]


def assert_same_rankings(a: Path, b: Path, settings, embedder, mode: SearchMode) -> None:
    """Identical top-k lists. BM25 scores are equal to the bit; dense ones to float rounding,
    since a chunk's vector can differ in the last bits with the padding of its embedding batch."""
    ids_a, scores_a = rankings(a, settings, embedder, mode)
    ids_b, scores_b = rankings(b, settings, embedder, mode)
    assert ids_a == ids_b, mode
    if mode is SearchMode.BM25:
        assert scores_a == scores_b
    else:
        flat_a, flat_b = [x for row in scores_a for x in row], [x for row in scores_b for x in row]
        assert flat_a == pytest.approx(flat_b, rel=1e-5, abs=1e-6)


def inode(path: Path) -> int:
    return path.stat().st_ino


def test_sharded_index_ranks_exactly_like_one_shard(cluster, settings, tmp_path):
    write_corpus(tmp_path / "src", 40)
    one = ingest([tmp_path / "src"], tmp_path / "one", settings.params(), shards=1, log=lambda _: None)
    four = ingest([tmp_path / "src"], tmp_path / "four", settings.params(), shards=4, log=lambda _: None)
    assert one.exit_code == four.exit_code == 0
    # Ray Data's usage poller never stops and ends the process if it polls during ray.shutdown()
    assert "data-usage-metrics-poller" not in [t.name for t in threading.enumerate()]
    loaded = IndexDirectory(tmp_path / "four").load()
    assert len(loaded.shards) == 4
    assert sum(len(s) for s in loaded.shards) == len(IndexDirectory(tmp_path / "one").load().shards[0])
    embedder = load_embedder(settings.params().embedder)
    for mode in (SearchMode.BM25, SearchMode.DENSE, SearchMode.HYBRID):
        assert_same_rankings(tmp_path / "four", tmp_path / "one", settings, embedder, mode)
    # every document sits in the shard its id hashes to
    for shard_id, shard in zip(loaded.shard_ids, loaded.shards):
        assert {shard_of(d, 4) for d in shard.store.doc_ids} == {shard_id}


def test_upsert_and_delete_rebuild_only_the_affected_shard(cluster, settings, tmp_path):
    docs = write_corpus(tmp_path / "src", 30)
    first = ingest([tmp_path / "src"], tmp_path / "idx", settings.params(), shards=3, log=lambda _: None)
    directory = IndexDirectory(tmp_path / "idx")
    v1 = directory.load()

    edited = "note-004.md"
    (tmp_path / "src" / edited).write_text(docs[edited].replace("# Note 4", "# Note 4 (revised)") + "Kalane kalane.\n")
    lines: list[str] = []
    dry = ingest([tmp_path / "src"], tmp_path / "idx", settings.params(), log=lines.append, dry_run=True)
    assert dry.plan.replaced == (edited,) and dry.version is None and dry.chunks_embedded == 0
    assert lines[-1] == f"dry run: nothing embedded or written; CURRENT stays {v1.version}"
    assert directory.versions() == [v1.version] and directory.current_version() == v1.version
    assert not any((tmp_path / "idx" / STAGING_DIR).rglob("*.npz"))  # nothing staged either
    second = ingest([tmp_path / "src"], tmp_path / "idx", settings.params(), log=lambda _: None)
    assert second.plan.replaced == (edited,) and second.plan.added == ()
    assert len(second.plan.unchanged) == 29
    target = shard_of(edited, 3)
    assert second.plan.changed_shards == [target]
    assert second.chunks_embedded == 1  # only the edited document's chunk
    v2 = directory.load()
    assert v2.version != v1.version == first.version
    for i in range(3):
        for name in ("dense.faiss", "chunks.bin"):
            same = inode(v1.path / shard_dir_name(i) / name) == inode(v2.path / shard_dir_name(i) / name)
            assert same is (i != target), (i, name)
    texts = [c.title for c in v2.shards[v2.shard_ids.index(target)].store if c.doc_id == edited]
    assert texts == ["Note 4 (revised)"]

    gone = "note-011.md"
    third = ingest([], tmp_path / "idx", settings.params(), deletes=[gone, "no-such-doc"], log=lambda _: None)
    assert third.plan.deleted == (gone,) and third.plan.not_found == ("no-such-doc",)
    assert third.plan.changed_shards == [shard_of(gone, 3)] and third.chunks_embedded == 0
    v3 = directory.load()
    all_docs = {d for s in v3.shards for d in s.store.doc_ids}
    assert gone not in all_docs and len(all_docs) == 29

    # the result equals a clean build of the same documents
    (tmp_path / "src" / gone).unlink()
    ingest([tmp_path / "src"], tmp_path / "clean", settings.params(), shards=3, log=lambda _: None)
    embedder = load_embedder(settings.params().embedder)
    for mode in (SearchMode.BM25, SearchMode.HYBRID):
        assert_same_rankings(tmp_path / "idx", tmp_path / "clean", settings, embedder, mode)

    # re-ingesting unchanged sources publishes nothing
    fourth = ingest([tmp_path / "src"], tmp_path / "idx", settings.params(), log=lambda _: None)
    assert fourth.version is None and directory.current_version() == v3.version


def test_the_job_builds_the_graph_into_the_version_and_keeps_it(cluster, settings, tmp_path):
    """--graph: the graph is part of the published version, equal to one built from the same
    version afterwards; a later run without the flag builds the new version's graph too."""
    from llmframe_ray.graph.build import ensure_graph
    from llmframe_ray.graph.store import GRAPH_DIR, KnowledgeGraph

    src = tmp_path / "src"
    src.mkdir()
    (src / "film.md").write_text("# Kiss and Tell\n\nKiss and Tell is a comedy starring Shirley Temple as Corliss Archer.\n")
    (src / "temple.md").write_text("# Shirley Temple\n\nShirley Temple Black was an American actress and diplomat.\n")
    first = ingest([src], tmp_path / "idx", settings.params(), shards=2, graph=True, log=lambda _: None)
    v1 = IndexDirectory(tmp_path / "idx").load()
    built = KnowledgeGraph.load(v1.path / GRAPH_DIR)
    assert "graph" in first.seconds and built.info["extractor"] == OfflineExtractor.name
    assert first.chunks_extracted == first.chunks_read == len(built.chunk_fps)
    rebuilt = ensure_graph(tmp_path / "idx", rebuild=True)[1]
    assert (built.keys, built.sizes()) == (rebuilt.keys, rebuilt.sizes())
    assert (built.mentions != rebuilt.mentions).nnz == 0

    (src / "lava.md").write_text("# Mount Etna\n\nMount Etna is a volcano in Sicily.\n")
    second = ingest([src], tmp_path / "idx", settings.params(), log=lambda _: None)
    v2 = IndexDirectory(tmp_path / "idx").load()
    assert v2.version == second.version != v1.version
    updated = KnowledgeGraph.load(v2.path / GRAPH_DIR)
    assert "mount etna" in updated.entity_ids()
    assert second.chunks_extracted == 1  # only the new document's chunk is read
    report = json.loads((tmp_path / "idx" / "ingest-report.json").read_text())["graph"]
    # the stage read the new chunk before the build: the build finds every chunk in the store
    assert report["chunks_extracted"] == 1 and report["build"]["extracted"] == 0
    assert report["build"]["extractions_reused"] == len(updated.chunk_fps) == len(built.chunk_fps) + 1
    assert report["build"]["updated"] == v1.version and report["llm"] is None
    plain = ingest([src], tmp_path / "plain", settings.params(), shards=2, log=lambda _: None)
    assert plain.version is not None and not (IndexDirectory(tmp_path / "plain").load().path / GRAPH_DIR).exists()


def test_a_killed_extraction_reads_only_what_it_had_not_stored(cluster, settings, tmp_path):
    """The extraction stage stores each batch as it goes: a run that finds part of its chunks
    stored (as a killed run leaves them) reads only the rest, and its graph is the same."""
    from llmframe_ray.graph.extractions import STORE_DIR
    from llmframe_ray.graph.store import GRAPH_DIR, KnowledgeGraph

    src = tmp_path / "src"
    write_corpus(src, 6)
    whole = ingest([src], tmp_path / "whole", settings.params(), shards=2, graph=True, log=lambda _: None)
    store = tmp_path / "whole" / STORE_DIR / OfflineExtractor.name
    lines = [line for f in sorted(store.glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert whole.chunks_extracted == len(lines) == whole.chunks_read > 2
    partial = tmp_path / "resumed" / STORE_DIR / OfflineExtractor.name
    partial.mkdir(parents=True)
    (partial / "written-before-the-kill.jsonl").write_text("\n".join(lines[:2]) + "\n")
    resumed = ingest([src], tmp_path / "resumed", settings.params(), shards=2, graph=True, log=lambda _: None)
    assert resumed.chunks_extracted == len(lines) - 2
    a = KnowledgeGraph.load(IndexDirectory(tmp_path / "whole").load().path / GRAPH_DIR)
    b = KnowledgeGraph.load(IndexDirectory(tmp_path / "resumed").load().path / GRAPH_DIR)
    assert (a.keys, a.chunk_fps, a.communities) == (b.keys, b.chunk_fps, b.communities)
    assert (a.mentions != b.mentions).nnz == 0


def test_an_llm_graph_extractor_needs_a_key_before_any_work(cluster, tmp_path):
    src = tmp_path / "src"
    write_corpus(src, 2)
    params = load_settings(llm_providers="extractive").params()
    with pytest.raises(ValueError, match=r"the llm graph extractor needs an LLM in the provider chain \(ANTHROPIC_API_KEY or OPENAI_API_KEY\)"):
        ingest([src], tmp_path / "idx", params, graph=True, graph_extractor="llm", log=lambda _: None)
    with pytest.raises(ValueError, match="graph extractor must be one of offline, llm, got 'spacy'"):
        ingest([src], tmp_path / "idx", params, graph=True, graph_extractor="spacy", log=lambda _: None)
    assert IndexDirectory(tmp_path / "idx").current_version() is None


def test_bad_files_are_skipped_and_reported(cluster, settings, tmp_path):
    src = tmp_path / "src"
    write_corpus(src, 5)
    (src / "binary.txt").write_bytes(b"\x00\x01\x02 not text")
    (src / "empty.md").write_text("   \n\n")
    (src / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (src / "broken.pdf").write_bytes(b"%PDF-1.4 this is not really a pdf")
    (src / "corpus.jsonl").write_text('{"_id": "j1", "text": "Kalane mosteira."}\n{not json\n{"_id": "j1", "text": "again"}\n')
    result = ingest([src], tmp_path / "idx", settings.params(), shards=2, log=lambda _: None)
    assert result.exit_code == 3
    reasons = {(Path(s.path).name, s.line): s.reason for s in result.skipped}
    assert reasons[("binary.txt", 0)] == "binary file"
    assert reasons[("empty.md", 0)] == "no text"
    assert reasons[("latin1.txt", 0)] == "not valid UTF-8 (byte 0xe9 at offset 3)"
    assert ("broken.pdf", 0) in reasons
    assert reasons[("corpus.jsonl", 2)].startswith("line 2: invalid JSON")
    assert reasons[("corpus.jsonl", 3)] == f"duplicate doc_id 'j1', first in {src / 'corpus.jsonl'} line 1"
    assert len(reasons) == 6
    report = (tmp_path / "idx" / REPORT_FILE).read_text()
    assert "binary file" in report and "duplicate doc_id" in report
    loaded = IndexDirectory(tmp_path / "idx").load()
    assert sorted({d for s in loaded.shards for d in s.store.doc_ids}) == ["j1"] + [f"note-{i:03d}.md" for i in range(5)]
    assert (loaded.path / REPORT_FILE).is_file()


def test_a_missing_source_is_an_error_before_any_work(cluster, settings, tmp_path):
    with pytest.raises(DocumentReadError, match="no such file, folder or glob match"):
        ingest([tmp_path / "nope"], tmp_path / "idx", settings.params(), log=lambda _: None)
    assert not (tmp_path / "idx").exists()
    write_corpus(tmp_path / "src", 3)
    ingest([tmp_path / "src"], tmp_path / "idx2", settings.params(), shards=2, log=lambda _: None)
    with pytest.raises(PlanError, match="the index has 2 shards; ingest into it with --shards 2"):
        ingest([tmp_path / "src"], tmp_path / "idx2", settings.params(), shards=3, log=lambda _: None)


def test_a_driver_killed_mid_embedding_is_completed_by_running_it_again(cluster, settings, tmp_path):
    src = tmp_path / "src"
    write_corpus(src, 12, seed=1)
    index = tmp_path / "idx"
    ingest([src], index, settings.params(), shards=3, log=lambda _: None)
    directory = IndexDirectory(index)
    before = directory.current_version()
    write_corpus(src, 160, seed=2)  # replaces the 12 and adds 148

    seen, failures, stop = [], [], threading.Event()

    def watch() -> None:  # CURRENT must always name a complete, loadable version
        while not stop.is_set():
            try:
                loaded = directory.load()
                seen.append((loaded.version, sum(len(s) for s in loaded.shards)))
            except Exception as exc:  # reported by the test, not lost in the thread
                failures.append(repr(exc))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "LLMFRAME_INGEST_BATCH_SIZE": "8",
           "LLMFRAME_NUM_THREADS": "1"}
    command = [sys.executable, str(REPO / "jobs" / "ingest.py"), str(src), "--index", str(index)]
    driver = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staged = index / STAGING_DIR
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and len(list(staged.rglob("*.npz"))) < 3:
        assert driver.poll() is None, "the job ended before it could be killed"
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    staged_at_kill = len(list(staged.rglob("*.npz")))
    assert staged_at_kill >= 3
    assert directory.current_version() == before

    rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    stop.set()
    watcher.join()
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    line = next(x for x in rerun.stderr.splitlines() if x.startswith("embedded "))
    embedded_again, reused = (int(w) for w in re.fullmatch(r"embedded (\d+) chunks \((\d+) already staged\)", line).groups())
    assert reused > 0, rerun.stderr[-4000:]  # the vectors staged before the kill were not computed again
    assert not staged.exists()  # staging is cleared once the version is published
    assert failures == []
    assert len(seen) > 10 and {v for v, _ in seen} <= {before, directory.current_version()}

    clean = ingest([src], tmp_path / "clean", settings.params(), shards=3, log=lambda _: None)
    assert embedded_again + reused == clean.chunks_embedded
    got, want = directory.load(), IndexDirectory(tmp_path / "clean").load()
    assert got.shard_ids == want.shard_ids == (0, 1, 2)
    for a, b in zip(got.shards, want.shards):
        assert [c.chunk_id for c in a.store] == [c.chunk_id for c in b.store]
        assert np.allclose(a.dense.vectors(range(len(a))), b.dense.vectors(range(len(b))), atol=1e-5)
    embedder = load_embedder(settings.params().embedder)
    for mode in (SearchMode.BM25, SearchMode.HYBRID):
        assert_same_rankings(index, tmp_path / "clean", settings, embedder, mode)


def test_the_job_reads_entities_and_writes_summaries_with_an_llm(cluster, tmp_path):
    """ingest --graph --graph-extractor llm: the extraction stage sends the new chunks to the
    model (the fake vendor server), the graph task has it summarise the communities, and the
    report carries the usage; a second run with one new document sends only that chunk."""
    from llmframe_ray.graph.store import GRAPH_DIR, KnowledgeGraph
    from tests.fakes.vendors import FakeAnthropic, ToolCall

    src = tmp_path / "src"
    src.mkdir()
    (src / "film.md").write_text("# Kiss and Tell\n\nKiss and Tell is a comedy starring Shirley Temple as Corliss Archer.\n")
    (src / "temple.md").write_text("# Shirley Temple\n\nShirley Temple Black was an American actress and diplomat.\n")
    entities = {"passages": [
        {"n": n, "entities": [{"name": "Shirley Temple", "type": "person", "description": "An American actress."},
                              {"name": "Corliss Archer", "type": "person", "description": "A character."}],
         "relations": [{"source": "Shirley Temple", "target": "Corliss Archer", "description": "She played her."}]}
        for n in (1, 2)
    ]}
    with FakeAnthropic() as fake:
        params = load_settings(llm_providers="anthropic,extractive", anthropic_api_key="k", anthropic_base_url=fake.base_url,
                               anthropic_model="claude-test").params()
        fake.script.extend([ToolCall("knowledge_graph", entities, input_tokens=200, output_tokens=80),
                            ToolCall("community_summaries", {"communities": [{"n": 1, "summary": "Shirley Temple played Corliss Archer."}]})])
        first = ingest([src], tmp_path / "idx", params, graph=True, graph_extractor="llm", log=lambda _: None)
        (src / "lava.md").write_text("# Mount Etna\n\nMount Etna is a volcano in Sicily.\n")
        fake.script.append(ToolCall("knowledge_graph", {"passages": [{"n": 1, "entities": [], "relations": []}]}))
        second = ingest([src], tmp_path / "idx", params, log=lambda _: None, graph_extractor="llm")
        bodies = [r.body for r in fake.requests]
    assert [b["tools"][0]["name"] for b in bodies] == ["knowledge_graph", "community_summaries", "knowledge_graph"]
    assert bodies[0]["messages"][0]["content"].count("\n\n[") == 1  # both chunks in one request
    assert bodies[2]["messages"][0]["content"] == "[1] Mount Etna\n# Mount Etna\n\nMount Etna is a volcano in Sicily."
    assert first.extraction["asked"] == 2 and first.extraction["input_tokens"] == 200
    assert second.chunks_extracted == 1
    graph = KnowledgeGraph.load(IndexDirectory(tmp_path / "idx").load().path / GRAPH_DIR)
    assert graph.info["extractor"] == "llm-v1" and graph.info["summarizer"] == "llm-summary-v1"
    temple = graph.entity_ids()["shirley templ"]
    assert graph.descriptions[temple] == "An American actress."
    summaries = {c.summary for c in graph.communities}
    assert "Shirley Temple played Corliss Archer." in summaries
    assert graph.info["llm_summaries"]["cached"] >= 1  # the unchanged community was not sent again
