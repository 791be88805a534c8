"""``ServingPool.sync_weights`` on real replicas: new weights everywhere, checked against ``transformers``."""

from __future__ import annotations

import asyncio

import torch
from transformers import AutoModelForCausalLM
from vllm_support import MODEL_NAME, expected_logprobs, perturbed, probe

from terminus_env.serving import ReplicaClient, ServingPool
from terminus_env.serving.weight_sync import CheckpointReload


async def sent_to_a_replica(pool: ServingPool, request: asyncio.Task) -> None:
    """Until the pool has sent ``request``, the only one, to a replica: from then on a weight sync waits for it to
    finish. (Watching for it in an engine's ``/metrics`` raced the reply: a replica busy writing it answered no
    scrape before it was done, on a loaded host.)"""
    while pool.requests_at_replicas == 0:
        if request.done():
            raise AssertionError(f"the request ended before it was sent: {request.result()}")
        await asyncio.sleep(0)  # the same event loop: the request's task runs up to its HTTP call in between


LONG_TOKENS = 4000  # the in-flight reply: as long as the fleet's context allows (4,096), still running at the sync


def test_sync_weights_loads_every_replica_resets_the_prefix_cache_and_tags_versions(fleet, model_dir, tmp_path):
    old = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    new = perturbed(model_dir, tmp_path / "step-1")

    async def main():
        async with ServingPool(fleet.urls, MODEL_NAME, scrape_interval_s=0.5) as pool:
            for url in fleet.urls:  # warm each prefix cache with the prompt, on the old weights
                await probe(url)
                _, hits = await probe(url)
                assert hits > 0
            async with pool.session("long"):
                in_flight = asyncio.create_task(
                    pool.chat("long", [{"role": "user", "content": "go"}], max_tokens=LONG_TOKENS, ignore_eos=True)
                )
                await sent_to_a_replica(pool, in_flight)  # at the replica when the sync starts
                sync = asyncio.create_task(pool.sync_weights(CheckpointReload(str(tmp_path / "step-1")), version=1))
                await asyncio.sleep(0)
                async with pool.session("during"):  # held until the new weights are in
                    during = await pool.chat("during", [{"role": "user", "content": "and now?"}], max_tokens=4)
                report = await sync
                finished_old = await in_flight
            after = [await probe(url) for url in fleet.urls]
            versions = []
            for url in fleet.urls:
                async with ReplicaClient(url) as client:
                    versions.append(await client.weight_version())
            back = await pool.sync_weights(CheckpointReload(str(model_dir)), version=2)  # the other tests' weights
            return report, finished_old, during, after, versions, back

    report, finished_old, during, after, versions, back = asyncio.run(main())
    print(f"\nweight sync (tiny model, 2 replicas): held {report.held_s:.3f}s, load {report.load_s:.3f}s")
    assert report.replicas == tuple(fleet.urls) and report.skipped == () and report.version == "1"
    assert back.version == "2" and back.replicas == tuple(fleet.urls)
    # In flight at the sync: finished whole, on the old weights, with the old version.
    assert finished_old.completion_tokens == LONG_TOKENS and finished_old.policy_version is None
    assert during.policy_version == 1 and versions == ["1", "1"]
    for c, hits in after:
        assert hits == 0  # no KV computed with the old weights was reused
        got = torch.tensor(c.logprobs)
        assert torch.allclose(got, expected_logprobs(new, c.prompt_token_ids, c.token_ids), atol=2e-3)
        assert not torch.allclose(got, expected_logprobs(old, c.prompt_token_ids, c.token_ids), atol=2e-3)
