"""Training that starts from a trained reranker (`train-reranker --init M`) instead of MiniLM.

A model folder holds ONNX files, not PyTorch weights, so the weights go back the way they came:
the export keeps some parameters under their own names, stores others transposed under names of
its own (`onnx::MatMul_1011`) and turns each layer's gates into constants. Which parameter became
which initialiser is found by exporting the same module once with every parameter set to
distinct random values and matching those values (as they are, transposed, or as one row of
the gates); the folder's initialiser at the same input of the same node of its graph then goes
back into that parameter. Parameters that the graph does not use (MiniLM's pooler) keep their
values. A file whose graph is not this module's is refused, and so is one whose loaded module
does not score like ONNX Runtime on the same file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from llmframe_ray.errors import ModelError
from llmframe_ray.models.cross_encoder import ONNX_FILES, CrossEncoder, Precision, read_card
from llmframe_ray.models.export import export_graph

PARITY_PAIRS = (
    ("how does aspirin affect heart attacks", "Daily aspirin lowered the rate of myocardial infarction in a trial."),
    ("lift of a wing in a propeller slipstream", "An experimental study of a wing in a propeller slipstream."),
)
PARITY_TOLERANCE = 1e-3  # logits are about 10-20; the two runtimes agree to ~1e-5 on one file


def init_layers(folder: Path) -> int:
    """How many encoder layers the reranker in `folder` kept (its card's `layers`)."""
    card = read_card(folder)
    if not isinstance(card.get("layers"), list) or not (Path(folder) / ONNX_FILES["fp32"]).is_file():
        raise ModelError(
            f"{folder} is not a reranker made by train-reranker (it needs {ONNX_FILES['fp32']} and a card "
            "with its layers): --init starts from such a folder"
        )
    return len(card["layers"])


def load_weights(model, folder: Path, tokenizer) -> list[str]:
    """Put the fp32 weights of the reranker in `folder` into `model` (built by
    `mean_pool_classifier` with as many layers); returns the parameters the graph does not use."""
    import onnx
    import torch
    from onnx import numpy_helper

    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    with tempfile.TemporaryDirectory() as tmp:
        export_graph(model, Path(tmp) / "probe.onnx", "logits")
        probe_graph = onnx.load(str(Path(tmp) / "probe.onnx")).graph
    marked = {name: p.detach().numpy().copy() for name, p in model.named_parameters()}
    trained_graph = onnx.load(str(Path(folder) / ONNX_FILES["fp32"])).graph
    probe = {t.name: numpy_helper.to_array(t) for t in probe_graph.initializer}
    trained = {t.name: numpy_helper.to_array(t) for t in trained_graph.initializer}
    target = {name: np.full(value.shape, np.nan, dtype=np.float32) for name, value in marked.items()}
    for name, own in _same_inputs(probe_graph, trained_graph, set(probe), set(trained), folder).items():
        if trained[own].shape != probe[name].shape:
            raise ModelError(f"{folder}: its weight {own} is {trained[own].shape}, where this model has {probe[name].shape}")
        _place(name, probe[name], trained[own], marked, target)
    partly = [name for name, value in target.items() if np.isnan(value).any() and not np.isnan(value).all()]
    if partly:
        raise ModelError(f"{folder}: the ONNX file gives only part of {', '.join(partly)}")
    unused = [name for name, value in target.items() if np.isnan(value).all()]
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(original[name] if name in unused else torch.from_numpy(target[name]))
    _check_parity(model, folder, tokenizer)
    return unused


def _same_inputs(probe, trained, probe_names: set, trained_names: set, folder: Path) -> dict[str, str]:
    """Which initialiser of the trained graph each of the probe's is: the two graphs have the
    same nodes in the same order, so the names at the same input of the same node pair up (the
    export may have merged equal initialisers of the trained model into one, e.g. gates that
    training left equal, which it then reads through Identity nodes; and names need not match)."""

    def aliases(graph, names: set) -> tuple[list, dict[str, str]]:
        merged = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Identity" and n.input[0] in names}
        return [n for n in graph.node if n.output[0] not in merged], merged

    ours_nodes, _ = aliases(probe, probe_names)
    their_nodes, merged = aliases(trained, trained_names)
    if [n.op_type for n in ours_nodes] != [n.op_type for n in their_nodes]:
        raise ModelError(
            f"{folder}/{ONNX_FILES['fp32']} was not exported from this model (its graph has {len(their_nodes)} "
            f"nodes of other kinds or order, this model's {len(ours_nodes)}); retrain it, or train without --init"
        )
    pairs: dict[str, str] = {}
    for ours, theirs in zip(ours_nodes, their_nodes):
        for name, own in zip(ours.input, theirs.input):
            own = merged.get(own, own)
            if name in probe_names and (own not in trained_names or pairs.setdefault(name, own) != own):
                raise ModelError(f"{folder}: the weight {name} of this model has no single counterpart in its file")
    missing = probe_names - set(pairs)
    if missing:
        raise ModelError(f"{folder}: {len(missing)} weights of this model are not read by any node")
    return pairs


def _place(name: str, probe: np.ndarray, value: np.ndarray, marked: dict, target: dict) -> None:
    """Write the trained initialiser `value` where its probe values came from."""
    own = name.removeprefix("inner.")
    if own in marked and marked[own].shape == probe.shape and np.array_equal(marked[own], probe):
        target[own][...] = value
        return
    for param, values in marked.items():
        if values.ndim == 2 and values.T.shape == probe.shape and np.array_equal(values.T, probe):
            target[param][...] = value.T
            return
        if values.ndim == 3 and probe.size == values.shape[-1]:  # one (direction, layer) row of the gates
            rows = np.flatnonzero((values.reshape(-1, values.shape[-1]) == probe.reshape(-1)).all(axis=1))
            if len(rows) == 1:
                target[param][np.unravel_index(rows[0], values.shape[:-1])] = value.reshape(-1)
                return
    raise ModelError(f"no parameter of the model gives the ONNX initialiser {name} {tuple(probe.shape)}")


def _check_parity(model, folder: Path, tokenizer, pairs: Sequence[tuple[str, str]] = PARITY_PAIRS) -> None:
    expected = CrossEncoder(folder, precision=Precision.FP32, threads=1).score_pairs(list(pairs))
    got = torch_scores(model, tokenizer, pairs)
    worst = float(np.abs(np.asarray(expected) - got).max())
    if worst > PARITY_TOLERANCE:
        raise ModelError(f"{folder}: the weights loaded back score {worst:.4g} away from the ONNX file; not used")


def torch_scores(model, tokenizer, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """Scores of `pairs` from the PyTorch model (in eval mode; the ONNX parity checks)."""
    import torch

    was_training = model.training
    model.eval()
    enc = tokenizer.encode_batch(list(pairs))
    try:
        with torch.no_grad():
            logits = model(
                input_ids=torch.tensor([e.ids for e in enc]),
                attention_mask=torch.tensor([e.attention_mask for e in enc]),
                token_type_ids=torch.tensor([e.type_ids for e in enc]),
            ).logits
    finally:
        model.train(was_training)
    return logits[:, 0].numpy()
