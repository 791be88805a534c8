"""Serve the chat workload over real HTTP, through a router process or through ``ServingPool``.

The driver plays the RL side: steps are released by the same rule as the virtual-time cluster
(step ``s`` once steps ``0..s-K`` have finished), each rollout holds an admission slot for its whole
life, and between turns it waits for its tool, all in simulated seconds × ``time_scale``. Through a
router the slot is the rollout side's own cap (a FIFO semaphore, as trainers cap concurrency in
front of a router); through the pool it is the pool's admission controller. Both send the same
request body. What the replicas counted comes from their ``/metrics`` before and after the run.
Against real vLLM replicas (``forced=True``) the model's words are its own, so each turn asks for
exactly its planned length with ``ignore_eos``; the replica that answered is then known only to the
pool, and a router row's stay share is not measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from routing_lab.chat import ChatRollout
from terminus_env.serving.client import KEEPALIVE_EXPIRY_S, ContextLengthExceeded, ReplicaClient
from terminus_env.serving.pool import ServingPool
from terminus_env.serving.sim.server import REPLICA_HEADER

_TIMEOUT_S = 3600.0
_LAG_SERIES = "terminus_sim:max_lag_seconds{"


@dataclass(frozen=True)
class Turn:
    text: str
    prompt_tokens: int
    completion_tokens: int
    replica: str  # host:port of the replica that answered


class Endpoint(Protocol):
    def session(self, rollout: ChatRollout) -> contextlib.AbstractAsyncContextManager[None]: ...

    async def chat(self, rollout: ChatRollout, turn: int, messages: list[dict]) -> Turn: ...


class RouterEndpoint:
    """A router process: the session id in the router's session header, a FIFO cap on the rollout side, and,
    where the router takes it, word that a session ended when its rollout does."""

    def __init__(self, url: str, session_header: str, model: str, limit: int, forced: bool = False,
                 finish_sessions: bool = False, extra: dict | None = None) -> None:
        limits = httpx.Limits(max_connections=None, keepalive_expiry=KEEPALIVE_EXPIRY_S)
        self._http = httpx.AsyncClient(base_url=url, timeout=_TIMEOUT_S, limits=limits)
        self._header = session_header
        self._model = model
        self._slots = asyncio.Semaphore(limit)
        self._forced = forced
        self._finish_sessions = finish_sessions
        self._extra = extra or {}

    @contextlib.asynccontextmanager
    async def session(self, rollout: ChatRollout) -> AsyncIterator[None]:
        async with self._slots:
            try:
                yield
            finally:
                if self._finish_sessions:
                    await finish_session(self._http, "", rollout.rollout_id)

    async def chat(self, rollout: ChatRollout, turn: int, messages: list[dict]) -> Turn:
        body = request_body(self._model, messages, rollout, turn if self._forced else None, self._extra)
        response = await self._http.post("/v1/chat/completions", json=body, headers={self._header: rollout.rollout_id})
        if response.status_code == 400 and "maximum context length" in response.text:
            raise ContextLengthExceeded(response.text[:200])
        if response.status_code != 200:
            raise RuntimeError(f"router answered HTTP {response.status_code}: {response.text[:300]}")
        body = response.json()
        usage = body["usage"]
        return Turn(body["choices"][0]["message"]["content"] or "", usage["prompt_tokens"], usage["completion_tokens"],
                    response.headers.get(REPLICA_HEADER, ""))

    async def aclose(self) -> None:
        await self._http.aclose()


async def finish_session(http: httpx.AsyncClient, router_url: str, session_id: str) -> None:
    """Tell vllm-router that a session ended, as its users' gateways do when a trajectory ends."""
    response = await http.post(f"{router_url}/finish_session", params={"session_id": session_id})
    response.raise_for_status()


class PoolEndpoint:
    """Ours: ``ServingPool`` sessions and chat turns, the production path."""

    def __init__(self, pool: ServingPool, forced: bool = False, extra: dict | None = None) -> None:
        self.pool = pool
        self._forced = forced
        self._extra = extra or {}

    def session(self, rollout: ChatRollout) -> contextlib.AbstractAsyncContextManager[None]:
        return self.pool.session(rollout.rollout_id, rollout.group_id)

    async def chat(self, rollout: ChatRollout, turn: int, messages: list[dict]) -> Turn:
        body = request_body(self.pool.model, messages, rollout, turn if self._forced else None, self._extra)
        sampling = {k: v for k, v in body.items() if k not in ("model", "messages", "max_tokens", "return_token_ids")}
        c = await self.pool.chat(rollout.rollout_id, messages, max_tokens=body["max_tokens"],
                                 group_id=rollout.group_id, **sampling)
        return Turn(c.text, c.prompt_tokens, c.completion_tokens, c.replica.removeprefix("http://"))


def request_body(model: str, messages: list[dict], rollout: ChatRollout, forced_turn: int | None = None,
                 extra: dict | None = None) -> dict:
    """What ``ReplicaClient.chat`` sends, logprobs off: the same body through every endpoint. With
    ``forced_turn``, exactly that turn's planned output (a real model's words are its own); ``extra`` adds
    sampling fields (``allowed_token_ids``: a random model's words that come back as the tokens it made)."""
    body = {"model": model, "messages": messages, "max_tokens": rollout.max_tokens, "logprobs": False,
            "return_token_ids": True, **(extra or {})}
    if forced_turn is not None:
        body["max_tokens"] = len(rollout.turns[forced_turn].reply.split()) + 1
        body["ignore_eos"] = True
    return body


@dataclass(frozen=True)
class Totals:
    """Counters summed over the replicas' ``/metrics``, and the worst clock lag of any engine."""

    preemptions: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    generation_tokens: float = 0.0
    max_lag_s: float = 0.0

    def minus(self, before: Totals) -> Totals:
        return Totals(self.preemptions - before.preemptions, self.prefix_queries - before.prefix_queries,
                      self.prefix_hits - before.prefix_hits, self.generation_tokens - before.generation_tokens,
                      self.max_lag_s)


async def scrape(urls: Sequence[str]) -> Totals:
    totals = Totals()
    async with httpx.AsyncClient(timeout=30) as http:
        for url in urls:
            async with ReplicaClient(url) as client:
                engines = await client.metrics()
            lags = [float(line.rsplit(" ", 1)[1]) for line in (await http.get(f"{url}/metrics")).text.splitlines()
                    if line.startswith(_LAG_SERIES)]
            for m in engines.values():
                totals = Totals(totals.preemptions + m.num_preemptions_total,
                                totals.prefix_queries + m.prefix_cache_queries_total,
                                totals.prefix_hits + m.prefix_cache_hits_total,
                                totals.generation_tokens + m.generation_tokens_total,
                                max([totals.max_lag_s, *lags]))
    return totals


@dataclass
class Tally:
    requests: int = 0
    output_tokens: int = 0
    context_limited: int = 0
    followups: int = 0
    stayed: int = 0
    prompt_tokens: dict[tuple[str, int], int] = field(default_factory=dict)  # (rollout, turn) -> prompt tokens
    request_s: float = 0.0  # total seconds requests took as the client saw them


@dataclass(frozen=True)
class HttpResult:
    makespan_s: float  # simulated seconds: wall seconds / time_scale
    batch_starts_s: tuple[float, ...]
    batch_spans_s: tuple[float, ...]
    requests: int
    output_tokens: int  # as the client saw them
    context_limited: int
    followup_turns: int
    stayed_turns: int
    replicas: Totals  # what the replicas counted during the run
    wall_s: float
    cpu_s: float  # this process (the driver, and the pool when it is ours), not the servers
    prompt_tokens: dict[tuple[str, int], int]  # (rollout, turn) -> prompt tokens the replica counted

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.makespan_s if self.makespan_s else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        q = self.replicas.prefix_queries
        return self.replicas.prefix_hits / q if q else 0.0

    @property
    def stay_share(self) -> float:
        """NaN where no replica was named (a router in front of real vLLM)."""
        return self.stayed_turns / self.followup_turns if self.followup_turns else float("nan")

    @property
    def preemption_rate(self) -> float:
        return self.replicas.preemptions / self.requests if self.requests else 0.0


async def serve(batches: Sequence[Sequence[ChatRollout]], endpoint: Endpoint, replicas: Sequence[str],
                max_async_steps: int, time_scale: float) -> HttpResult:
    """Run every step to completion through ``endpoint`` and summarise."""
    before = await scrape(replicas)
    tally = Tally()
    done = [asyncio.Event() for _ in batches]
    starts = [0.0] * len(batches)
    ends = [0.0] * len(batches)
    loop = asyncio.get_running_loop()
    t0, cpu0 = loop.time(), time.process_time()

    async def step(s: int) -> None:
        for gate in done[: max(0, s - max_async_steps + 1)]:
            await gate.wait()
        starts[s] = loop.time() - t0
        await asyncio.gather(*(play_rollout(ro, endpoint, tally, time_scale) for ro in batches[s]))
        ends[s] = loop.time() - t0
        done[s].set()

    await asyncio.gather(*(step(s) for s in range(len(batches))))
    wall, cpu = loop.time() - t0, time.process_time() - cpu0
    after = await scrape(replicas)
    return HttpResult(
        makespan_s=max(ends) / time_scale,
        batch_starts_s=tuple(s / time_scale for s in starts),
        batch_spans_s=tuple((e - s) / time_scale for s, e in zip(starts, ends)),
        requests=tally.requests,
        output_tokens=tally.output_tokens,
        context_limited=tally.context_limited,
        followup_turns=tally.followups,
        stayed_turns=tally.stayed,
        replicas=after.minus(before),
        wall_s=wall,
        cpu_s=cpu,
        prompt_tokens=tally.prompt_tokens,
    )


async def play_rollout(ro: ChatRollout, endpoint: Endpoint, tally: Tally, time_scale: float,
                       on_admitted: Callable[[], None] | None = None) -> None:
    """One rollout through ``endpoint``: admitted (then ``on_admitted()``), its turns with the tool waits between."""
    messages = ro.first_messages()
    previous: str | None = None
    async with endpoint.session(ro):
        if on_admitted is not None:
            on_admitted()
        for i, planned in enumerate(ro.turns):
            sent = time.perf_counter()
            try:
                turn = await endpoint.chat(ro, i, messages)
            except ContextLengthExceeded:
                tally.context_limited += 1
                return
            tally.requests += 1
            tally.request_s += time.perf_counter() - sent
            tally.output_tokens += turn.completion_tokens
            tally.prompt_tokens[ro.rollout_id, i] = turn.prompt_tokens
            if previous and turn.replica:
                tally.followups += 1
                tally.stayed += turn.replica == previous
            previous = turn.replica
            if i + 1 == len(ro.turns):
                return
            await asyncio.sleep(planned.tool_wait_s * time_scale)
            answer, tool = {"role": "assistant", "content": turn.text}, {"role": "user", "content": planned.tool}
            messages = [*messages, answer, tool]
