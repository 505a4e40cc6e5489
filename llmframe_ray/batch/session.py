"""Connect to Ray for this package's Ray commands (the ingestion job, `llmframe-ray serve`)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def ray_session(local_cpus: int) -> Iterator[None]:
    """Connect to RAY_ADDRESS, or start a local Ray with `local_cpus` CPUs; stop what we start."""
    import ray

    # Ray Data's usage collection starts a driver thread ("data-usage-metrics-poller") on the
    # first dataset run that polls the cluster every 10 s and never stops. A poll that lands
    # while ray.shutdown() runs reaches the shut-down core worker, which ends the whole process
    # with status 1 (seen in CI: a pytest run died silently after the ingestion tests). The
    # collector is for Ray's own usage statistics; it stays off unless the user sets it to 0.
    os.environ.setdefault("RAY_DATA_USAGE_DISABLED", "1")

    if ray.is_initialized():
        yield
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        # address="local": always a new local Ray, never one some other process left running
        ray.init(address="local", num_cpus=local_cpus, include_dashboard=False, log_to_driver=True)
    try:
        yield
    finally:
        ray.shutdown()
