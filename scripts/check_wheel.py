"""Check an installed llmframe-ray (the release workflow's packaging test, and
tests/integration/test_packaging.py): the command runs, the package data is installed, and a
small ingest + search works, all from the environment of the given `llmframe-ray` executable.

    python scripts/check_wheel.py --cli /tmp/clean/bin/llmframe-ray
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def run(*args: str) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=600)
    if done.returncode not in (0,):
        sys.exit(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cli", type=Path, required=True)
    args = parser.parse_args()
    cli = str(args.cli)
    python = str(args.cli.with_name("python"))
    print(run(cli, "--version").strip())
    run(cli, "--help")
    where = json.loads(run(python, "-c", (
        "import json, llmframe_ray, pathlib; root = pathlib.Path(llmframe_ray.__file__).parent; "
        "print(json.dumps({'root': str(root), 'typed': (root / 'py.typed').is_file(), "
        "'page': (root / 'api' / 'static' / 'index.html').is_file()}))"
    )))
    if not (where["typed"] and where["page"]):
        sys.exit(f"package data missing in {where['root']}: {where}")
    with tempfile.TemporaryDirectory() as tmp:
        run(cli, "index", "sample", f"{tmp}/docs")
        run(cli, "index", "build", f"{tmp}/docs", "--index", f"{tmp}/index")
        found = run(cli, "search", "bisect insertion point", "--index", f"{tmp}/index", "--mode", "bm25", "--top-k", "1")
    if "1. bisect.md" not in found:
        sys.exit(f"search found nothing:\n{found}")
    print(f"installed at {where['root']}: command, package data, index build and search work")


if __name__ == "__main__":
    main()
