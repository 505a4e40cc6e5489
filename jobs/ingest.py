"""Ray Job entry point for ingestion; takes the same arguments as `llmframe-ray ingest`.

    ray job submit --working-dir . -- python jobs/ingest.py SOURCE... --index DIR [--shards S]

The repository root (the job's working directory) is put on the import path, so the package
does not have to be installed on the cluster; Ray adds the working directory to the workers'
path itself.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmframe_ray.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "ingest", *sys.argv[1:]]
    main()
