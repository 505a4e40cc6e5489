"""Documents through `POST /v1/documents` against `llmframe-ray ingest`, on the same documents.

    .venv/bin/python benchmarks/documents.py [--docs 1000] [--batch 100] [--shards 2] [--probes 3]

Takes the first `--docs` SciFact documents (../shared/eval/scifact/corpus.jsonl) and, in one run:
  - cli:  `llmframe-ray ingest` of those documents (one JSON Lines file) into a fresh index:
          wall time of the command, Ray start included, as a user runs it;
  - http: `llmframe-ray serve` on a fresh index of 20 other SciFact documents, then the same
          documents as POSTs of `--batch` JSON documents each, sent one after another; time from
          the first POST to the moment every job is published (the Writer batches what
          arrived while it worked), and the 202 latency of the POSTs;
  - searchable: `--probes` times, one new document with a phrase no other holds is POSTed and
          the time from its 202 to the first search that finds it is measured (the Writer's
          batch wait, the ingestion run, and the Retriever's index watch: LLMFRAME_WRITER_BATCH_WAIT_S,
          LLMFRAME_INDEX_WATCH_INTERVAL_S).
Prints one table (median of the probes), the machine's CPU and cores. The server is stopped by
its pid at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.serve import cpu_description  # noqa: E402

KEY = "bench-documents-key-0123"
CLI = str(Path(sys.executable).with_name("llmframe-ray"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scifact_docs(dataset: Path, start: int, n: int) -> list[dict]:
    out = []
    with (dataset / "corpus.jsonl").open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < start:
                continue
            if len(out) == n:
                break
            record = json.loads(line)
            out.append({"id": str(record["_id"]), "title": record.get("title") or "", "text": record["text"] or "(empty)"})
    return out


def write_jsonl(path: Path, docs: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"_id": d["id"], "title": d["title"], "text": d["text"]}) + "\n")


def wait_jobs(client: httpx.Client, urls: list[str], timeout_s: float = 3600) -> list[dict]:
    deadline, done = time.monotonic() + timeout_s, {}
    while len(done) < len(urls):
        if time.monotonic() > deadline:
            raise RuntimeError(f"jobs not finished after {timeout_s} s")
        for url in urls:
            if url not in done:
                job = client.get(url, headers={"X-API-Key": KEY}).json()
                if job["status"] in ("published", "failed"):
                    done[url] = job
        time.sleep(0.2)
    return [done[u] for u in urls]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", type=Path, default=ROOT.parent / "shared" / "eval" / "scifact")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--probes", type=int, default=3)
    args = parser.parse_args()
    docs = scifact_docs(args.dataset, 0, args.docs)
    seed = scifact_docs(args.dataset, args.docs, 20)
    work = Path(tempfile.mkdtemp(prefix="bench-documents-"))
    env = {**os.environ, "API_SECRET_KEY": KEY}

    corpus = work / "docs.jsonl"
    write_jsonl(corpus, docs)
    clock = time.perf_counter()
    subprocess.run([CLI, "ingest", str(corpus), "--index", str(work / "cli-index"), "--shards", str(args.shards)],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cli_s = time.perf_counter() - clock

    write_jsonl(work / "seed.jsonl", seed)
    subprocess.run([CLI, "ingest", str(work / "seed.jsonl"), "--index", str(work / "http-index"), "--shards", str(args.shards)],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = free_port()
    server = subprocess.Popen([CLI, "serve", "--index", str(work / "http-index"), "--port", str(port)], env=env,
                              stdout=open(work / "serve.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=120) as client:
            deadline = time.monotonic() + 600
            while True:
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError(f"the server did not start; see {work / 'serve.log'}")
                time.sleep(1)
            auth = {"X-API-Key": KEY}
            clock, accept_ms, urls = time.perf_counter(), [], []
            for start in range(0, len(docs), args.batch):
                sent = time.perf_counter()
                response = client.post("/v1/documents", headers=auth, json={"documents": docs[start : start + args.batch]})
                response.raise_for_status()
                accept_ms.append((time.perf_counter() - sent) * 1000)
                urls.append(response.json()["status_url"])
            jobs = wait_jobs(client, urls)
            http_s = time.perf_counter() - clock
            failed = sum(r["status"] == "failed" for j in jobs for r in j["report"])
            runs = len({j["version"] for j in jobs})
            searchable = []
            for n in range(args.probes):
                phrase = f"zqxprobe{n}word quokkabench{n}"
                sent = time.perf_counter()
                response = client.post("/v1/documents", headers=auth, json={"documents": [{"id": f"probe-{n}", "text": f"A probe: {phrase}."}]})
                response.raise_for_status()
                while True:
                    hits = client.post("/v1/search", headers=auth, json={"query": phrase, "mode": "bm25", "top_k": 1}).json()["hits"]
                    if hits and hits[0]["doc_id"] == f"probe-{n}":
                        break
                    time.sleep(0.1)
                searchable.append(time.perf_counter() - sent)
    finally:
        server.send_signal(signal.SIGTERM)  # the server stops its Ray and HAProxy in order
        server.wait(timeout=180)

    print(f"machine: {cpu_description()}, {os.cpu_count()} cores; {args.docs} SciFact documents, {args.shards} shards")
    print("| path | documents | seconds | documents/s | notes |")
    print("|---|---|---|---|---|")
    print(f"| `llmframe-ray ingest` (one JSONL file) | {args.docs} | {cli_s:.1f} | {args.docs / cli_s:.1f} | new index; Ray start included |")
    print(f"| `POST /v1/documents`, batches of {args.batch} | {args.docs} | {http_s:.1f} | {args.docs / http_s:.1f} | "
          f"{len(urls)} requests applied in {runs} run(s); 202 in {statistics.median(accept_ms):.0f} ms median; {failed} failed |")
    print(f"| 202 -> searchable, one document | 1 | {statistics.median(searchable):.1f} | - | "
          f"median of {len(searchable)} ({', '.join(f'{s:.1f}' for s in searchable)} s) |")


if __name__ == "__main__":
    main()
