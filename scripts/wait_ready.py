"""Wait until a llmframe-ray app answers /readyz, then print ready-to-paste curl commands.

Used by `make run`: `python scripts/wait_ready.py --pid PID --url URL --key-file FILE`.
Exits 1 when the server process `PID` ends or `--timeout` seconds pass first.
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--query", default="how do I parse a JSON document into Python objects")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout
    while not ready(args.url):
        if not alive(args.pid):
            print("error: the server exited before it was ready", file=sys.stderr)
            return 1
        if time.monotonic() > deadline:
            print(f"error: {args.url}/readyz not ready after {args.timeout:.0f} s", file=sys.stderr)
            return 1
        time.sleep(1)
    with open(args.key_file, encoding="utf-8") as handle:
        key = handle.read().strip()
    search = json.dumps({"query": args.query, "top_k": 3})
    answer = json.dumps({"question": args.query, "stream": True})
    print(f"\nllmframe-ray is serving at {args.url} (OpenAPI docs: {args.url}/docs; metrics: {args.url}/metrics).")
    print(f"Playground: open {args.url}/ in a browser and paste the key {key}. Or try:\n")
    print(f"  curl -s {args.url}/v1/search -H 'X-API-Key: {key}' -H 'Content-Type: application/json' -d '{search}'\n")
    print(f"  curl -sN {args.url}/v1/query -H 'X-API-Key: {key}' -H 'Content-Type: application/json' -d '{answer}'\n")
    doc = json.dumps({"documents": [{"id": "my-note", "text": "A note of your own, searchable once its job is published.", "metadata": {"team": "docs"}}]})
    print(f"  curl -s {args.url}/v1/documents -H 'X-API-Key: {key}' -H 'Content-Type: application/json' -d '{doc}'")
    print(f"  curl -s {args.url}/v1/documents -H 'X-API-Key: {key}' -F file=@README.md   # then GET the status_url it answers\n")
    print("Stop with Ctrl-C.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
