"""The engine benchmark's closed loop on simulated replicas: a window counted in rollouts is a fixed amount of work."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from routing_lab.chat import ChatRollout, chat_rollouts, write_replies
from routing_lab.closed_loop import Point, Window, run_point
from routing_lab.engines import MODEL_NAME
from routing_lab.knee import QUICK_STEADY
from routing_lab.processes import Processes
from routing_lab.workload import make_workload

from terminus_env.serving.admission import FixedAdmission
from terminus_env.serving.pool import ServingPool
from terminus_env.serving.sim.engine import SimConfig

TIME_SCALE = 0.05  # a simulated second is 50 ms
ENGINE = SimConfig(num_gpu_blocks=1024, block_size=16, max_num_seqs=64, max_model_len=8192)
PROMPTS = 6  # 24 rollouts


async def point(urls: list[str], chats: list[list[ChatRollout]], window: Window, limit: int) -> Point:
    async with ServingPool(urls, MODEL_NAME, policy="requests", admission=FixedAdmission(limit),
                           scrape_interval_s=TIME_SCALE) as pool:  # fmt: skip
        return await run_point(f"fixed {limit}", pool, chats, window, TIME_SCALE)


def test_a_counted_window_measures_a_fixed_number_of_finished_rollouts(tmp_path: Path) -> None:
    config = dataclasses.replace(QUICK_STEADY, batch_size=PROMPTS)
    chats = chat_rollouts(make_workload(config), config.system_prompt_tokens)
    replies = write_replies(chats, tmp_path / "replies.jsonl")
    with Processes(tmp_path) as procs:
        urls = procs.replicas(2, ENGINE, TIME_SCALE, replies, MODEL_NAME, weight_sync=True)
        counted = asyncio.run(point(urls, chats, Window.counted(warmup_rollouts=2, window_rollouts=5), 4))
        with pytest.raises(RuntimeError, match=r"ended after 24 finished rollouts, short of the 4\d "):
            asyncio.run(point(urls, chats, Window.counted(warmup_rollouts=2, window_rollouts=40), 4))
    # The window closes on its fifth finished rollout (others that end at the same instant may join it: at most 4 are
    # in flight), long before the stream's 24 are done.
    assert 5 <= counted.rollouts_done < 5 + 4 and len(counted.final_traces) == counted.rollouts_done
    assert counted.window_s > 0 and counted.tokens_per_s > 0 and counted.counters.requests > 0
    assert counted.in_flight > 0 and counted.limit_max == 4 and counted.load.samples > 0


def test_a_counted_window_takes_no_phases() -> None:
    with pytest.raises(ValueError, match="one phase"):
        Window(0.0, 0.0, phase_s=5.0, window_rollouts=4)
    with pytest.raises(ValueError, match="rollouts to count"):
        Window.counted(warmup_rollouts=2, window_rollouts=0)
