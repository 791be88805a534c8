"""A simulated vLLM server: the same HTTP surface, its engines modelled by :class:`SimReplica` in real time.

Each engine runs a loop: ``step()``, sleep until the wall clock reaches the engine's virtual clock
(``epoch + now × time_scale``), hand finished requests back to their HTTP handlers. Sleeping to an
absolute deadline keeps the virtual clock on the wall clock however long the loop's own work takes;
an engine the CPU cannot keep up with runs behind, and ``terminus_sim:max_lag_seconds`` in
``/metrics`` says by how much at worst (in simulated seconds). Each chat response names the server
that answered in ``x-sim-replica: host:port``, so a benchmark can see where a router sent a turn.

Replies come from a :class:`ReplySource` and are tokenized with the toy tokenizer (or a real
tokenizer's chat template, through ``TemplateTokenizer``), so token counts,
``max_tokens`` cuts, context-length errors and prefix reuse behave as on a real server while the
words come from a script or an oracle.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from terminus_env.serving.client import FRESH_WEIGHT_VERSION, message_text
from terminus_env.serving.sim.config import SimConfig, curve_at
from terminus_env.serving.sim.context_rules import Refusal, granted_tokens
from terminus_env.serving.sim.engine import SimFinished, SimReplica, SimRequest, UnknownRequest
from terminus_env.serving.sim.exposition import CONTENT_TYPE, Exposition
from terminus_env.serving.sim.http import Request, Response, serve_connection
from terminus_env.serving.sim.replies import ReplySource, default_reply
from terminus_env.serving.sim.tokenizer import ChatTokenizer, ToyTokenizer

DP_RANK_HEADER = "x-data-parallel-rank"
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."  # vLLM's words
SYSTEM_FINGERPRINT = "vllm-sim"
REPLICA_HEADER = "x-sim-replica"


@dataclass(frozen=True)
class ServerConfig:
    model: str = "sim"
    engines: int = 1
    engine: SimConfig = field(default_factory=SimConfig)
    time_scale: float = 1.0  # real seconds per simulated second; 0 runs as fast as the loop can
    weight_sync: bool = False  # serve vLLM's weight-update endpoints, as `vllm serve` does with VLLM_SERVER_DEV_MODE=1
    root: str | None = None  # what /v1/models says the model was started from (vLLM's --model); default: the name
    # A request whose last message holds this text kills its engine, as a request that crashes vLLM's engine core
    # does: every request the engine holds then fails with HTTP 500, and /health answers 503 from then on.
    crash_on: str | None = None

    def __post_init__(self) -> None:
        if self.engines < 1:
            raise ValueError(f"engines must be at least 1, got {self.engines}")
        if self.time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, got {self.time_scale}")


class _EngineDriver:
    """Runs one :class:`SimReplica` against the wall clock and resolves each request's future."""

    def __init__(self, replica: SimReplica, time_scale: float, on_finished: Callable[[str, SimFinished], None]):
        self.replica = replica
        self._time_scale = time_scale
        self._on_finished = on_finished
        self._pending: dict[str, asyncio.Future[SimFinished]] = {}
        self._wake = asyncio.Event()
        self._epoch = time.monotonic()
        self.dead: Exception | None = None
        self.max_lag_s = 0.0  # how far the engine's clock ran behind the wall clock, in simulated seconds

    def busy(self) -> bool:
        return bool(self._pending)

    def load(self) -> float:
        """vLLM's own data-parallel balancing score: ``waiting × 4 + running``."""
        m = self.replica.metrics()
        return m.num_requests_waiting * 4 + m.num_requests_running

    async def generate(self, request: SimRequest) -> SimFinished:
        if self.dead is not None:
            raise self.dead
        delay = curve_at(self.replica.config.frontend_s, len(self._pending) + self.replica.frontend_open + 1, 0.0)
        if delay > 0 and self._time_scale > 0:  # a shared host's frontend (SimConfig); as fast as possible: none
            self.replica.frontend_open += 1
            try:
                await asyncio.sleep(delay * self._time_scale)
            finally:
                self.replica.frontend_open -= 1
            if self.dead is not None:
                raise self.dead
        if not self.replica.has_work() and self._time_scale > 0:
            # An idle engine's clock follows the wall clock, so queue times start at arrival.
            self.replica.advance_to((time.monotonic() - self._epoch) / self._time_scale)
        self.replica.submit(request)
        future = asyncio.get_running_loop().create_future()
        self._pending[request.request_id] = future
        self._wake.set()
        try:
            return await future
        except asyncio.CancelledError:
            self._abort(request.request_id)
            raise

    def _abort(self, request_id: str) -> None:
        """A client that went away frees its KV, as vLLM aborts a disconnected request."""
        if self._pending.pop(request_id, None) is not None:
            try:
                self.replica.abort(request_id)
            except UnknownRequest:
                pass

    async def run(self) -> None:
        try:
            await self._loop()
        except Exception as exc:  # a dead engine fails its requests and /health, as vLLM's EngineDeadError does
            self.die(exc)

    def die(self, exc: Exception) -> None:
        """Fail every request the engine holds and every later one with ``exc``."""
        self.dead = exc
        for future in self._pending.values():
            if not future.done():
                future.set_exception(exc)
        self._pending.clear()
        self._wake.set()

    async def _loop(self) -> None:
        while self.dead is None:
            if not self.replica.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            self.replica.step()
            await self._keep_time()
            for done in self.replica.pop_finished():
                self._on_finished(self.replica.engine, done)
                future = self._pending.pop(done.request_id, None)
                if future is not None and not future.done():
                    future.set_result(done)


    async def _keep_time(self) -> None:
        """Sleep until the wall clock reaches the engine's clock; when behind it, only yield and note the lag."""
        if self._time_scale == 0:
            await asyncio.sleep(0)
            return
        ahead = self._epoch + self.replica.now * self._time_scale - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
            return
        self.max_lag_s = max(self.max_lag_s, -ahead / self._time_scale)
        await asyncio.sleep(0)


class SimServer:
    """``async with SimServer(config) as server: server.url`` — or ``start()`` / ``aclose()``."""

    def __init__(
        self,
        config: ServerConfig | None = None,
        replies: ReplySource = default_reply,
        tokenizer: ChatTokenizer | None = None,
    ) -> None:
        self.config = config or ServerConfig()
        self._replies = replies
        self._tokenizer = tokenizer or ToyTokenizer()
        replicas = [SimReplica(self.config.engine, engine=str(i)) for i in range(self.config.engines)]
        self._exposition = Exposition(self.config.model, replicas, self._max_lags)
        self._drivers = [_EngineDriver(r, self.config.time_scale, self._exposition.observe) for r in replicas]
        self._ids = itertools.count()
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self._connections: set[asyncio.Task] = set()
        self._serving = asyncio.Event()  # cleared while paused for a weight update
        self._serving.set()
        self.weights_path: str | None = None  # the last reload_weights' path
        self.pauses = 0  # /pause calls so far
        self.weight_version = FRESH_WEIGHT_VERSION
        self.host = ""
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def replicas(self) -> list[SimReplica]:
        return [driver.replica for driver in self._drivers]

    def _max_lags(self) -> dict[str, float]:
        return {driver.replica.engine: driver.max_lag_s for driver in self._drivers}

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Listen on ``host:port`` (0 picks a free port; read it from ``.port``)."""
        self._tasks = [asyncio.create_task(driver.run()) for driver in self._drivers]
        self._server = await asyncio.start_server(self._on_connection, host, port)
        self.host, self.port = self._server.sockets[0].getsockname()[:2]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in [*self._connections, *self._tasks]:
            task.cancel()
        await asyncio.gather(*self._connections, *self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a connection is served in a task of its own
        self._connections.add(task)
        try:
            await serve_connection(reader, writer, self._route)
        except asyncio.CancelledError:
            pass  # the server is closing; ending quietly keeps asyncio from logging each connection
        finally:
            self._connections.discard(task)

    async def _route(self, request: Request) -> Response:
        routes = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("GET", "/v1/models"): self._models,
            ("POST", "/tokenize"): self._tokenize,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
        }
        if self.config.weight_sync:
            routes |= {
                ("POST", "/pause"): self._pause,
                ("POST", "/resume"): self._resume,
                ("GET", "/is_paused"): self._is_paused,
                ("POST", "/collective_rpc"): self._collective_rpc,
                ("POST", "/reset_prefix_cache"): self._reset_prefix_cache,
                ("POST", "/update_weight_version"): self._update_weight_version,
                ("GET", "/weight_info"): self._weight_info,
            }
        handler = routes.get((request.method, request.path))
        if handler is None:
            known = any(path == request.path for _, path in routes)
            return Response.json(405 if known else 404, {"detail": "Method Not Allowed" if known else "Not Found"})
        try:
            return await handler(request)
        except _ApiError as exc:
            return exc.response()

    # -- weight updates (vLLM's development endpoints) ---------------------------------------------------

    async def _pause(self, request: Request) -> Response:
        """``mode=wait`` (the only one modelled): new requests wait for ``/resume``; running ones finish first."""
        self.pauses += 1
        self._serving.clear()
        while any(driver.busy() for driver in self._drivers):
            await asyncio.sleep(0.005)
        return Response.json(200, {"status": "paused"})

    async def _resume(self, request: Request) -> Response:
        self._serving.set()
        return Response.json(200, {"status": "resumed"})

    async def _is_paused(self, request: Request) -> Response:
        return Response.json(200, {"is_paused": not self._serving.is_set()})

    async def _collective_rpc(self, request: Request) -> Response:
        """``reload_weights`` records where the weights came from; the simulator has none to load. A path that does
        not exist fails as in vLLM 0.32 (HTTP 500, the engine unharmed, the weights as they were)."""
        body = request.json()
        if not isinstance(body, dict):
            raise _ApiError(400, "the body must be a JSON object")
        if body.get("method") != "reload_weights":
            raise _ApiError(500, f"the simulator's workers have no method {body.get('method')!r}")
        path = (body.get("kwargs") or {}).get("weights_path")
        if path is not None and path.startswith("/") and not Path(path).exists():
            raise _ApiError(500, f"Call to collective_rpc method failed: Worker failed with error 'no such folder: "
                                 f"{path}', please check the stack trace above for the root cause")  # fmt: skip
        self.weights_path = path
        return Response.json(200, {"results": [None] * len(self._drivers)})

    async def _reset_prefix_cache(self, request: Request) -> Response:
        return Response.json(200, {"success": all(d.replica.reset_prefix_cache() for d in self._drivers)})

    async def _update_weight_version(self, request: Request) -> Response:
        body = request.json()
        if not isinstance(body, dict) or "new_version" not in body:
            raise _ApiError(400, "the body must be a JSON object with 'new_version'")
        self.weight_version = str(body["new_version"])
        return Response.json(200, {"success": True, "new_version": self.weight_version})

    async def _weight_info(self, request: Request) -> Response:
        return Response.json(200, {"weight_version": self.weight_version})

    async def _health(self, request: Request) -> Response:
        dead = [d.replica.engine for d in self._drivers if d.dead is not None]
        if dead:
            raise _ApiError(503, f"engine(s) {', '.join(dead)} died: {self._drivers[int(dead[0])].dead!r}")
        return Response(200, content_type="text/plain")

    async def _metrics(self, request: Request) -> Response:
        return Response(200, self._exposition.render(), content_type=CONTENT_TYPE)

    async def _models(self, request: Request) -> Response:
        card = {
            "id": self.config.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "vllm",
            "root": self.config.root or self.config.model,
            "parent": None,
            "max_model_len": self.config.engine.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{uuid.uuid4().hex[:16]}",
                    "object": "model_permission",
                    "created": int(time.time()),
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        return Response.json(200, {"object": "list", "data": [card]})

    async def _chat(self, request: Request) -> Response:
        await self._serving.wait()  # held while paused for a weight update
        body = _chat_body(request)
        try:
            prompt = self._tokenizer.chat_prompt(body["messages"])
        except ValueError as exc:
            raise _ApiError(400, str(exc)) from exc
        if body.get("model") not in (None, self.config.model):
            raise _ApiError(404, f"The model `{body['model']}` does not exist.")
        messages = body["messages"]
        max_tokens = self._check_context(len(prompt), body.get("max_completion_tokens") or body.get("max_tokens"))
        try:
            reply = self._tokenizer.reply(self._replies(messages))
        except Exception as exc:  # a broken script or oracle is the server's fault, as a model crash would be
            raise _ApiError(500, f"reply source failed: {type(exc).__name__}: {exc}") from exc
        request_id = f"chatcmpl-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        driver = self._pick_engine(request.headers.get(DP_RANK_HEADER))
        if self.config.crash_on is not None and self.config.crash_on in message_text(messages[-1]):
            driver.die(RuntimeError(ENGINE_DEAD_MESSAGE))
        # The reply's tokens and then the end-of-turn token, which vLLM counts as generated.
        output_ids = (*(token for _, token in reply), self._tokenizer.end_of_turn[1])
        # vLLM's ignore_eos generates max_tokens whatever the model says, and finishes with "length".
        output_len = max_tokens + 1 if body.get("ignore_eos") is True else len(output_ids)
        sim_request = SimRequest(request_id, tuple(prompt), max_tokens, output_len=output_len,
                                 output_token_ids=output_ids)
        try:
            done = await driver.generate(sim_request)
        except Exception as exc:
            raise _ApiError(500, f"engine {driver.replica.engine} failed: {type(exc).__name__}: {exc}") from exc
        completion = self._completion_body(body, request_id, prompt, reply, done)
        headers = {REPLICA_HEADER: f"{self.host}:{self.port}"}
        if body.get("stream"):
            kept = [text for text, _ in reply[: done.output_tokens]]
            deltas = kept + [""] * (done.output_tokens - len(kept))
            stream = _event_stream(completion, body, deltas)
            return Response(200, stream, content_type="text/event-stream", headers=headers)
        return Response.json(200, completion, headers=headers)

    def _check_context(self, prompt_len: int, max_tokens: object) -> int:
        """vLLM 0.32's context-length rules (:mod:`~terminus_env.serving.sim.context_rules`), its refusals word for
        word where clients parse them."""
        granted = granted_tokens(prompt_len, max_tokens, self.config.engine.max_model_len)
        if isinstance(granted, Refusal):
            raise _ApiError(400, granted.message, param=granted.param)
        return granted

    async def _tokenize(self, request: Request) -> Response:
        """vLLM's ``/tokenize`` of a chat (the prompt with its generation opener, as a chat request sends it)."""
        body = _chat_body(request)
        try:
            prompt = self._tokenizer.chat_prompt(body["messages"])
        except ValueError as exc:
            raise _ApiError(400, str(exc)) from exc
        limit = self.config.engine.max_model_len
        return Response.json(200, {"count": len(prompt), "max_model_len": limit, "tokens": prompt, "token_strs": None})

    def _pick_engine(self, rank: str | None) -> _EngineDriver:
        if rank is None:
            return min(self._drivers, key=_EngineDriver.load)
        if not rank.isdigit() or int(rank) >= len(self._drivers):
            raise _ApiError(
                400, f"{DP_RANK_HEADER}: {rank!r} is not an engine of this server (0..{len(self._drivers) - 1})"
            )
        return self._drivers[int(rank)]

    def _completion_body(
        self, body: dict, request_id: str, prompt: list[int], reply: list[tuple[str, int]], done: SimFinished
    ) -> dict:
        """vLLM 0.32's completion, field for field (tests/real_vllm/test_sim_parity.py holds the two side by side)."""
        kept = reply[: done.output_tokens]
        end_text, end_id = self._tokenizer.end_of_turn
        ids = list(done.output_token_ids)  # the reply's tokens, then its end token (or, past it, any token)
        texts = [text for text, _ in kept] + [end_text if i == end_id else "" for i in ids[len(kept):]]
        with_ids = body.get("return_token_ids") is True
        message = {"role": "assistant", "content": "".join(text for text, _ in kept)}
        choice: dict = {
            "index": 0,
            "message": message | dict.fromkeys(("refusal", "annotations", "audio", "function_call", "reasoning")),
            "logprobs": _logprobs(texts, ids) if body.get("logprobs") else None,
            "finish_reason": done.finish_reason,
            "stop_reason": None,
            "token_ids": ids if with_ids else None,
            "routed_experts": None,
        }
        return {
            "id": request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.config.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": {
                "prompt_tokens": len(prompt),
                "total_tokens": len(prompt) + done.output_tokens,
                "completion_tokens": done.output_tokens,
                "prompt_tokens_details": None,  # vLLM fills it only with --enable-prompt-tokens-details
                "completion_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_ids": prompt if with_ids else None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }


class _ApiError(Exception):
    """An error answered in vLLM's body shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param

    def response(self) -> Response:
        kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(
            self.status, "InternalServerError"
        )
        error = {"message": str(self), "type": kind, "param": self.param, "code": self.status}
        return Response.json(self.status, {"error": error})


def _chat_body(request: Request) -> dict:
    """The request's JSON, or a 400 saying what is wrong."""
    try:
        body = request.json()
    except ValueError as exc:
        raise _ApiError(400, f"request body is not JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
        raise _ApiError(400, "a chat completion needs a non-empty 'messages' list")
    return body


def _event_stream(completion: dict, body: dict, deltas: list[str]) -> bytes:
    """A finished completion as server-sent events, as vLLM streams one: the role (with the prompt's ids when
    asked), then one chunk per generated token (``deltas``: its text, empty for the end-of-turn token; its
    logprobs and id; the last with the finish reason), then usage when ``stream_options.include_usage`` asks."""
    choice = completion["choices"][0]
    base = {key: completion[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    opening = {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}]}  # fmt: skip
    if completion["prompt_token_ids"] is not None:
        opening |= {"prompt_token_ids": completion["prompt_token_ids"], "prompt_text": None}
    events = [opening]
    entries = choice["logprobs"]["content"] if choice["logprobs"] else None
    ids = choice["token_ids"]
    for i, text in enumerate(deltas):
        last = i == len(deltas) - 1
        token = {"index": 0, "delta": {"content": text}, "logprobs": {"content": [entries[i]]} if entries else None,
                 "finish_reason": choice["finish_reason"] if last else None}  # fmt: skip
        if last:
            token["stop_reason"] = None
        if ids is not None:
            token["token_ids"] = [ids[i]]
        events.append({**base, "choices": [token]})
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {key: completion["usage"][key] for key in ("prompt_tokens", "total_tokens", "completion_tokens")}
        events.append({**base, "choices": [], "usage": usage, "system_fingerprint": SYSTEM_FINGERPRINT})
    lines = [f"data: {json.dumps(event)}\n\n" for event in events] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


def _logprobs(texts: list[str], ids: list[int]) -> dict:
    """Deterministic, plausible log-probabilities in (-4, 0] (the simulator samples nothing)."""
    content = [
        {"token": text, "logprob": -((tid % 4000) / 1000.0), "bytes": list(text.encode()), "top_logprobs": []}
        for text, tid in zip(texts, ids)
    ]
    return {"content": content}
