"""How a real router places new sessions: after earlier sessions have finished, and while long ones run.

Starts four simulated replicas and one router (default: vllm-router's ``sticky_least_loaded``) and prints which
replica served each turn, from the replicas' ``x-sim-replica`` header. It answers one question the HTTP benchmark
raised: does "least loaded" count a replica's live sessions, its requests in flight, or every session it was ever
given? For vllm-router it also ends sessions with ``POST /finish_session?session_id=``, as its users do.

    .venv/bin/python bench/router_placement.py [--router vllm-router] [--policy sticky_least_loaded]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

import httpx
from routing_lab.http_run import finish_session
from routing_lab.processes import Processes, RouterSpec

from terminus_env.serving.sim.engine import SimConfig
from terminus_env.serving.sim.server import REPLICA_HEADER


async def turn(http: httpx.AsyncClient, url: str, header: str, session: str, max_tokens: int) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": f"hello {session}"}], "max_tokens": max_tokens,
            "ignore_eos": True}  # fmt: skip
    response = await http.post(f"{url}/v1/chat/completions", json=body, headers={header: session})
    response.raise_for_status()
    return response.headers[REPLICA_HEADER].rsplit(":", 1)[1]


async def probe(url: str, header: str, finish: bool) -> None:
    async with httpx.AsyncClient(timeout=120) as http:
        first = [await turn(http, url, header, f"short-{i}", 2) for i in range(8)]
        print("8 sessions one after another, each finished before the next starts:", first)
        print("their second turns:", [await turn(http, url, header, f"short-{i}", 2) for i in range(8)])
        long = [asyncio.create_task(turn(http, url, header, f"long-{i}", 400)) for i in range(2)]
        await asyncio.sleep(0.5)
        new = [await turn(http, url, header, f"new-{i}", 2) for i in range(6)]
        print("6 new sessions while 2 long ones run:", new, "- the long ones ran on", await asyncio.gather(*long))
        if finish:
            ended = []
            for i in range(8):
                ended.append(await turn(http, url, header, f"ended-{i}", 2))
                await finish_session(http, url, f"ended-{i}")
            print("8 sessions one after another, each ended with /finish_session (as deployed):", ended)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--router", default="vllm-router", choices=["vllm-router", "sglang-router"])
    parser.add_argument("--policy", default="sticky_least_loaded")
    args = parser.parse_args()
    spec = RouterSpec(args.router, args.policy)
    with tempfile.TemporaryDirectory() as tmp, Processes(Path(tmp)) as procs:
        replies = Path(tmp) / "replies.jsonl"
        replies.write_text('{"reply": "ok"}\n')
        urls = procs.replicas(4, SimConfig(), 1.0, replies, "m")  # time scale 1: a 400-token turn takes seconds
        print("replicas (by port):", [u.rsplit(":", 1)[1] for u in urls])
        asyncio.run(probe(procs.router(spec, urls), spec.session_header, spec.finishes_sessions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
