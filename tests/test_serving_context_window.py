"""The context a server reports for its model (``/v1/models``), read from a simulated vLLM replica over real HTTP."""

from __future__ import annotations

import asyncio

from terminus_env.serving.client import served_context_window
from terminus_env.serving.serve_process import free_ports
from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.server import ServerConfig, SimServer


def test_the_context_is_the_model_cards_max_model_len() -> None:
    async def main():
        config = ServerConfig(model="policy", time_scale=0.0, engine=SimConfig(max_model_len=4096))
        async with SimServer(config) as server:
            return [await served_context_window(url, model) for url, model in
                    [(server.url, "policy"), (server.url + "/v1/", None), (server.url, "another-model")]]  # fmt: skip

    assert asyncio.run(main()) == [4096, 4096, None]  # the served model, the only one; a model it does not serve


def test_a_server_that_does_not_answer_reports_no_context() -> None:
    assert asyncio.run(served_context_window(f"http://127.0.0.1:{free_ports(1)}")) is None
