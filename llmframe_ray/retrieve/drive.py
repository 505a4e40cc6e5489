"""Driving a retrieval plan (retrieve/plan.py): a backend answers each step's requests, in this
thread (`run_plan`) or awaited (`run_plan_async`); each plan's time by step is observed for
/metrics (telemetry.py: llmframe_retrieval_step_seconds)."""

from __future__ import annotations

from typing import Any, Protocol, Sequence

from llmframe_ray.retrieve.plan import Encode, Plan, ReadChunks, Request, SearchGraph, SearchShard, SearchShards
from llmframe_ray.telemetry import StepClock
from llmframe_ray.types import Hit


class PlanBackend(Protocol):
    """What answers a plan's requests: `answer` takes one step's requests and returns their
    answers in order (a list in process; an awaitable of one where the answers come from
    other processes)."""

    def answer(self, requests: Sequence[Request]) -> Any: ...


class DirectCalls:
    """A backend's `answer` as one method call per request (encode / search / search_together /
    search_graph / read_chunks)."""

    def answer(self, requests: Sequence[Request]) -> list[Any]:
        return [answer_request(self, request) for request in requests]


def answer_request(backend: Any, request: Request) -> Any:
    """Send one request of a plan to the backend method that answers it."""
    if isinstance(request, Encode):
        return backend.encode(request.texts)
    if isinstance(request, SearchShard):
        return backend.search(request.shard, request.ranker, request.inputs, request.k, request.where)
    if isinstance(request, SearchShards):
        return backend.search_together(request.shards, request.ranker, request.inputs, request.k, request.where)
    if isinstance(request, SearchGraph):
        return backend.search_graph(request.queries, request.k, request.level, request.where, request.vectors)
    if isinstance(request, ReadChunks):
        return backend.read_chunks(request.shard, request.rows)
    raise TypeError(f"not a retrieval plan request: {request!r}")


def run_plan(plan: Plan, backend: PlanBackend) -> list[list[Hit]]:
    """Drive a plan with a backend that answers in this thread (its steps timed: telemetry.py)."""
    clock = StepClock()
    try:
        requests = next(plan)
        while True:
            clock.asked()
            answers = list(backend.answer(requests))
            clock.answered(_step(requests))
            requests = plan.send(answers)
    except StopIteration as done:
        clock.done()
        return done.value


async def run_plan_async(plan: Plan, backend: PlanBackend) -> list[list[Hit]]:
    """Drive a plan with a backend whose `answer` returns an awaitable."""
    clock = StepClock()
    try:
        requests = next(plan)
        while True:
            clock.asked()
            answers = list(await backend.answer(requests))
            clock.answered(_step(requests))
            requests = plan.send(answers)
    except StopIteration as done:
        clock.done()
        return done.value


_STEPS = {Encode: "encode", SearchShard: "search", SearchShards: "search", SearchGraph: "graph", ReadChunks: "read"}


def _step(requests: Sequence[Request]) -> str:
    """A plan step's name: "encode" for the step that encodes (the in-process plan asks the
    first BM25 searches with it), else by its requests' kind (searches of either ranker)."""
    if any(isinstance(request, Encode) for request in requests):
        return "encode"
    return _STEPS.get(type(requests[0]), "other") if requests else "other"
