import json
import math

import numpy as np
import pytest

from llmframe_ray.errors import DatasetError
from llmframe_ray.eval.beir import load_beir
from llmframe_ray.eval.trec import score_per_query, score_run, write_run


def make_beir(root, qrels_lines=("q1\td1\t1", "q2\td3\t2", "q2\td2\t1")):
    root.mkdir()
    (root / "qrels").mkdir()
    docs = [{"_id": f"d{i}", "title": f"T{i}", "text": f"text {i}"} for i in range(1, 4)]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    queries = [{"_id": "q1", "text": "first"}, {"_id": "q2", "text": "second"}, {"_id": "q3", "text": "unjudged"}]
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels_lines) + "\n")
    return root


def test_load_beir_keeps_only_judged_queries(tmp_path):
    ds = load_beir(make_beir(tmp_path / "tiny"))
    assert ds.name == "tiny"
    assert [d.doc_id for d in ds.corpus] == ["d1", "d2", "d3"]
    assert ds.corpus[0].title == "T1"
    assert dict(ds.queries) == {"q1": "first", "q2": "second"}
    assert {q: dict(d) for q, d in ds.qrels.items()} == {"q1": {"d1": 1}, "q2": {"d3": 2, "d2": 1}}
    assert len(ds.corpus_sha256) == 64


@pytest.mark.parametrize("missing", ["corpus.jsonl", "queries.jsonl", "qrels/test.tsv"])
def test_missing_file_is_named(tmp_path, missing):
    root = make_beir(tmp_path / "tiny")
    (root / missing).unlink()
    with pytest.raises(DatasetError) as err:
        load_beir(root)
    assert str(err.value) == (
        f"dataset folder {root} is missing {root / missing} "
        "(a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv)"
    )


def test_missing_folder(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_beir(tmp_path / "nope")


def test_malformed_qrels_line(tmp_path):
    root = make_beir(tmp_path / "tiny", qrels_lines=("q1\td1",))
    with pytest.raises(DatasetError) as err:
        load_beir(root)
    assert str(err.value) == f"{root / 'qrels' / 'test.tsv'} line 2: expected 3 tab-separated fields, got 2"


def test_malformed_corpus_line(tmp_path):
    root = make_beir(tmp_path / "tiny")
    with open(root / "corpus.jsonl", "a") as fh:
        fh.write("{not json\n")
    with pytest.raises(DatasetError) as err:
        load_beir(root)
    assert str(err.value) == (
        f"cannot read {root / 'corpus.jsonl'}: line 4: invalid JSON "
        "(Expecting property name enclosed in double quotes at column 2)"
    )


def test_empty_qrels(tmp_path):
    root = make_beir(tmp_path / "tiny", qrels_lines=())
    with pytest.raises(DatasetError) as err:
        load_beir(root)
    assert str(err.value) == f"{root / 'qrels' / 'test.tsv'} holds no judgments"


def test_run_file_format_and_scores(tmp_path):
    qrels = {"q1": {"d1": 1}, "q2": {"d3": 2, "d2": 1}}
    run = {"q1": [("d2", 0.9), ("d1", 0.5)], "q2": [("d3", 3.0), ("d2", 2.0), ("d1", 1.0)]}
    path = write_run(tmp_path / "runs" / "x.trec", run, tag="test-run")
    assert path.read_text().splitlines() == [
        "q1 Q0 d2 1 0.9 test-run",
        "q1 Q0 d1 2 0.5 test-run",
        "q2 Q0 d3 1 3 test-run",
        "q2 Q0 d2 2 2 test-run",
        "q2 Q0 d1 3 1 test-run",
    ]
    scores = score_run(path, qrels)
    # q1: single relevant doc at rank 2 -> 1/log2(3); q2: ideal order -> 1.0
    assert scores["nDCG@10"] == pytest.approx((1 / math.log2(3) + 1.0) / 2, abs=1e-9)
    assert scores["Recall@100"] == 1.0


def test_tied_scores_are_written_strictly_decreasing(tmp_path):
    # our order puts "z" before "a" at equal score; a scorer that sorts by score must agree
    path = write_run(tmp_path / "x.trec", {"q1": [("z", 0.5), ("a", 0.5), ("m", 0.25)]}, tag="t")
    scores = [float(line.split()[4]) for line in path.read_text().splitlines()]
    assert scores == [0.5, 0.49999997, 0.25]
    assert np.float32(scores[1]) == np.nextafter(np.float32(0.5), np.float32(0))
    assert score_run(path, {"q1": {"z": 1}}) == {"nDCG@10": 1.0, "Recall@100": 1.0}


def test_scores_apart_by_less_than_a_float32_step_keep_our_order(tmp_path):
    # RRF scores broken by a 1e-10 tie-break are one float32 value: read in single precision
    # they would tie and be re-ordered by document id ("a" before "b" before "c")
    base = 1 / 21 + 1 / 22
    ranked = [("c", base), ("b", base - 1e-10), ("a", base - 2e-10), ("d", 0.01)]
    path = write_run(tmp_path / "x.trec", {"q1": ranked}, tag="t")
    lines = path.read_text().splitlines()
    as_float32 = [np.float32(line.split()[4]) for line in lines]
    assert all(a > b for a, b in zip(as_float32, as_float32[1:]))
    assert as_float32[0] == np.float32(base) and as_float32[3] == np.float32(0.01)
    # the relevant document is third in our ranking: nDCG@10 = 1 / log2(4), not 1 (first by id)
    assert score_run(path, {"q1": {"a": 1}})["nDCG@10"] == pytest.approx(0.5, abs=1e-9)


def test_query_missing_from_run_counts_as_zero(tmp_path):
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}}
    path = write_run(tmp_path / "x.trec", {"q1": [("d1", 1.0)]}, tag="t")
    assert score_run(path, qrels) == {"nDCG@10": 0.5, "Recall@100": 0.5}


def test_per_query_scores_follow_the_judgments_order_with_zero_for_a_missing_query(tmp_path):
    qrels = {"q2": {"d2": 1}, "q1": {"d1": 1}, "q3": {"d3": 1}}
    path = write_run(tmp_path / "x.trec", {"q1": [("d9", 2.0), ("d1", 1.0)], "q2": [("d2", 1.0)], "q4": [("d4", 1.0)]}, tag="t")
    per_query = score_per_query(path, qrels)
    assert list(per_query["nDCG@10"]) == ["q2", "q1", "q3"]
    assert per_query["nDCG@10"] == pytest.approx({"q2": 1.0, "q1": 1 / math.log2(3), "q3": 0.0}, abs=1e-9)
    assert per_query["Recall@100"] == {"q2": 1.0, "q1": 1.0, "q3": 0.0}


def test_run_rejects_whitespace_in_ids_and_tag(tmp_path):
    with pytest.raises(ValueError, match="cannot hold whitespace"):
        write_run(tmp_path / "x.trec", {"q 1": [("d1", 1.0)]}, tag="t")
    assert not (tmp_path / "x.trec").exists()
    with pytest.raises(ValueError, match="run tag must be one word"):
        write_run(tmp_path / "x.trec", {}, tag="two words")


def test_the_one_standard_error_rule_keeps_what_the_queries_cannot_tell_apart():
    from llmframe_ray.eval.trec import within_one_error

    best = np.array([0.9, 0.5, 0.7, 0.6])
    tried = {
        (10,): best - np.array([0.2, 0.2, 0.2, 0.2]),  # worse on every query: same difference, no error
        (20,): best - np.array([0.1, -0.1, 0.1, -0.06]),  # mean 0.01 below, error 0.05: within it
        (30,): best,
        (40,): best.copy(),  # equal to the best: the smaller setting is the best
    }
    chosen, error, near = within_one_error(tried)
    assert chosen == (30,)
    differences = best - tried[(20,)]
    assert error == pytest.approx(differences.std(ddof=1) / 2)
    assert near == [(20,), (30,), (40,)]  # (10,) is 0.2 below with no spread: outside
    assert min(near) == (20,)
    one_query = {(1,): np.array([0.5]), (2,): np.array([0.5]), (3,): np.array([0.4])}
    assert within_one_error(one_query) == ((1,), 0.0, [(1,), (2,)])
