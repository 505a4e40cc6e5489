"""Ray Job entry point for ingestion; takes the same arguments as `llmframe-ray ingest`.

    ray job submit --working-dir . -- python jobs/ingest.py SOURCE... --index DIR [--shards S]
"""

import sys

from llmframe_ray.cli import main

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "ingest", *sys.argv[1:]]
    main()
