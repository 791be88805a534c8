"""What a server says of the model it serves (``GET /v1/models``): its context, for the eval's summarization rule and
per-turn token limit.

vLLM's model card holds ``max_model_len``; an OpenAI-compatible server that does not report it gives None, and the
caller says what to pass instead.
"""

from __future__ import annotations

import httpx

_TIMEOUT_S = 10.0


async def served_context_window(base_url: str, model: str | None = None) -> int | None:
    """The context in tokens of ``model`` (the only model served, when None) at ``base_url`` (``http://host:port``,
    with or without ``/v1``); None when the server does not report one or does not answer."""
    url = base_url.rstrip("/").removesuffix("/v1") + "/v1/models"
    try:
        async with httpx.AsyncClient(timeout=_TIMEOUT_S) as http:
            response = await http.get(url)
        cards = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(cards, list):
        return None
    chosen = [c for c in cards if isinstance(c, dict) and (model is None or c.get("id") == model)]
    value = chosen[0].get("max_model_len") if len(chosen) == 1 else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
