"""ServingPool.sync_weights over simulated replicas that serve vLLM's weight-update endpoints: what it holds, what it
drains, what it resets, and a replica that was down. tests/real_vllm/test_weight_sync.py does it with real vLLM."""

from __future__ import annotations

import asyncio
import json

import pytest

from terminus_env.serving import ReplicaClient, ServingError, ServingPool
from terminus_env.serving.sim.server import ServerConfig, SimServer
from terminus_env.serving.weight_sync import CheckpointReload

SYNCED = ServerConfig(model="m", time_scale=1.0, weight_sync=True)  # real time: a long request takes a while
PROMPT = [{"role": "system", "content": "word " * 200}, {"role": "user", "content": "go"}]
PROBE = [{"role": "system", "content": "other " * 200}, {"role": "user", "content": "probe"}]


def run(coro):
    return asyncio.run(coro)


async def probe_hits(url: str) -> float:
    """Prefix-cache hits of one PROBE request at ``url`` (from the engine's counter)."""
    async with ReplicaClient(url) as client:
        before = (await client.metrics())["0"].prefix_cache_hits_total
        await client.chat("m", PROBE, max_tokens=2)
        return (await client.metrics())["0"].prefix_cache_hits_total - before


def test_a_sync_holds_new_requests_lets_running_ones_finish_and_resets_the_prefix_cache(tmp_path):
    async def main():
        async with SimServer(SYNCED) as a, SimServer(SYNCED) as b, ServingPool([a.url, b.url], "m") as pool:
            await probe_hits(a.url)
            warm = await probe_hits(a.url)
            async with pool.session("long"), pool.session("during"):
                long = asyncio.create_task(pool.chat("long", PROMPT, max_tokens=150, ignore_eos=True))
                await asyncio.sleep(0.2)  # at its replica when the sync starts
                sync = asyncio.create_task(pool.sync_weights(CheckpointReload(str(tmp_path)), version=7))
                await asyncio.sleep(0)
                during = await pool.chat("during", PROMPT, max_tokens=2)
                report, finished = await sync, await long
            cold = await probe_hits(a.url)
            return warm, cold, report, finished, during, pool.policy_version, (a, b)

    warm, cold, report, finished, during, version, servers = run(main())
    assert finished.completion_tokens == 150 and finished.policy_version is None  # finished on the old weights
    assert during.policy_version == 7 and version == 7
    assert report.version == "7" and set(report.replicas) == {s.url for s in servers} and report.skipped == ()
    assert report.held_s > 0.2  # held until the running request had drained
    assert all(s.weights_path == str(tmp_path.resolve()) and s.weight_version == "7" for s in servers)
    assert warm > 0 and cold == 0  # the prefix cached before the sync is not reused after it


def test_a_replica_that_was_down_loads_the_synced_weights_before_it_takes_sessions(tmp_path):
    async def main():
        a, b = SimServer(SYNCED), SimServer(SYNCED)
        await a.start()
        await b.start()
        async with ServingPool([a.url, b.url], "m", scrape_interval_s=0.05) as pool:
            port = b.port
            await b.aclose()
            await pool._scrape_all()
            assert not pool.is_up(b.url)
            report = await pool.sync_weights(CheckpointReload(str(tmp_path)), version="s1")
            back = SimServer(SYNCED)
            await back.start(port=port)
            for _ in range(100):
                if pool.is_up(back.url):
                    break
                await asyncio.sleep(0.05)
            up = pool.is_up(back.url)
            await a.aclose()
            await back.aclose()
            return report, up, back

    report, up, back = run(main())
    assert report.skipped == (report.skipped[0],) and report.replicas != report.skipped
    assert up and back.weights_path == str(tmp_path.resolve()) and back.weight_version == "s1"


def test_replicas_without_the_endpoints_refuse_and_nothing_changes(tmp_path):
    async def main():
        async with SimServer(ServerConfig(model="m", time_scale=0.0)) as a, ServingPool([a.url], "m") as pool:
            with pytest.raises(ServingError, match="--weight-sync") as info:
                await pool.sync_weights(CheckpointReload(str(tmp_path)), version=1)
            async with pool.session("s"):
                still = await pool.chat("s", PROMPT, max_tokens=2)  # the replica is not marked down
            return info.value, still, pool.policy_version

    error, still, version = run(main())
    assert "no replica took the weights of version 1" in str(error)
    assert still.completion_tokens == 2 and still.policy_version is None and version is None


def test_a_checkpoint_with_tied_embeddings_is_refused_before_any_replica_is_touched(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "tie_word_embeddings": True}))
    with pytest.raises(ValueError, match="ties its output layer to its embeddings"):
        CheckpointReload(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "tie_word_embeddings": False}))
    assert CheckpointReload(str(tmp_path)).path == str(tmp_path.resolve())


def test_serving_policy_turns_record_the_pools_version_unless_the_trainer_names_one(tmp_path, tiny_task_dir):
    from terminus_env import load_task
    from terminus_env.rollout.policy import Rollout, ServingPolicy

    rollout = Rollout("r", "g", load_task(tiny_task_dir))

    async def main():
        async with SimServer(SYNCED) as a, ServingPool([a.url], "m") as pool:
            policy = ServingPolicy(pool, max_tokens=2)
            async with policy.session(rollout):
                before = await policy.act(rollout, PROMPT)
                await pool.sync_weights(CheckpointReload(str(tmp_path)), version=3)
                after = await policy.act(rollout, PROMPT)
                policy.policy_version = "trainer-9"
                named = await policy.act(rollout, PROMPT)
            return before.policy_version, after.policy_version, named.policy_version

    assert run(main()) == (None, 3, "trainer-9")
