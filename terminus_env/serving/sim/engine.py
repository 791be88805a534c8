"""A discrete-event model of one vLLM replica (V1 scheduler semantics) in virtual time.

Routing and admission policies are judged by what they do to KV residency, recompute preemption and
prefix reuse, so the model allocates, caches and preempts KV blocks the way vLLM does, and is cheap
enough to run whole RL batches on a laptop. It is pure: no asyncio, no wall clock. A caller drives it
with ``step()`` and reads ``now``; the HTTP simulator scales ``step()``'s duration to real sleeps.

What is modelled (and how vLLM does it):
- KV blocks of ``block_size`` tokens from a pool of ``num_gpu_blocks`` (one block is the reserved null
  block, as in vLLM, so ``num_gpu_blocks - 1`` are usable). A request holds
  ``ceil(computed_tokens / block_size)`` blocks, allocated as it grows.
- Continuous batching with chunked prefill: each step spends up to ``max_num_batched_tokens`` tokens,
  running requests first (oldest first), then waiting ones (FCFS) while fewer than ``max_num_seqs`` run.
  With ``enable_chunked_prefill=False`` (vLLM's CPU replicas) a waiting request is scheduled only when
  all its uncached tokens fit what is left of the step's budget; the queue waits behind it otherwise.
- Recompute preemption: when a running request's next blocks do not fit, the newest running request
  is evicted, its blocks freed and it is put back at the front of the queue; it later recomputes its
  prompt and generated tokens (counted in ``recomputed_tokens``).
- Prefix caching: a full block is keyed by a hash chained over its tokens and all earlier ones. Freed
  blocks keep their key and sit in an LRU free queue; they are reused by a later request with the same
  prefix (the next turn of a session, a GRPO sibling) unless an allocation evicted them first.
  Queries and hits are counted in tokens, as ``vllm:prefix_cache_*`` are, and, as in vLLM 0.32, only for a
  request's first admission: a preempted request's lookup when it resumes is kept out of them.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass

from terminus_env.serving.metrics import EngineMetrics
from terminus_env.serving.sim.config import SimConfig, curve_at

_NULL_BLOCK = 0
_LCG_MUL = 1664525
_LCG_ADD = 1013904223
_LCG_MOD = 1 << 32


class ContextTooLong(ValueError):
    """A prompt longer than the replica's ``max_model_len`` (vLLM answers HTTP 400)."""


class UnknownRequest(KeyError):
    """An operation named a request id this replica does not hold."""


@dataclass(frozen=True)
class SimRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    output_len: int  # tokens it generates before "stop", unless max_tokens or max_model_len cut it
    output_token_ids: tuple[int, ...] = ()  # what it generates, when the caller knows; drawn at random past its end


@dataclass(frozen=True)
class SimFinished:
    request_id: str
    output_tokens: int
    finish_reason: str  # "stop" | "length"
    cached_prompt_tokens: int  # prefix-cache hit when it was first scheduled
    queued_s: float  # arrival -> first scheduled
    ttft_s: float  # arrival -> first output token
    e2e_s: float  # arrival -> finished
    preemptions: int
    output_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class KVBlocks:
    """Where the usable blocks are. ``free + evictable_cached + active == usable``."""

    usable: int
    free: int  # never used, or evicted from the prefix cache
    evictable_cached: int  # no live request holds them; they keep a prefix-cache key until evicted
    active: int  # held by running requests


@dataclass(frozen=True)
class SimStats:
    steps: int
    busy_s: float  # virtual time spent in steps
    preemptions: int
    recomputed_tokens: int  # tokens computed again after a preemption (prefix hits excluded)
    prefill_tokens: int  # uncached prompt tokens computed, recomputation included
    generation_tokens: int


class _Live:
    """One request inside the engine."""

    __slots__ = (
        "arrival",
        "blocks",
        "cached_prompt_tokens",
        "first_token_at",
        "hashes",
        "max_computed",
        "num_computed",
        "num_hashed_blocks",
        "num_prompt",
        "preemptions",
        "req",
        "rng",
        "scheduled_at",
        "stop_after",
        "tokens",
    )

    def __init__(self, req: SimRequest, arrival: float, max_model_len: int) -> None:
        self.req = req
        self.tokens = list(req.prompt_token_ids)
        self.num_prompt = len(self.tokens)
        room = max_model_len - self.num_prompt
        self.stop_after = min(req.output_len, req.max_tokens, room)
        self.num_computed = 0
        self.max_computed = 0
        self.blocks: list[int] = []
        self.hashes: list[int] = []  # prefix-cache keys of this request's full blocks, as far as computed
        self.num_hashed_blocks = 0  # how many of self.blocks carry their key in the pool
        self.arrival = arrival
        self.scheduled_at: float | None = None
        self.first_token_at: float | None = None
        self.cached_prompt_tokens = 0
        self.preemptions = 0
        self.rng = zlib.crc32(req.request_id.encode())

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt


class _BlockPool:
    """Ref-counted blocks, an LRU free queue and the prefix-cache index, as in vLLM's block pool."""

    def __init__(self, num_blocks: int) -> None:
        self.ref = [0] * num_blocks
        self.key: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # prefix key -> block id
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self.evictable_cached = 0

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` blocks from the head of the free queue, evicting their cache keys."""
        out = []
        for _ in range(n):
            block, _ = self.free.popitem(last=False)
            key = self.key[block]
            if key is not None:
                self.key[block] = None
                self.evictable_cached -= 1
                if self.cached.get(key) == block:
                    del self.cached[key]
            self.ref[block] = 1
            out.append(block)
        return out

    def touch(self, blocks: list[int]) -> None:
        """Share cached blocks with one more request, taking idle ones out of the free queue."""
        for block in blocks:
            if self.ref[block] == 0:
                del self.free[block]
                self.evictable_cached -= 1
            self.ref[block] += 1

    def release(self, blocks: list[int]) -> None:
        """Drop one reference; a request's tail blocks go to the queue first, so they are evicted first."""
        for block in reversed(blocks):
            self.ref[block] -= 1
            if self.ref[block] == 0:
                self.free[block] = None
                if self.key[block] is not None:
                    self.evictable_cached += 1

    def register(self, block: int, key: int) -> None:
        """Give a just-filled block its prefix key, unless another block already holds that content."""
        if key not in self.cached:
            self.cached[key] = block
            self.key[block] = key

    def lookup(self, keys: list[int]) -> list[int]:
        """The longest run of leading keys with a cached block."""
        hits = []
        for key in keys:
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def forget_prefixes(self) -> None:
        """Drop every prefix key; the blocks stay where they are (free or held)."""
        self.cached.clear()
        self.key = [None] * len(self.key)
        self.evictable_cached = 0

    def free_after_touch(self, blocks: list[int]) -> int:
        return len(self.free) - sum(1 for b in blocks if self.ref[b] == 0)


def _or_now(t: float | None, now: float) -> float:
    return now if t is None else t


class SimReplica:
    """One simulated vLLM engine. Drive it with ``submit`` / ``step`` / ``pop_finished``."""

    def __init__(self, config: SimConfig, engine: str = "0") -> None:
        self.config = config
        self.engine = engine
        self.now = 0.0
        self._pool = _BlockPool(config.num_gpu_blocks)
        self._waiting: deque[_Live] = deque()
        self._running: list[_Live] = []
        self._finished: list[SimFinished] = []
        self._ids: set[str] = set()
        self._preemptions = 0
        self._recomputed = 0
        self._prefill_tokens = 0
        self._prompt_tokens_total = 0
        self._generation_tokens = 0
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._steps = 0
        self._busy_s = 0.0
        self.frontend_open = 0  # requests the server holds in its frontend (they count as open: SimConfig)

    # -- requests in and out -------------------------------------------------------------------------

    def submit(self, req: SimRequest, arrival_s: float | None = None) -> None:
        """Queue a request. ``arrival_s`` (default ``now``) lets a driver date an arrival inside a step."""
        if len(req.prompt_token_ids) >= self.config.max_model_len:
            raise ContextTooLong(
                f"request {req.request_id!r} has {len(req.prompt_token_ids)} prompt tokens but this replica's "
                f"max_model_len is {self.config.max_model_len}; shorten the conversation"
            )
        if not req.prompt_token_ids:
            raise ValueError(f"request {req.request_id!r} has an empty prompt")
        if req.max_tokens < 1 or req.output_len < 1:
            raise ValueError(f"request {req.request_id!r} needs max_tokens >= 1 and output_len >= 1")
        if req.request_id in self._ids:
            raise ValueError(f"request id {req.request_id!r} is already queued or running on engine {self.engine}")
        self._ids.add(req.request_id)
        self._waiting.append(_Live(req, self.now if arrival_s is None else arrival_s, self.config.max_model_len))

    def abort(self, request_id: str) -> None:
        """Drop a queued or running request (a client went away); its blocks are freed, not reported."""
        for queue in (self._waiting, self._running):
            for live in queue:
                if live.req.request_id == request_id:
                    queue.remove(live)
                    self._pool.release(live.blocks)
                    self._ids.discard(request_id)
                    return
        raise UnknownRequest(f"engine {self.engine} holds no request {request_id!r}")

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, as vLLM's ``/reset_prefix_cache``; False (nothing done) while a request
        holds blocks."""
        if self._running:
            return False
        self._pool.forget_prefixes()
        return True

    def pop_finished(self) -> list[SimFinished]:
        out, self._finished = self._finished, []
        return out

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    def advance_to(self, t: float) -> None:
        """Move an idle engine's clock forward (time passes while nothing runs)."""
        if self.has_work():
            raise RuntimeError(f"engine {self.engine} is busy; its clock only moves by step()")
        self.now = max(self.now, t)

    # -- the scheduler -------------------------------------------------------------------------------

    def step(self) -> float:
        """Run one continuous-batching step and return its duration (0.0 when there is nothing to do)."""
        cfg = self.config
        contention = curve_at(cfg.step_contention, len(self._waiting) + len(self._running) + self.frontend_open, 1.0)
        scheduled = self._schedule()
        if not scheduled:
            return 0.0
        tokens = context = pairs = 0
        first: list[_Live] = []
        done: list[_Live] = []
        for live, n in scheduled:  # the hot loop: one pass per scheduled request
            tokens += n
            computed = live.num_computed + n
            context += computed
            pairs += n * (computed - n) + n * (n + 1) // 2
            live.num_computed = computed
            live.max_computed = max(live.max_computed, computed)
            if cfg.enable_prefix_caching and computed // cfg.block_size > live.num_hashed_blocks:
                self._register_full_blocks(live)
            if computed == len(live.tokens):
                if live.first_token_at is None:
                    first.append(live)
                if self._sample(live):
                    done.append(live)
        dt = (
            cfg.step_base_s
            + cfg.step_per_token_s * tokens
            + cfg.step_per_seq_s * len(scheduled)
            + cfg.step_per_context_token_s * context
            + cfg.step_per_token_pair_s * pairs
        ) * contention
        self.now += dt
        self._steps += 1
        self._busy_s += dt
        for live in first:
            live.first_token_at = self.now
            self._prompt_tokens_total += live.num_prompt
        if done:
            finished = set(map(id, done))
            self._running = [live for live in self._running if id(live) not in finished]
            for live in done:
                self._finish(live)
        return dt

    def _schedule(self) -> list[tuple[_Live, int]]:
        budget = self.config.max_num_batched_tokens
        bs = self.config.block_size
        free = self._pool.free
        scheduled: list[tuple[_Live, int]] = []
        preempted = False
        i = 0
        while i < len(self._running) and budget > 0:
            live = self._running[i]
            n = len(live.tokens) - live.num_computed
            n = min(n, budget)
            need = -(-(live.num_computed + n) // bs) - len(live.blocks)
            if need > len(free):
                preempted = True
                if not self._make_room(live, need):
                    break
            if need > 0:
                live.blocks.extend(self._pool.allocate(need))
            if live.num_computed < live.max_computed or live.num_computed < live.num_prompt:
                self._count_recompute(live, n)
            scheduled.append((live, n))
            budget -= n
            i += 1
        # Like vLLM, admit nothing new in a step that had to preempt.
        while not preempted and self._waiting and budget > 0 and len(self._running) < self.config.max_num_seqs:
            live = self._waiting[0]
            hits = self._prefix_hits_for(live)
            cached_tokens = len(hits) * self.config.block_size
            n = len(live.tokens) - cached_tokens
            if n > budget and not self.config.enable_chunked_prefill:
                break  # vLLM stops scheduling here: a whole prefill that does not fit waits for the next step
            n = min(n, budget)
            need = self._blocks_for(cached_tokens + n) - len(hits)
            if need > self._pool.free_after_touch(hits):
                break
            self._waiting.popleft()
            self._pool.touch(hits)
            live.blocks = hits + self._pool.allocate(need)
            live.num_hashed_blocks = len(hits)
            live.num_computed = cached_tokens
            if live.scheduled_at is None:
                live.scheduled_at = self.now
                live.cached_prompt_tokens = cached_tokens
            if not live.preemptions:
                self._prefix_queries += len(live.tokens)
                self._prefix_hits += cached_tokens
            self._count_recompute(live, n)
            self._running.append(live)
            scheduled.append((live, n))
            budget -= n
        return scheduled

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.config.block_size)

    def _prefix_hits_for(self, live: _Live) -> list[int]:
        if not self.config.enable_prefix_caching:
            return []
        # At least one token must be computed to produce logits, as in vLLM.
        cacheable = (len(live.tokens) - 1) // self.config.block_size
        self._extend_hashes(live, cacheable)
        return self._pool.lookup(live.hashes[:cacheable])

    def _extend_hashes(self, live: _Live, num_blocks: int) -> None:
        bs = self.config.block_size
        hashes = live.hashes
        parent = hashes[-1] if hashes else 0
        for b in range(len(hashes), num_blocks):
            parent = hash((parent, tuple(live.tokens[b * bs : (b + 1) * bs])))
            hashes.append(parent)

    def _count_recompute(self, live: _Live, n: int) -> None:
        start = live.num_computed
        self._recomputed += max(0, min(start + n, live.max_computed) - start)
        if start < live.num_prompt:
            self._prefill_tokens += min(start + n, live.num_prompt) - start

    def _preempt(self, live: _Live) -> None:
        self._pool.release(live.blocks)
        live.blocks = []
        live.num_hashed_blocks = 0
        live.num_computed = 0
        live.preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft(live)

    def _make_room(self, live: _Live, need: int) -> bool:
        """Preempt the newest running requests until ``need`` blocks are free; False if ``live`` went."""
        while need > len(self._pool.free):
            victim = self._running.pop()
            self._preempt(victim)
            if victim is live:
                return False
        return True

    def _sample(self, live: _Live) -> bool:
        """Append one generated token; True when the request is finished."""
        scripted = live.req.output_token_ids
        if live.num_output < len(scripted):
            live.tokens.append(scripted[live.num_output])
        else:
            live.rng = (live.rng * _LCG_MUL + _LCG_ADD) % _LCG_MOD
            live.tokens.append(live.rng % self.config.vocab_size)
        self._generation_tokens += 1
        return live.num_output >= live.stop_after

    def _register_full_blocks(self, live: _Live) -> None:
        full = live.num_computed // self.config.block_size
        if full <= live.num_hashed_blocks:
            return
        self._extend_hashes(live, full)
        for b in range(live.num_hashed_blocks, full):
            self._pool.register(live.blocks[b], live.hashes[b])
        live.num_hashed_blocks = full

    def _finish(self, live: _Live) -> None:
        self._pool.release(live.blocks)
        live.blocks = []
        self._ids.discard(live.req.request_id)
        req = live.req
        reason = "stop" if live.num_output >= req.output_len else "length"
        self._finished.append(
            SimFinished(
                request_id=req.request_id,
                output_tokens=live.num_output,
                finish_reason=reason,
                cached_prompt_tokens=live.cached_prompt_tokens,
                queued_s=_or_now(live.scheduled_at, self.now) - live.arrival,
                ttft_s=_or_now(live.first_token_at, self.now) - live.arrival,
                e2e_s=self.now - live.arrival,
                preemptions=live.preemptions,
                output_token_ids=tuple(live.tokens[live.num_prompt :]),
            )
        )

    # -- what /metrics and the bench see -------------------------------------------------------------

    def kv_blocks(self) -> KVBlocks:
        usable = self.config.usable_blocks
        free_total = len(self._pool.free)
        evictable = self._pool.evictable_cached
        return KVBlocks(
            usable=usable, free=free_total - evictable, evictable_cached=evictable, active=usable - free_total
        )

    def metrics(self) -> EngineMetrics:
        """The numbers vLLM's ``/metrics`` would show for this engine right now."""
        return EngineMetrics(
            engine=self.engine,
            num_requests_running=float(len(self._running)),
            num_requests_waiting=float(len(self._waiting)),
            kv_cache_usage=1.0 - len(self._pool.free) / self.config.usable_blocks,
            num_preemptions_total=float(self._preemptions),
            prompt_tokens_total=float(self._prompt_tokens_total),
            generation_tokens_total=float(self._generation_tokens),
            prefix_cache_queries_total=float(self._prefix_queries),
            prefix_cache_hits_total=float(self._prefix_hits),
            num_gpu_blocks=self.config.num_gpu_blocks,
            block_size=self.config.block_size,
        )

    def stats(self) -> SimStats:
        return SimStats(
            steps=self._steps,
            busy_s=self._busy_s,
            preemptions=self._preemptions,
            recomputed_tokens=self._recomputed,
            prefill_tokens=self._prefill_tokens,
            generation_tokens=self._generation_tokens,
        )
