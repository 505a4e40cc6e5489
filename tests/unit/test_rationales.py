"""Rationale sentences as reranker training data (train/rationales.py) and the optimiser's steps
of one kind each (train/reranker.py)."""

from __future__ import annotations

import json
import random

import pytest

from llmframe_ray.errors import DatasetError
from llmframe_ray.train.rationales import Rationales, load_rationales, sentence_groups
from llmframe_ray.train.reranker import Group, TrainConfig, _steps

DOCS = {
    "d1": ("Vitamin D", ("Vitamin D lowers fracture risk.", "The trial ran five years.", "Funding came from a grant.")),
    "d2": ("Bones", ("Bone density rose.", "Calcium was given too.")),
    "d3": ("Mice", ("Mice were fed fat.",)),
}


def write_folder(root, claims_lines):
    folder = root / "rationales"
    folder.mkdir(parents=True)
    (folder / "corpus_sentences.jsonl").write_text("".join(
        json.dumps({"doc_id": int(d[1:]) if d != "d3" else d, "title": t, "abstract": list(s)}) + "\n" for d, (t, s) in DOCS.items()
    ))
    (folder / "claims_train.jsonl").write_text("".join(line + "\n" for line in claims_lines))
    return root


def test_load_rationales_keeps_claims_with_evidence_and_ignores_sentences_out_of_range(tmp_path):
    root = write_folder(tmp_path, [
        json.dumps({"id": 1, "claim": "Vitamin D prevents fractures.", "evidence": {"1": [{"sentences": [0, 9], "label": "SUPPORT"}]}}),
        json.dumps({"id": 2, "claim": "No evidence here.", "evidence": {}}),
        "",
        json.dumps({"id": 3, "claim": "Fat mice.", "evidence": {"d3": [{"sentences": [0]}], "404": [{"sentences": [0]}]}}),
    ])
    loaded = load_rationales(root, "train")
    assert dict(loaded.claims) == {
        "1": ("Vitamin D prevents fractures.", frozenset({("1", 0)})),
        "3": ("Fat mice.", frozenset({("d3", 0)})),
    }
    assert loaded.documents["2"] == ("Bones", ("Bone density rose.", "Calcium was given too."))
    assert loaded.gold_sentences == 2


def test_load_rationales_names_what_is_missing_or_broken(tmp_path):
    with pytest.raises(DatasetError) as missing:
        load_rationales(tmp_path, "train")
    assert str(missing.value) == f"--rationales needs {tmp_path / 'rationales' / 'claims_train.jsonl'} (SciFact's rationales/ layout)"
    with pytest.raises(DatasetError) as split:
        load_rationales(tmp_path, "test")
    assert str(split.value) == "rationales: no claims file for split 'test' (have: train, dev)"
    root = write_folder(tmp_path / "broken", ['{"id": 1, "claim": "x"}'])
    with pytest.raises(DatasetError) as broken:
        load_rationales(root, "train")
    assert str(broken.value) == f"{root / 'rationales' / 'claims_train.jsonl'} line 1: missing evidence"
    root = write_folder(tmp_path / "notjson", ["{nope"])
    with pytest.raises(DatasetError) as not_json:
        load_rationales(root, "train")
    assert str(not_json.value).startswith(f"{root / 'rationales' / 'claims_train.jsonl'} line 1: not JSON (")


def test_one_group_per_gold_sentence_with_negatives_from_the_claims_documents():
    rationales = Rationales(
        claims={
            "q1": ("Vitamin D prevents fractures.", frozenset({("d1", 0), ("d2", 0)})),
            "q2": ("Fat mice.", frozenset({("d3", 0)})),
        },
        documents=DOCS,
    )
    config = TrainConfig(negatives=2, mining_depth=5, seed=3)
    candidates = {"q1": ["d3", "d1"], "q2": ["d3"]}
    groups = sentence_groups(rationales, ["q1", "q2", "q9"], candidates, config)
    # q2: its pool (d3's other sentences) is empty, fewer than 2 negatives: no group; q9 has no claim
    assert [(g.query_id, g.query, g.positive, g.kind) for g in groups] == [
        ("q1", "Vitamin D prevents fractures.", "Vitamin D\nVitamin D lowers fracture risk.", "sentence"),
        ("q1", "Vitamin D prevents fractures.", "Bones\nBone density rose.", "sentence"),
    ]
    pool = {"Mice\nMice were fed fat.", "Vitamin D\nThe trial ran five years.", "Vitamin D\nFunding came from a grant.",
            "Bones\nCalcium was given too."}  # the top documents and the cited one, minus the gold sentences
    for group in groups:
        assert len(group.negatives) == 2 and set(group.negatives) <= pool
    assert sentence_groups(rationales, ["q1", "q2"], candidates, config) == groups  # seeded
    # documents below the pool's depth (5) are not drawn from
    deep = sentence_groups(rationales, ["q1"], {"q1": ["x1", "x2", "x3", "x4", "x5", "d3"]}, config)
    assert all("Mice\nMice were fed fat." not in g.negatives for g in deep)


def test_an_optimiser_step_holds_one_kind_of_group():
    groups = [Group(str(i), "q", "p", ("n",), kind="sentence" if i % 3 == 0 else "passage") for i in range(10)]
    steps = _steps(groups, ["passage", "sentence"], 3, random.Random(5))
    assert sorted(i for step in steps for i in step) == list(range(10))
    assert all(len({groups[i].kind for i in step}) == 1 for step in steps)
    assert sorted(len(step) for step in steps) == [1, 3, 3, 3]  # 6 passage groups (3 + 3), 4 sentence groups (3 + 1)
    # one kind: the shuffled order cut into steps, as before there were kinds
    plain = [Group(str(i), "q", "p", ("n",)) for i in range(7)]
    order = list(range(7))
    random.Random(5).shuffle(order)
    assert _steps(plain, ["passage"], 3, random.Random(5)) == [order[0:3], order[3:6], order[6:7]]
