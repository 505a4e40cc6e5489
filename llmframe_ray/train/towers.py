"""Export a trained reranker's two towers (models/two_tower.py says why and how they score).

`train-reranker` writes them with every model; a folder trained before gets them with

    python -m llmframe_ray.train.towers M [M2 ...]

which reads the model's weights back from its model.onnx (train/warm_start.py), exports the
tower (fp32 and dynamic int8, quantised like the pair model) and the head, and replaces any
towers already there only once the new files are complete.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from llmframe_ray.errors import LLMFrameError, ModelError
from llmframe_ray.models.export import export_graph, quantize_int8
from llmframe_ray.models.two_tower import TOWER_CARD, TOWER_FILES, TOWER_FORMAT, TOWER_OUTPUT, file_sha256


def tower_module(model):
    """The reranker `model` (mean_pool_classifier) reading one text per row as its first
    segment: the row's final states mean-pooled, of unit length (output `vector`)."""
    import torch

    class Tower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            first, _ = self.inner.segments(input_ids, attention_mask, torch.zeros_like(token_type_ids))
            return type("TowerOutput", (), {TOWER_OUTPUT: first})()

    return Tower()


def tower_head(model) -> tuple[list[float], float]:
    """(weights, bias): the model's logit with its gates shut is sum_i weights_i q_i p_i + bias."""
    scale = float(model.scale.detach())
    interaction = model.head["interaction"]
    weights = (interaction.weight.detach()[0] + scale).tolist()
    return [float(w) for w in weights], float(interaction.bias.detach()[0])


# A pair of `max_length` tokens left its passage that many less the query's: the median SciFact
# train claim takes 21 with its [CLS] and [SEP]. A tower reads a text alone, up to the pair's
# length less QUERY_ROOM: on the 81 held-out train claims (int8, depth 25, score fusion) 176 of
# 192 tokens gave 0.7345, 192 gave 0.7257 and 256 0.7252 (the pair model: 0.7342; README).
QUERY_ROOM = 16


def write_towers(model, folder: Path, max_length: int, made_from: Path | None = None) -> None:
    """Write the towers of `model`, trained on pairs of `max_length` tokens, into `folder`;
    `made_from`: the model.onnx exported from the same weights (default: the one in `folder`)."""
    folder = Path(folder)
    export_graph(tower_module(model), folder / TOWER_FILES["fp32"], TOWER_OUTPUT)
    quantize_int8(folder / TOWER_FILES["fp32"], folder / TOWER_FILES["int8"])
    weights, bias = tower_head(model)
    card = {
        "format": TOWER_FORMAT,
        "weights": weights,
        "bias": bias,
        "max_length": max(8, max_length - QUERY_ROOM),
        "pooling": "mean of the text's final states, unit length",
        "made_from_sha256": file_sha256(made_from or folder / "model.onnx"),
        "layers": list(model.kept_layers),
    }
    (folder / TOWER_CARD).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")


def add_towers(folder: Path) -> Path:
    """Export the towers of the reranker trained into `folder` (its model.onnx and card)."""
    from llmframe_ray.models.cross_encoder import read_card
    from llmframe_ray.models.export import bundled_minilm_path
    from llmframe_ray.train.reranker import mean_pool_classifier, pair_tokenizer
    from llmframe_ray.train.warm_start import init_layers, load_weights

    folder = Path(folder)
    card = read_card(folder)
    if not isinstance(card.get("layers"), list) or not (folder / "model.onnx").is_file():
        raise ModelError(f"{folder} is not a reranker made by train-reranker (it needs model.onnx and a card with "
                         "its layers): its towers are made from its weights")
    layers = init_layers(folder)
    max_length = int(read_card(folder).get("max_length", 192))
    source = bundled_minilm_path()
    model = mean_pool_classifier(source, layers=layers)
    tokenizer = pair_tokenizer(source, max_length)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    load_weights(model, folder, tokenizer)
    model.eval()
    with tempfile.TemporaryDirectory(dir=folder, prefix=".towers-") as tmp:
        staging = Path(tmp)
        write_towers(model, staging, max_length, made_from=folder / "model.onnx")
        for name in (*TOWER_FILES.values(), TOWER_CARD):  # the card last: it marks them complete
            os.replace(staging / name, folder / name)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="reranker folders made by train-reranker")
    args = parser.parse_args(argv)
    for folder in args.folders:
        try:
            add_towers(folder)
        except LLMFrameError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{folder}: {', '.join((*TOWER_FILES.values(), TOWER_CARD))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
