"""A tiny judged collection and the settings to train rerankers on it: shared by the reranker
training tests (each module makes its own fixtures from these)."""

import json
from pathlib import Path

from llmframe_ray.config import load_settings
from llmframe_ray.train.reranker import TrainConfig
from llmframe_ray.train.run import train_reranker

TOPICS = {
    "bread": "Sourdough bread rises because wild yeast ferments the dough.",
    "tides": "Ocean tides follow the gravitational pull of the Moon.",
    "lava": "Shield volcanoes erupt runny basaltic lava.",
    "bikes": "Cycling to work improves cardiovascular fitness.",
    "ice": "Glaciers flow slowly under their own weight.",
    "bees": "Honey bees communicate the direction of flowers by dancing.",
    "stars": "Stars fuse hydrogen into helium in their cores.",
    "rust": "Iron rusts when it reacts with oxygen and water.",
}
QUESTIONS = {
    "q1": ("what makes sourdough rise", "bread"),
    "q2": ("why do tides happen", "tides"),
    "q3": ("how do volcanoes erupt", "lava"),
    "q4": ("health benefits of cycling", "bikes"),
    "q5": ("how do glaciers move", "ice"),
    "q6": ("how do bees share where flowers are", "bees"),
}


CONFIG = TrainConfig(
    epochs=1, seed=7, negatives=2, mining_depth=5, groups_per_step=2, max_length=48,
    validation_fraction=0.34, threads=2, max_steps=2,
)


def write_tiny_beir(parent: Path) -> Path:
    """The collection in `parent`/tiny-beir: its name, which error messages show, does not depend
    on how many temporary folders other tests made first."""
    root = parent / "tiny-beir"
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": k, "title": k.title(), "text": v}) + "\n" for k, v in TOPICS.items())
    )
    (root / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, (t, _) in QUESTIONS.items())
    )
    lines = "".join(f"{q}\t{d}\t1\n" for q, (_, d) in QUESTIONS.items())
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + lines)
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tbread\t1\n")
    return root


def tiny_settings(home: Path, model_dir: Path):
    (home / "models").mkdir()
    (home / "models" / model_dir.name).symlink_to(model_dir)
    return load_settings(home=home, num_threads=2)


def train_params(settings):
    params = settings.params()
    return {
        "embedder": params.embedder, "index": params.index, "indexes_dir": params.indexes_dir,
        "retrieval": params.retrieval, "rerank_rrf_k": params.rerank.rrf_k,
    }


def train_tiny(dataset_dir: Path, settings, out: Path) -> tuple[Path, dict]:
    """The `trained` fixture's model: CONFIG on the tiny collection."""
    return out, train_reranker(dataset_dir, "train", out, CONFIG, lambda line: None, **train_params(settings))
