"""An async client for one vLLM server: chat with token ids and logprobs, ``/health``, ``/metrics``.

Every failure is one of two kinds a caller acts on differently: the request itself is bad
(:class:`RequestRefused`, :class:`ContextLengthExceeded` among them) and retrying cannot help, or the
replica is unavailable (:class:`ReplicaUnavailable`) and the same request may go elsewhere. A
:class:`ReplicaUnavailable` also says whether the request may have reached the engine (``delivered``):
one that did and took the engine down with it must not be sent to the next replica (the pool's rule).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from terminus_env.errors import TerminusError
from terminus_env.serving.context_refusal import context_exhausted, exhausted_by_measure, room_left
from terminus_env.serving.metrics import EngineMetrics, MetricsParseError, parse_metrics

# An idle connection is dropped before vLLM's server closes it (uvicorn's keep-alive, 5 s by default): reusing one
# that the server is closing fails the request with a ReadError, which a tool wait of about 5 s makes likely.
KEEPALIVE_EXPIRY_S = 4.0
HEALTH_RETRY_S = 0.5  # between /health probes of a replica whose request failed (``still_alive``)


class ServingError(TerminusError):
    """A serving request failed; the message says what the server answered."""


class RequestRefused(ServingError):
    """The server refused the request itself (HTTP 4xx): sent again, anywhere, it fails the same way.

    ``reason`` is the server's own words, for the rules that read them (:mod:`~terminus_env.serving.context_refusal`).
    """

    def __init__(self, message: str, *, status: int = 400, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = message if reason is None else reason


class ContextLengthExceeded(RequestRefused):
    """The conversation no longer fits the model's context: the engine refused it for its length, or the pool
    measured the prompt at the whole context.

    The episode has hit its context limit (the agent's ``context_limit``, or a summary where the loop summarizes);
    retrying the same request anywhere fails the same way.
    """


class ReplicaUnavailable(ServingError):
    """The replica did not answer (connection error, timeout) or failed (5xx); try another one.

    ``delivered`` is False only when the request surely never reached the server (it could not connect);
    otherwise the engine may have run it, and may have died of it. ``timed_out``: no answer came in time, which a
    server too busy to answer and a hung one both give (a refused connection or a 5xx says more).
    """

    def __init__(self, message: str, *, delivered: bool = True, timed_out: bool = False) -> None:
        super().__init__(message)
        self.delivered = delivered
        self.timed_out = timed_out


class ModelNotServed(ServingError):
    """The replica answers, and serves other models than the one asked for."""


class EngineDied(ServingError):
    """A replica's engine died while it held this request (HTTP 5xx or a dropped connection, then no ``/health``).

    The request is not sent to another replica: it may be what killed the engine, and replaying it could take
    the whole fleet down one replica after another. The rollout fails; the other replicas keep serving.
    """


# httpx's errors raised before a byte of the request left: the server cannot have seen it.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
CONTROL_ATTEMPTS = 3  # a weight-update call (pause, resume, ...) whose connection dropped is sent again this often
FRESH_WEIGHT_VERSION = "default"  # what vLLM's /weight_info says before any weight update


@dataclass(frozen=True)
class Completion:
    """One chat turn's result, with the token ids a trainer needs to avoid re-tokenizing."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    prompt_token_ids: list[int] | None
    token_ids: list[int] | None
    logprobs: list[float] | None
    replica: str
    policy_version: Any = None  # the weights that served it, when a ServingPool knows (see sync_weights)
    max_model_len: int | None = None  # the replica's context length: prompt + completion reached it when equal


@dataclass(frozen=True)
class ModelCard:
    """A model as a replica's ``/v1/models`` names it: the name requests use, what it was started from, its context."""

    id: str
    root: str  # the folder or Hugging Face name the replica loaded at start (vLLM's ``--model``)
    max_model_len: int | None


class ReplicaClient:
    """One vLLM server at ``base_url`` (``http://host:port``, with or without ``/v1``)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        # Agents keep many sessions open at once; httpx's default pool of 100 would queue them here.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_EXPIRY_S)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, limits=limits, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> ReplicaClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def chat(
        self,
        model: str,
        messages: list[dict],
        *,
        max_tokens: int,
        logprobs: bool = True,
        headers: dict[str, str] | None = None,
        context_window: int | None = None,
        **sampling: Any,
    ) -> Completion:
        """One ``/v1/chat/completions`` call asking for prompt and output token ids.

        A refusal for the context's length raises :class:`ContextLengthExceeded`: in any engine's words
        (:func:`context_exhausted`), or, given the server's ``context_window``, any other refusal of a prompt that
        measures the whole window (``/tokenize``), so that the decision never rests on wording alone. A server that
        refuses a ``max_tokens`` which only overflows the context together with the prompt (vLLM before it cut such
        requests to the room left, SGLang) is asked again for the room left, once.
        """
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "logprobs": logprobs,
            "return_token_ids": True,
            **sampling,
        }
        try:
            response = await self._chat_request(body, headers, context_window)
        except ContextLengthExceeded as exc:
            room = room_left(exc.reason, max_tokens)
            if room is None:
                raise
            body["max_tokens"] = room
            response = await self._chat_request(body, headers, context_window)
        return self._completion(response)

    async def _chat_request(
        self, body: dict[str, Any], headers: dict[str, str] | None, context_window: int | None
    ) -> httpx.Response:
        """One chat request; a refusal for the context's length is :class:`ContextLengthExceeded`."""
        try:
            return await self._request("POST", "/v1/chat/completions", json=body, headers=headers)
        except RequestRefused as exc:
            if exc.status == 400 and context_exhausted(exc.reason, body["max_tokens"]):
                raise ContextLengthExceeded(str(exc), reason=exc.reason) from exc
            if exc.status == 400 and "cannot be greater than max_model_len" in exc.reason:
                raise RequestRefused(
                    f"{exc} The per-turn token limit is above the model's context: ask for at most its max_model_len "
                    "(its /v1/models says it; ServingPool caps every request so).", reason=exc.reason,
                ) from exc  # fmt: skip
            if context_window is None:
                raise
            measured = await self._measured(body["messages"], body["model"])
            if measured is not None and exhausted_by_measure(measured, context_window):
                raise ContextLengthExceeded(
                    f"{exc} (the prompt measures {measured} tokens of the {context_window}-token context)",
                    reason=exc.reason,
                ) from exc
            raise

    async def _measured(self, messages: list[dict], model: str) -> int | None:
        """The prompt's tokens, or None when the server cannot count them (no ``/tokenize``, or it failed)."""
        try:
            return await self.prompt_tokens(model, messages)
        except ServingError:
            return None

    async def prompt_tokens(self, model: str, messages: list[dict]) -> int:
        """The prompt's length in tokens, as a chat request with ``messages`` would send it (vLLM's ``/tokenize``)."""
        body = {"model": model, "messages": messages, "add_generation_prompt": True}
        response = await self._request("POST", "/tokenize", json=body)
        try:
            count = response.json()["count"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ServingError(f"{self.base_url}/tokenize: no token count in {response.text[:200]!r}") from exc
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ServingError(f"{self.base_url}/tokenize: the count is not a number of tokens: {count!r}")
        return count

    async def models(self) -> list[ModelCard]:
        """The models ``/v1/models`` lists."""
        response = await self._request("GET", "/v1/models")
        try:
            cards = response.json()["data"]
            listed = []
            for card in cards:
                length = card.get("max_model_len")
                valid = isinstance(length, int) and not isinstance(length, bool) and length > 0
                listed.append(ModelCard(card["id"], str(card.get("root") or card["id"]), length if valid else None))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ServingError(f"{self.base_url}/v1/models: not an OpenAI model list: {response.text[:200]!r}") from exc
        return listed

    async def served_model(self, model: str) -> ModelCard:
        """``model`` as ``/v1/models`` describes it; :class:`ModelNotServed`, naming the served ones, if it is not."""
        served = {card.id: card for card in await self.models()}
        if model not in served:
            raise ModelNotServed(
                f"{self.base_url} serves {', '.join(map(repr, served)) or 'no model'}, not {model!r}: pass the "
                "served name (vLLM's --served-model-name, else its --model)"
            )
        return served[model]

    async def continuation_logprobs(self, model: str, prompt_token_ids: list[int], token_ids: list[int]) -> list[float]:
        """log p(token) of each of ``token_ids`` after ``prompt_token_ids`` under the weights served now, at
        temperature 1 (vLLM's ``prompt_logprobs``); what a trainer compares with its own model after a weight sync."""
        if not prompt_token_ids or not token_ids:
            raise ValueError("continuation_logprobs needs at least one prompt token and one continuation token")
        body = {"model": model, "prompt": [*prompt_token_ids, *token_ids], "max_tokens": 1, "prompt_logprobs": 0,
                "temperature": 1.0}  # fmt: skip
        response = await self._request("POST", "/v1/completions", json=body)
        try:
            scored = response.json()["choices"][0]["prompt_logprobs"][len(prompt_token_ids) :]
            return [float(entry[str(token)]["logprob"]) for entry, token in zip(scored, token_ids, strict=True)]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ServingError(
                f"{self.base_url}/v1/completions: no prompt logprobs in {response.text[:200]!r} (a vLLM server "
                "answers them)"
            ) from exc

    async def health(self, timeout_s: float | None = None) -> bool:
        """True when the server answers ``/health`` with 200 (within ``timeout_s`` when given); never raises."""
        return await self._health_answer(timeout_s) is True

    async def still_alive(self, window_s: float) -> bool:
        """Whether the server answers ``/health`` with 200 within ``window_s``, asked again after each dropped or reset
        connection: a stale keep-alive connection, or one reset by a server swamped with connections, says nothing of
        its engine. A refused connection (nothing listening) or any answer but 200 is taken at once; never raises."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + window_s
        while (left := deadline - loop.time()) > 0:
            answer = await self._health_answer(left)
            if answer is not None:
                return answer
            await asyncio.sleep(min(HEALTH_RETRY_S, max(0.0, deadline - loop.time())))
        return False

    async def _health_answer(self, timeout_s: float | None) -> bool | None:
        """One ``/health`` probe: whether it answered 200; False when nothing listens; None when the connection dropped
        or timed out, which says nothing either way."""
        try:
            if timeout_s is None:
                response = await self._http.get("/health")
            else:
                response = await self._http.get("/health", timeout=httpx.Timeout(timeout_s))
        except httpx.ConnectError:
            return False
        except httpx.HTTPError:
            return None
        return response.status_code == 200

    async def metrics(self) -> dict[str, EngineMetrics]:
        """The server's ``/metrics``, one entry per engine."""
        response = await self._request("GET", "/metrics")
        try:
            return parse_metrics(response.text)
        except MetricsParseError as exc:
            raise ServingError(f"{self.base_url}/metrics: {exc}") from exc

    # -- weight updates: vLLM's development endpoints (`terminus-env serve --weight-sync`) --------------

    async def pause(self, mode: Literal["wait", "abort", "keep"] = "wait") -> None:
        """Stop scheduling new requests; ``wait`` lets the running ones finish on the current weights first."""
        await self._dev_request("/pause", params={"mode": mode})

    async def is_paused(self) -> bool:
        response = await self._dev_request("/is_paused", method="GET")
        return bool(response.json().get("is_paused"))

    async def resume(self) -> None:
        await self._dev_request("/resume")

    async def collective_rpc(self, method: str, kwargs: dict[str, str] | None = None) -> list[Any]:
        """Call ``method`` on every worker of the replica (vLLM takes string arguments only)."""
        response = await self._dev_request("/collective_rpc", json={"method": method, "kwargs": kwargs or {}})
        return response.json().get("results", []) if response.content else []

    async def reset_prefix_cache(self) -> None:
        """Forget every cached prefix, so no request reuses KV computed with other weights."""
        response = await self._dev_request("/reset_prefix_cache")
        if not response.json().get("success"):
            raise ServingError(f"{self.base_url}: the prefix cache was not reset (blocks still held); pause first")

    async def set_weight_version(self, version: str) -> None:
        await self._dev_request("/update_weight_version", json={"new_version": version})

    async def weight_version(self) -> str | None:
        response = await self._dev_request("/weight_info", method="GET")
        return response.json().get("weight_version")

    async def _dev_request(self, path: str, method: str = "POST", **kwargs: Any) -> httpx.Response:
        """A weight-update call. Each is idempotent, so one whose connection dropped before an answer is sent again:
        a server that closed a kept-alive connection must not leave a replica paused."""
        attempt = 1
        try:
            while True:
                try:
                    return await self._request(method, path, **kwargs)
                except ReplicaUnavailable as exc:
                    if attempt == CONTROL_ATTEMPTS or not isinstance(exc.__cause__, httpx.TransportError):
                        raise
                    attempt += 1
        except RequestRefused as exc:
            if exc.status == 404:
                raise ServingError(
                    f"{self.base_url}{path} is not served: start the replicas with `terminus-env serve "
                    "--weight-sync` (vLLM's development endpoints, VLLM_SERVER_DEV_MODE=1)"
                ) from exc
            raise

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise ReplicaUnavailable(
                f"{self.base_url}{path}: timed out ({type(exc).__name__})", delivered=not isinstance(exc, _NOT_SENT),
                timed_out=True,
            ) from exc
        except httpx.TransportError as exc:
            raise ReplicaUnavailable(
                f"{self.base_url}{path}: {type(exc).__name__}: {exc}", delivered=not isinstance(exc, _NOT_SENT)
            ) from exc
        if response.status_code >= 500:
            raise ReplicaUnavailable(f"{self.base_url}{path}: HTTP {response.status_code}: {_error_message(response)}")
        if response.status_code >= 400:
            message = _error_message(response)
            raise RequestRefused(f"{self.base_url}{path}: HTTP {response.status_code}: {message}",
                                 status=response.status_code, reason=message)  # fmt: skip
        return response

    def _completion(self, response: httpx.Response) -> Completion:
        try:
            data = response.json()
            choice = data["choices"][0]
            usage = data["usage"]
            content = choice["logprobs"]["content"] if choice.get("logprobs") else None
            return Completion(
                text=choice["message"].get("content") or "",
                finish_reason=choice["finish_reason"],
                prompt_tokens=usage["prompt_tokens"],
                completion_tokens=usage["completion_tokens"],
                prompt_token_ids=data.get("prompt_token_ids"),
                token_ids=choice.get("token_ids"),
                logprobs=[entry["logprob"] for entry in content] if content is not None else None,
                replica=self.base_url,
            )
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ServingError(f"{self.base_url}: not an OpenAI chat completion: {response.text[:200]!r}") from exc


def message_text(message: dict) -> str:
    """A chat message's text, whether ``content`` is a string or OpenAI's list of parts."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise ValueError(f"message content must be a string or a list of parts, got {type(content).__name__}")


def _error_message(response: httpx.Response) -> str:
    """vLLM's error body: ``{"error": {"message": ...}}`` now, ``{"message": ...}`` in old releases."""
    try:
        body = response.json()
    except (ValueError, json.JSONDecodeError):
        return response.text[:500]
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict) and "message" in inner:
            return str(inner["message"])
        if "message" in body:
            return str(body["message"])
    return response.text[:500]


async def served_context_window(base_url: str, model: str | None = None) -> int | None:
    """The context in tokens of ``model`` (the only model served, when None) at ``base_url``; None when the server
    does not report one, serves no such model, or does not answer (the caller says what to pass instead)."""
    try:
        async with ReplicaClient(base_url, timeout_s=10.0) as client:
            cards = [card for card in await client.models() if model is None or card.id == model]
    except ServingError:
        return None
    return cards[0].max_model_len if len(cards) == 1 else None
