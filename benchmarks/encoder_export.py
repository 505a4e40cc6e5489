"""The sentence encoder's two ONNX traces, side by side: transformers' default attention (SDPA)
and the eager attention that `models/export.py` exports (ENCODER_ATTENTION).

    .venv/bin/python benchmarks/encoder_export.py [--repeats 5] [--threads N] [--tokens 32,64,128,256]

Both graphs are traced here, into a temporary folder, from the bundled all-MiniLM-L6-v2 (torch
is needed, as for any export). For each: its node count (and the `Where` / `IsNaN` nodes of
the SDPA trace's padding mask), one query at a time (p50 ms over SciFact's test queries when
../shared/eval/scifact is there, else sentences of this file), and batches of 32 chunks of
about N tokens (chunks/s; texts cut from the same collection's documents, or repeated
sentences); and the largest difference between the two traces' embeddings (mean-pooled and
normalised, as the embedder returns them) on the same inputs. Runs alternate between the two
graphs; each figure is the median over `--repeats`.
ONNX Runtime's defaults but `--threads` intra-op threads (default: every core), plain sessions
over the two files (the embedder adds prepacked weights, the same for both); prints the CPU,
its SIMD flags and the core count.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402

from llmframe_ray.models.export import ENCODER_ATTENTION, bundled_minilm_path, export_graph  # noqa: E402
from serve import cpu_description  # noqa: E402  (benchmarks/, this script's folder)

FALLBACK = (
    "Hybrid retrieval fuses a sparse and a dense ranking of the same documents. "
    "The cross-encoder reads the query and the passage together and scores the pair. "
    "Chunks are embedded in batches of similar length so that little padding is computed. "
)


def texts_from_collection() -> tuple[list[str], list[str]]:
    """(queries, document texts): SciFact's test queries and documents, else this file's text."""
    folder = ROOT.parent / "shared" / "eval" / "scifact"
    if (folder / "corpus.jsonl").is_file():
        from llmframe_ray.eval.beir import load_beir

        dataset = load_beir(folder)
        return list(dataset.queries.values())[:300], [d.text for d in dataset.corpus[:4000]]
    sentences = [s.strip() + "." for s in FALLBACK.split(".") if s.strip()]
    return sentences * 50, [FALLBACK * 20] * 400


def trace(attention: str, path: Path) -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(bundled_minilm_path()), attn_implementation=attention)
    export_graph(model, path, "last_hidden_state")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tokens", default="32,64,128,256", help="chunk lengths to time in batches of 32")
    args = parser.parse_args()
    import onnx
    import onnxruntime as ort
    from tokenizers import Tokenizer

    lengths = [int(t) for t in args.tokens.split(",") if t.strip()]
    queries, documents = texts_from_collection()
    tokenizer = Tokenizer.from_file(str(bundled_minilm_path() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(256)

    def feeds(texts: list[str], width: int | None = None) -> dict[str, np.ndarray]:
        encoded = tokenizer.encode_batch(texts)
        if width is not None:  # the first `width` tokens of each longer text, [SEP] kept last
            ids = [e.ids[: width - 1] + [e.ids[-1]] if len(e.ids) > width else e.ids for e in encoded]
        else:
            ids = [e.ids for e in encoded]
        longest = max(len(i) for i in ids)
        padded = np.array([i + [0] * (longest - len(i)) for i in ids], dtype=np.int64)
        mask = np.array([[1] * len(i) + [0] * (longest - len(i)) for i in ids], dtype=np.int64)
        return {"input_ids": padded, "attention_mask": mask, "token_type_ids": np.zeros_like(padded)}

    one = [feeds([q]) for q in queries]
    batches = {n: [feeds(documents[i : i + 32], n) for i in range(0, 256, 32)] for n in lengths}

    with tempfile.TemporaryDirectory(prefix="llmframe-encoder-export-") as tmp:
        sessions, ops = {}, {}
        for attention in ("sdpa", ENCODER_ATTENTION):
            path = Path(tmp) / f"{attention}.onnx"
            trace(attention, path)
            ops[attention] = collections.Counter(node.op_type for node in onnx.load(str(path)).graph.node)
            options = ort.SessionOptions()
            options.intra_op_num_threads = args.threads
            sessions[attention] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        names = list(sessions)

        def vectors(name: str, f: dict[str, np.ndarray]) -> np.ndarray:  # mean pooling + L2, as the embedder
            mask = f["attention_mask"][:, :, None].astype(np.float32)
            pooled = (sessions[name].run(None, f)[0] * mask).sum(axis=1) / mask.sum(axis=1)
            return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

        diff = max(float(np.abs(vectors(names[0], f) - vectors(names[1], f)).max()) for f in one[:100] + batches[lengths[-1]][:2])
        latency = {n: [] for n in names}
        rates = {(n, t): [] for n in names for t in lengths}
        for f in one[:20] + [b[0] for b in batches.values()]:  # first runs of each shape
            for session in sessions.values():
                session.run(None, f)
        for repeat in range(args.repeats):
            for name in names if repeat % 2 == 0 else names[::-1]:
                session = sessions[name]
                times = []
                for f in one:
                    start = time.perf_counter()
                    session.run(None, f)
                    times.append(time.perf_counter() - start)
                latency[name].append(statistics.median(times) * 1e3)
                for t in lengths:
                    start = time.perf_counter()
                    for f in batches[t]:
                        session.run(None, f)
                    rates[name, t].append(256 / (time.perf_counter() - start))

    med = statistics.median
    print(f"machine: {cpu_description()}, {os.cpu_count()} cores; ONNX Runtime {ort.__version__}, "
          f"{args.threads} intra-op threads; {len(one)} queries, 256 chunks per length; median of {args.repeats}")
    print(f"largest |difference| between the traces' embeddings (pooled, normalised; queries and {lengths[-1]}-token batches): {diff:.2e}")
    print()
    header = ["trace", "nodes", "Where / IsNaN", "query p50 ms", *[f"{t}-token chunks/s" for t in lengths]]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in names:
        cells = [name, str(sum(ops[name].values())), f"{ops[name]['Where']} / {ops[name]['IsNaN']}",
                 f"{med(latency[name]):.2f}", *[f"{med(rates[name, t]):.1f}" for t in lengths]]
        print("| " + " | ".join(cells) + " |")
    base, ours = names
    ratios = [f"{t} tokens {med(rates[ours, t]) / med(rates[base, t]):.2f}x" for t in lengths]
    print(f"\n{ours} / {base}: query p50 {med(latency[ours]) / med(latency[base]):.2f}x; chunks/s " + ", ".join(ratios))


if __name__ == "__main__":
    main()
