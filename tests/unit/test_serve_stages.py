"""ServeStages without a cluster: what a caller sees when a stage is lost or not ready."""

import asyncio
import logging

import pytest

ingress = pytest.importorskip("llmframe_ray.serve.ingress")
from ray.exceptions import RayActorError  # noqa: E402

from llmframe_ray.api.failures import StageTimeoutError, StageUnavailableError  # noqa: E402

SECRET = "actor 9f3c at 10.1.2.3:41234 died: SIGKILL"


def test_a_lost_stage_is_a_503_without_ray_internals(caplog):
    calls = []

    async def send():
        calls.append(1)
        raise RayActorError(error_msg=SECRET)

    stages = ingress.ServeStages(None, None, None, None, {}, {})
    with caplog.at_level(logging.ERROR), pytest.raises(StageUnavailableError) as caught:
        asyncio.run(stages._call("reranker", send))
    assert str(caught.value) == "the reranker stage is unavailable; retry shortly"
    assert len(calls) == ingress.ATTEMPTS
    assert SECRET in caplog.text  # the operator still sees it


def test_readiness_says_not_ready_without_the_exception_text(caplog):
    class Down:
        class ready:
            @staticmethod
            def remote():
                async def fail():
                    raise RuntimeError(SECRET)
                return fail()

    class Up:
        class ready:
            @staticmethod
            def remote():
                async def ok():
                    return "ready"
                return ok()

    stages = ingress.ServeStages(None, None, None, None, {"Reranker": Down(), "Generator": Up()}, {})
    with caplog.at_level(logging.WARNING):
        states = asyncio.run(stages.readiness())
    assert states == {"Reranker": "not ready", "Generator": "ready"}
    assert SECRET in caplog.text


def test_a_stage_that_does_not_answer_in_time_is_cancelled():
    cancelled = []

    async def hang():
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    stages = ingress.ServeStages(None, None, None, None, {}, {}, timeout_s=0.05)
    with pytest.raises(StageTimeoutError) as caught:
        asyncio.run(stages._call("retriever", hang))
    assert str(caught.value) == "the retriever stage did not answer within 0.05 s (LLMFRAME_STAGE_TIMEOUT_S)"
    assert cancelled == [True]


def test_a_full_queue_is_a_503_that_says_overloaded():
    from ray.serve.exceptions import BackPressureError

    async def refuse():
        raise BackPressureError(num_queued_requests=512, max_queued_requests=512)

    stages = ingress.ServeStages(None, None, None, None, {}, {})
    with pytest.raises(StageUnavailableError) as caught:
        asyncio.run(stages._call("reranker", refuse))
    assert str(caught.value) == "the reranker stage is overloaded; retry shortly"
