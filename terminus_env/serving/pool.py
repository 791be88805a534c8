"""ServingPool: the rollout runner's one door to N vLLM replicas.

It keeps each session on one replica (its prefix cache lives there), places new sessions on the
least-loaded replica (the :class:`Router`'s policy), caps live sessions through an optional
admission controller, and survives replicas dying: a request that could not reach its replica is
retried on another, the dead one is probed on ``/health`` and takes new sessions when it is back. A
request that reached an engine which then died is never replayed elsewhere (:class:`EngineDied`): it
may be what killed it, and one such request must not take the fleet down replica by replica.
A background task scrapes every replica's ``/metrics`` to keep the router and admission current.
Every routing and admission decision goes through a :class:`Scheduler`, the same one the routing
benchmark drives in virtual time. Between training steps, :meth:`ServingPool.sync_weights` pushes new
weights to every replica; each completion carries the ``policy_version`` of the weights that served it.

At start the pool reads each replica's ``/v1/models`` (its context length, what it was started from) and
``/weight_info`` (the version of the weights it serves, which a restarted trainer carries on from). Each request
asks for at most the replica's context length (vLLM cuts it further to the room the prompt leaves).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from terminus_env.serving.admission import Admission
from terminus_env.serving.client import (
    FRESH_WEIGHT_VERSION,
    Completion,
    ContextLengthExceeded,
    EngineDied,
    ModelCard,
    ModelNotServed,
    ReplicaClient,
    ReplicaUnavailable,
    ServingError,
    message_text,
)
from terminus_env.serving.metrics import EngineMetrics, combine
from terminus_env.serving.policies import Policy
from terminus_env.serving.router import NoReplicaAvailable, Router
from terminus_env.serving.scheduler import Scheduler
from terminus_env.serving.weight_sync import (
    BROKEN_TAG,
    InitialWeights,
    LoadFailed,
    Weights,
    WeightSource,
    WeightSync,
    load_into,
    version_of,
)

__all__ = ["Completion", "ContextLengthExceeded", "EngineDied", "ReplicaUnavailable", "ServingError", "ServingPool"]

log = logging.getLogger(__name__)
_CHARS_PER_TOKEN = 4  # a rough prompt-size estimate until the server's count comes back
HEALTH_PROBE_S = 10.0  # how long a replica has to answer /health after a request failed there
RETRIES_AT_HEALTHY_REPLICAS = 2  # a request that failed at a replica still healthy afterwards is sent again this often
CATCH_UP_RETRY_S = 30.0  # a replica back from the dead that failed to load the pool's weights is tried again after this
SCRAPES_MISSED_DOWN = 3
"""Scrapes of /metrics in a row that time out before a replica counts as down: a CPU replica busy with a long reply
can miss one; a refused connection or a 5xx counts at once."""


def down_after_scrape(error: ReplicaUnavailable, missed_before: int) -> tuple[bool, int]:
    """Whether a failed scrape of a replica marks it down, and how many scrapes in a row it has now missed."""
    missed = missed_before + 1 if error.timed_out else SCRAPES_MISSED_DOWN
    return missed >= SCRAPES_MISSED_DOWN, missed


@dataclass
class _SessionState:
    trace_tokens: int = 0  # prompt + completion tokens of the last turn
    messages_seen: int = 0
    turns: int = 0  # turns completed


class ServingPool:
    """Sticky, least-loaded, admission-capped, failover-safe chat over vLLM replicas.

    ``async with ServingPool(urls, model) as pool:`` then, per rollout, ``async with
    pool.session(rollout_id, group_id):`` and ``await pool.chat(rollout_id, messages, max_tokens=...)``.
    A replica is named by its base URL (``Completion.replica``). ``rebalance=True`` lets the router move
    a session between turns off a replica whose sessions claim more KV than it has (see
    ``Router._rebalanced``); off, every turn of a session goes to the replica of its first.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        model: str,
        *,
        policy: str | Policy = "available_kv",
        admission: Admission | None = None,
        group_affinity: bool = False,
        rebalance: bool = False,
        scrape_interval_s: float = 1.0,
        failover_timeout_s: float = 300.0,
        request_timeout_s: float = 3600.0,
        connect_timeout_s: float = 5.0,
        catch_up_retry_s: float = CATCH_UP_RETRY_S,
    ) -> None:
        if not base_urls:
            raise ValueError("base_urls is empty: give the pool at least one vLLM server URL")
        if scrape_interval_s <= 0:
            raise ValueError(f"scrape_interval_s must be positive, got {scrape_interval_s}")
        self.model = model
        self.scrape_interval_s = scrape_interval_s
        self.failover_timeout_s = failover_timeout_s
        self.catch_up_retry_s = catch_up_retry_s
        self._clients: dict[str, ReplicaClient] = {}
        for url in base_urls:
            client = ReplicaClient(url, timeout_s=request_timeout_s, connect_timeout_s=connect_timeout_s)
            if client.base_url in self._clients:
                raise ValueError(f"replica {client.base_url} is listed twice")
            self._clients[client.base_url] = client
        router = Router(
            list(self._clients),
            policy,
            group_affinity=group_affinity,
            rebalance=rebalance,
            metrics_max_age_s=max(5.0, 3 * scrape_interval_s),
        )
        self.scheduler = Scheduler(router, admission)
        self._down: set[str] = set()
        self._missed: dict[str, int] = {}  # scrapes in a row that timed out, by replica
        self._metrics: dict[str, EngineMetrics] = {}
        self._sessions: dict[str, _SessionState] = {}
        self._scraper: asyncio.Task | None = None
        self.failovers = 0  # requests retried on another replica
        self.policy_version: Any = None  # the weights the replicas serve: the last sync's, or as read at start
        self._good = Weights(None, None)  # the weights the fleet serves: what a replica back or failing is given
        self._cards: dict[str, ModelCard] = {}  # each replica's /v1/models entry for the model
        self._retry_at: dict[str, float] = {}  # when a replica that failed to catch up is tried again
        self._open = asyncio.Event()  # cleared while a weight sync holds new requests
        self._open.set()
        self._idle = asyncio.Event()  # set when no request of this pool is at a replica
        self._idle.set()
        self._requests = 0
        self._sync_lock = asyncio.Lock()

    @property
    def router(self) -> Router:
        return self.scheduler.router

    @property
    def admission(self) -> Admission | None:
        return self.scheduler.admission

    @property
    def replicas(self) -> list[str]:
        return list(self._clients)

    def is_up(self, replica: str) -> bool:
        return replica in self._clients and replica not in self._down

    def latest_metrics(self) -> dict[str, EngineMetrics]:
        """The last scrape of each replica that is up (its engines combined)."""
        return {name: m for name, m in self._metrics.items() if name not in self._down}

    # -- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Read what each replica serves and scrape it once (so placement starts informed), then keep scraping in
        the background. Raises :class:`ServingError` when a replica that answers does not serve ``model``."""
        if self._scraper is not None:
            return
        await self._read_versions()
        await self._scrape_all()
        self._scraper = asyncio.create_task(self._scrape_forever(), name="serving-pool-scraper")

    async def _read_versions(self) -> None:
        """The weight version every replica that answers reports: the pool's ``policy_version`` when they agree."""
        tags = await asyncio.gather(*(self._read_replica(name) for name in self._clients))
        known = {tag for tag in tags if tag is not None}
        if len(known) > 1:
            versions = ", ".join(f"{name}: {tag}" for name, tag in zip(self._clients, tags))
            log.warning("the replicas serve different weight versions (%s): rows carry policy_version None until "
                        "the next sync_weights", versions)  # fmt: skip
            return
        if not known:
            return
        tag = known.pop()
        root = next((card.root for card in self._cards.values()), None)
        fresh = tag == FRESH_WEIGHT_VERSION
        self._good = Weights(InitialWeights(root) if fresh and root else None, tag)
        self.policy_version = None if fresh else version_of(tag)

    async def _read_replica(self, name: str) -> str | None:
        """A replica's model card, kept; its weight version (None when it does not answer or report one)."""
        client = self._clients[name]
        try:
            self._cards[name] = await client.served_model(self.model)
        except ReplicaUnavailable:
            return None  # down: the scrape marks it so
        except ModelNotServed:
            raise
        except ServingError as exc:  # no model list (not a vLLM server): no context length known, none capped
            log.warning("replica %s: %s", name, exc)
        try:
            return await client.weight_version()
        except ServingError:
            return None  # no weight-update endpoints (a server started without --weight-sync)

    async def aclose(self) -> None:
        if self._scraper is not None:
            self._scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scraper
            self._scraper = None
        await asyncio.gather(*(client.aclose() for client in self._clients.values()))

    async def __aenter__(self) -> ServingPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- sessions and requests -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def session(self, session_id: str, group_id: str | None = None) -> AsyncIterator[None]:
        """One rollout's life: admitted on entry (waiting its turn), its slot and routing state freed on exit."""
        await self._admitted(session_id, group_id)
        try:
            yield
        finally:
            state = self._sessions.pop(session_id, _SessionState())
            self.scheduler.end(session_id, state.trace_tokens)

    async def _admitted(self, session_id: str, group_id: str | None) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_admitted() -> None:
            if not future.done():
                future.set_result(None)

        if self.scheduler.submit(session_id, group_id, on_admitted):
            return
        try:
            await future
        except asyncio.CancelledError:
            if not self.scheduler.withdraw(session_id):
                self.scheduler.end(session_id, 0)  # admitted just as the caller gave up
            raise

    async def chat(
        self, session_id: str, messages: list[dict], *, max_tokens: int, group_id: str | None = None, **sampling: Any
    ) -> Completion:
        """The session's next turn, on its replica; on a replica failure, the same turn elsewhere.

        Raises :class:`ContextLengthExceeded` when the conversation no longer fits the replica's context (decided by
        the engine's words, else by measuring the prompt against the context the replica reported),
        :class:`EngineDied` when the replica's engine died with this request in it (never replayed),
        and :class:`ReplicaUnavailable` only when no replica has answered for ``failover_timeout_s``.
        """
        state = self._sessions.setdefault(session_id, _SessionState())
        estimate = state.trace_tokens + _new_chars(messages, state.messages_seen) // _CHARS_PER_TOKEN
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.failover_timeout_s
        last_error: Exception | None = None
        retries_left = RETRIES_AT_HEALTHY_REPLICAS
        while True:
            replica = await self._route(session_id, group_id, deadline, last_error)
            await self._open.wait()  # a weight sync in progress holds the request until the new weights are in
            version = self.policy_version
            limit = self._context_window(replica)
            asked = min(max_tokens, limit) if limit else max_tokens  # the engine cuts it to the room the prompt leaves
            self.scheduler.dispatched(replica, session_id, estimate)
            try:
                completion = await self._at_replica(replica, messages, asked, sampling)
            except ReplicaUnavailable as exc:
                self.scheduler.failed(replica, session_id, estimate)
                if exc.delivered:
                    if not await self._clients[replica].still_alive(HEALTH_PROBE_S):
                        self._mark_down(replica, exc)
                        message = _died_message(replica, session_id, state.turns, messages, sampling, exc)
                        raise EngineDied(message) from exc
                    if retries_left == 0:
                        raise ServingError(
                            f"session {session_id!r}: the request failed {RETRIES_AT_HEALTHY_REPLICAS + 1} times at "
                            f"replicas that stayed healthy (last: {exc}); the request itself is what fails"
                        ) from exc
                    retries_left -= 1
                else:
                    self._mark_down(replica, exc)
                self.failovers += 1
                last_error = exc
                continue
            except BaseException:
                self.scheduler.failed(replica, session_id, estimate)
                raise
            break
        self.scheduler.completed(replica, session_id, completion.prompt_tokens, completion.completion_tokens)
        state.trace_tokens = completion.prompt_tokens + completion.completion_tokens
        state.messages_seen = len(messages)
        state.turns += 1
        return dataclasses.replace(completion, policy_version=version, max_model_len=limit)

    def _context_window(self, replica: str) -> int | None:
        """The replica's context in tokens, as its ``/v1/models`` reported it."""
        return self._cards[replica].max_model_len if replica in self._cards else None

    @property
    def requests_at_replicas(self) -> int:
        """Requests sent to a replica and not answered yet: a weight sync waits for these to finish."""
        return self._requests

    async def _at_replica(self, replica: str, messages: list[dict], max_tokens: int, sampling: dict) -> Completion:
        """One request at a replica, counted so that a weight sync can wait for it to finish."""
        self._requests += 1
        self._idle.clear()
        try:
            return await self._clients[replica].chat(
                self.model, messages, max_tokens=max_tokens, context_window=self._context_window(replica), **sampling
            )
        finally:
            self._requests -= 1
            if self._requests == 0:
                self._idle.set()

    # -- weight sync ---------------------------------------------------------------------------------

    async def sync_weights(self, source: WeightSource, version: Any) -> WeightSync:
        """Load new weights into every replica that is up; requests sent after it carry ``version``.

        New requests wait from the call on. ``source`` is first checked against the model the replicas serve (for a
        checkpoint: every tensor, by name and shape), before any replica pauses: one that cannot replace it whole
        raises :class:`~terminus_env.serving.checkpoint.CheckpointError` and nothing changes. Requests already at
        a replica finish on the old weights and keep the old version (vLLM's
        ``/pause?mode=wait`` drains other clients' requests the same way). Each replica is loaded from ``source``,
        its prefix cache reset (no later request may reuse KV computed with the old weights) and its weight
        version set, then resumed. A replica that fails to load is given the last good weights back before it
        serves again, or, when it cannot take them, tagged broken and left paused until it restarts (``terminus-env
        serve`` restarts it); either way it is marked down and loads these weights before it takes sessions again,
        as does a replica that was down. Raises :class:`ServingError` when no replica took them: every replica
        then serves the last good weights under the last good version, or is out until it restarts.
        """
        tag = str(version)
        if tag.startswith(BROKEN_TAG):
            raise ValueError(f"version {tag!r} is the tag of a replica that failed to load; name versions otherwise")
        loop = asyncio.get_running_loop()
        async with self._sync_lock:
            held_from = loop.time()
            self._open.clear()
            try:
                await source.check(await self._served_root())  # reads headers only: a moment, whatever the model
                await self._idle.wait()
                up = [name for name in self._clients if name not in self._down]
                new = Weights(source, tag)
                results = await asyncio.gather(
                    *(load_into(self._clients[name], new, self._good) for name in up), return_exceptions=True
                )
                failed = {name: r for name, r in zip(up, results) if isinstance(r, BaseException)}
                loaded = [name for name in up if name not in failed]
                for name, error in failed.items():
                    if loaded or not (isinstance(error, LoadFailed) and error.restored):
                        self._mark_down(name, error)  # it holds other weights than the fleet now, or none
                if not loaded:
                    errors = "; ".join(f"{n}: {r}" for n, r in failed.items())
                    raise ServingError(
                        f"no replica took the weights of version {version} ({errors or 'none is up'}); the replicas "
                        f"that answer serve version {self._good.tag} as before"
                    )
                load_s = max(r for r in results if not isinstance(r, BaseException))
                self.policy_version = version
                self._good = new
            finally:
                self._open.set()
            skipped = tuple(name for name in self._clients if name not in loaded)
            return WeightSync(tag, tuple(loaded), skipped, loop.time() - held_from, load_s)

    async def _served_root(self) -> str:
        """What the replicas started from (``/v1/models``' ``root``), read now from one that is up if not yet."""
        for name in self._clients:
            if name not in self._cards and name not in self._down:
                with contextlib.suppress(ReplicaUnavailable):
                    self._cards[name] = await self._clients[name].served_model(self.model)
        roots = {card.root for card in self._cards.values()}
        if len(roots) != 1:
            what = f"different models ({', '.join(sorted(roots))})" if roots else "nothing (no replica answers)"
            raise ServingError(f"the replicas of {self.model} were started from {what}; serve one model everywhere")
        return roots.pop()

    async def _route(self, session_id: str, group_id: str | None, deadline: float, last_error: Exception | None) -> str:
        """A replica for the session, waiting for the health probe while every replica is down."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return self.scheduler.place(session_id, group_id)
            except NoReplicaAvailable:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise ReplicaUnavailable(
                        f"no replica of {', '.join(self._clients)} answered for {self.failover_timeout_s:.0f}s "
                        f"(last error: {last_error}); check the servers, then retry the rollout"
                    ) from last_error
                await asyncio.sleep(min(self.scrape_interval_s, remaining))

    # -- scraping and health -------------------------------------------------------------------------

    async def _scrape_forever(self) -> None:
        while True:
            await asyncio.sleep(self.scrape_interval_s)
            try:
                await self._scrape_all()
            except Exception:  # one bad round must not stop placement from ever seeing fresh numbers
                log.exception("scraping the replicas failed; retrying in %.1fs", self.scrape_interval_s)

    async def _scrape_all(self) -> None:
        await asyncio.gather(*(self._scrape(name) for name in self._clients))
        self.scheduler.observe(self.latest_metrics())

    async def _scrape(self, name: str) -> None:
        client = self._clients[name]
        if name in self._down:
            if not await client.health() or self._sync_lock.locked():
                return  # down, or a sync runs: it would move the weights this replica must hold
            async with self._sync_lock:
                if not await self._weights_current(name):
                    return
                log.info("replica %s answers /health again; it takes new sessions", name)
                self._down.discard(name)
                self.scheduler.mark_up(name)
        try:
            engines = await client.metrics()
        except ReplicaUnavailable as exc:
            down, self._missed[name] = down_after_scrape(exc, self._missed.get(name, 0))
            if down:
                self._missed.pop(name)
                self._mark_down(name, exc)
            else:
                log.info("replica %s did not answer a scrape (%s); it stays up", name, exc)
            return
        except ServingError as exc:  # up, but /metrics unreadable: keep it, with stale numbers
            log.warning("replica %s: %s", name, exc)
            return
        self._missed.pop(name, None)
        self._metrics[name] = combine(engines.values(), engine=name)
        self.scheduler.scraped(name, self._metrics[name])

    async def _weights_current(self, name: str) -> bool:
        """Whether a replica back from the dead serves the fleet's weights, loading them into it if it can: a
        replica restarted comes back with the weights it was started with."""
        client = self._clients[name]
        with contextlib.suppress(ServingError):
            self._cards[name] = await client.served_model(self.model)
        if self._good.tag is None:
            return True  # the replicas report no versions: nothing to compare
        try:
            tag = await client.weight_version()
        except ServingError as exc:
            log.warning("replica %s answers but not /weight_info (%s); it stays out", name, exc)
            return False
        if tag == self._good.tag:
            with contextlib.suppress(ServingError):  # a sync that could not resume it left it paused
                if await client.is_paused():
                    await client.resume()
            return True
        if tag == BROKEN_TAG or self._good.source is None or time.monotonic() < self._retry_at.get(name, 0.0):
            return False  # restarting, or weights this pool cannot load, or tried a moment ago
        root = self._cards[name].root if name in self._cards else None
        own = Weights(InitialWeights(root) if tag == FRESH_WEIGHT_VERSION and root else None, tag)
        try:
            await load_into(client, self._good, own)
        except ServingError as exc:
            log.warning("replica %s is back but did not load weights version %s: %s", name, self._good.tag, exc)
            self._retry_at[name] = time.monotonic() + self.catch_up_retry_s
            return False
        return True

    def _mark_down(self, name: str, error: BaseException) -> None:
        if name not in self._down:
            log.warning("replica %s is down (%s); its sessions move to other replicas", name, error)
            self._down.add(name)
            self.scheduler.mark_down(name)


def _died_message(
    replica: str, session_id: str, turns: int, messages: list[dict], sampling: dict, error: ReplicaUnavailable
) -> str:
    """Names the request whose engine died, and what to look at."""
    seeded = (
        " It carried a per-request seed: vLLM's CPU build crashes on a seeded request whose prefill is split in "
        "chunks (`terminus-env serve` turns chunked prefill off on the CPU; a server started otherwise needs "
        "--no-enable-chunked-prefill)."
        if sampling.get("seed") is not None
        else ""
    )
    return (
        f"replica {replica}'s engine died while it held session {session_id!r}'s request (turn {turns + 1}, "
        f"{len(messages)} messages, {sum(len(message_text(m)) for m in messages)} characters, sampling "
        f"{sampling or 'the defaults'}): {str(error).rstrip('.')}. The request is not sent to another replica, since "
        f"it may be what killed the engine; the other replicas keep serving. The replica's log says why it died."
        f"{seeded}"
    )


def _new_chars(messages: list[dict], seen: int) -> int:
    return sum(len(message_text(m)) for m in messages[seen:]) or 1
