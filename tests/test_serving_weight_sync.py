"""ServingPool.sync_weights over simulated replicas that serve vLLM's weight-update endpoints: what it checks before
anything pauses, what it holds, drains and resets, a replica that fails to load, and a replica that was down.
tests/real_vllm/test_weight_sync.py and test_bad_checkpoints.py do it with real vLLM."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from serving_support import TINY_SHAPES, running_at, until, write_checkpoint

from terminus_env.serving import ReplicaClient, ServingError, ServingPool
from terminus_env.serving.checkpoint import CheckpointError
from terminus_env.serving.client import FRESH_WEIGHT_VERSION
from terminus_env.serving.sim.server import ServerConfig, SimServer
from terminus_env.serving.weight_sync import CheckpointReload

PROMPT = [{"role": "system", "content": "word " * 200}, {"role": "user", "content": "go"}]
PROBE = [{"role": "system", "content": "other " * 200}, {"role": "user", "content": "probe"}]


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def synced(tmp_path) -> ServerConfig:
    """Replicas with the weight-update endpoints, started from a checkpoint folder; real time: a long request takes a
    while."""
    return ServerConfig(model="m", time_scale=1.0, weight_sync=True, root=str(write_checkpoint(tmp_path / "served")))


async def probe_hits(url: str) -> float:
    """Prefix-cache hits of one PROBE request at ``url`` (from the engine's counter)."""
    async with ReplicaClient(url) as client:
        before = (await client.metrics())["0"].prefix_cache_hits_total
        await client.chat("m", PROBE, max_tokens=2)
        return (await client.metrics())["0"].prefix_cache_hits_total - before


def test_a_sync_holds_new_requests_lets_running_ones_finish_and_resets_the_prefix_cache(tmp_path, synced):
    async def main():
        async with SimServer(synced) as a, SimServer(synced) as b, ServingPool([a.url, b.url], "m") as pool:
            await probe_hits(a.url)
            warm = await probe_hits(a.url)
            async with pool.session("long"), pool.session("during"):
                long = asyncio.create_task(pool.chat("long", PROMPT, max_tokens=300, ignore_eos=True))
                await until(lambda: running_at(a, b) == 1, "the long request running at its replica")
                step = write_checkpoint(tmp_path / "step-7")
                sync = asyncio.create_task(pool.sync_weights(CheckpointReload(str(step)), version=7))
                await until(lambda: not pool._open.is_set(), "the sync holding new requests")
                running_when_held = not long.done()
                versions_at_its_end: list[tuple[str | None, str | None]] = []
                long.add_done_callback(lambda _: versions_at_its_end.append((a.weight_version, b.weight_version)))
                during = await pool.chat("during", PROMPT, max_tokens=2)
                report, finished = await sync, await long
            cold = await probe_hits(a.url)
            return warm, cold, report, finished, during, pool.policy_version, (a, b), running_when_held, \
                versions_at_its_end

    warm, cold, report, finished, during, version, servers, running_when_held, versions_at_its_end = run(main())
    assert running_when_held, "the long request (2.4 s) ended before the sync began: no hold to see"
    assert finished.completion_tokens == 300 and finished.policy_version is None  # finished on the old weights
    assert versions_at_its_end == [(FRESH_WEIGHT_VERSION, FRESH_WEIGHT_VERSION)]  # before any replica loaded
    assert during.policy_version == 7 and version == 7
    assert report.version == "7" and set(report.replicas) == {s.url for s in servers} and report.skipped == ()
    assert all(s.weights_path == str((tmp_path / "step-7").resolve()) and s.weight_version == "7" for s in servers)
    assert warm > 0 and cold == 0  # the prefix cached before the sync is not reused after it


def test_a_replica_that_was_down_loads_the_synced_weights_before_it_takes_sessions(tmp_path, synced):
    async def main():
        a, b = SimServer(synced), SimServer(synced)
        await a.start()
        await b.start()
        async with ServingPool([a.url, b.url], "m", scrape_interval_s=0.05) as pool:
            port = b.port
            await b.aclose()
            await pool._scrape_all()
            assert not pool.is_up(b.url)
            report = await pool.sync_weights(CheckpointReload(str(write_checkpoint(tmp_path / "s1"))), version="s1")
            back = SimServer(synced)
            await back.start(port=port)
            await until(lambda: pool.is_up(back.url), "the replica back in the pool")
            up = pool.is_up(back.url)
            await a.aclose()
            await back.aclose()
            return report, up, back

    report, up, back = run(main())
    assert report.skipped == (report.skipped[0],) and report.replicas != report.skipped
    assert up and back.weights_path == str((tmp_path / "s1").resolve()) and back.weight_version == "s1"


def test_replicas_without_the_endpoints_refuse_and_nothing_changes(tmp_path):
    plain = ServerConfig(model="m", time_scale=0.0, root=str(write_checkpoint(tmp_path / "served")))

    async def main():
        async with SimServer(plain) as a, ServingPool([a.url], "m") as pool:
            with pytest.raises(ServingError, match="--weight-sync") as info:
                await pool.sync_weights(CheckpointReload(str(write_checkpoint(tmp_path / "new"))), version=1)
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


def test_serving_policy_turns_record_the_pools_version_unless_the_trainer_names_one(tmp_path, tiny_task_dir, synced):
    from terminus_env import load_task
    from terminus_env.rollout.policy import Rollout, ServingPolicy

    rollout = Rollout("r", "g", load_task(tiny_task_dir))

    async def main():
        async with SimServer(synced) as a, ServingPool([a.url], "m") as pool:
            policy = ServingPolicy(pool, max_tokens=2)
            async with policy.session(rollout):
                before = await policy.act(rollout, PROMPT)
                await pool.sync_weights(CheckpointReload(str(write_checkpoint(tmp_path / "step-3"))), version=3)
                after = await policy.act(rollout, PROMPT)
                policy.policy_version = "trainer-9"
                named = await policy.act(rollout, PROMPT)
            return before.policy_version, after.policy_version, named.policy_version

    assert run(main()) == (None, 3, "trainer-9")


def _bad_checkpoints(tmp_path) -> dict[str, tuple[str, str]]:
    """Checkpoints that cannot replace the served model, and what the refusal must say of each."""
    missing = dict(TINY_SHAPES)
    del missing["model.layers.0.mlp.down_proj.weight"]
    reshaped = {**TINY_SHAPES, "model.layers.0.mlp.down_proj.weight": (8, 8)}
    extra = {**TINY_SHAPES, "model.layers.1.mlp.down_proj.weight": (8, 16)}
    return {
        "missing": (str(write_checkpoint(tmp_path / "missing", missing)),
                    "1 tensor(s) missing: model.layers.0.mlp.down_proj.weight"),
        "reshaped": (str(write_checkpoint(tmp_path / "reshaped", reshaped)),
                     "model.layers.0.mlp.down_proj.weight [8, 8] (served: [8, 16])"),
        "extra": (str(write_checkpoint(tmp_path / "extra", extra)), "the served model does not have"),
        "cut": (str(write_checkpoint(tmp_path / "cut", cut_bytes=12)), "was cut short"),
        "other model": (str(write_checkpoint(tmp_path / "llama", architecture="LlamaForCausalLM")),
                        "architecture LlamaForCausalLM instead of Qwen2ForCausalLM"),
        "no folder": (str(tmp_path / "never-saved"), "no such folder"),
        "not safetensors": (str(tmp_path / "bin"), "no *.safetensors file (found: pytorch_model.bin)"),
    }  # fmt: skip


def test_a_checkpoint_that_cannot_replace_the_served_model_is_refused_before_any_replica_pauses(tmp_path, synced):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"\0")
    bad = _bad_checkpoints(tmp_path)

    async def main():
        async with SimServer(synced) as a, SimServer(synced) as b, ServingPool([a.url, b.url], "m") as pool:
            await pool.sync_weights(CheckpointReload(str(write_checkpoint(tmp_path / "good"))), version=1)
            errors = {}
            for name, (path, _) in bad.items():
                with pytest.raises(CheckpointError) as refused:
                    await pool.sync_weights(CheckpointReload(path), version=2)
                errors[name] = str(refused.value)
            async with pool.session("s"):
                after = await pool.chat("s", PROMPT, max_tokens=2)
            return errors, [(s.pauses, s.weights_path, s.weight_version) for s in (a, b)], after, pool

    errors, replicas, after, pool = run(main())
    for name, (_, expected) in bad.items():
        assert expected in errors[name] and "No replica was touched" in errors[name], (name, errors[name])
    good = str((tmp_path / "good").resolve())
    assert replicas == [(1, good, "1"), (1, good, "1")]  # paused once each, for the good sync only
    assert after.policy_version == 1 and pool.policy_version == 1 and all(pool.is_up(u) for u in pool.replicas)


class _VanishesAfterTheCheck(CheckpointReload):
    """A checkpoint removed between the check and the load (a trainer's clean-up racing the sync): the replicas fail
    to load it halfway, as a disk error would."""

    async def check(self, served: str) -> None:
        await super().check(served)
        shutil.rmtree(self.path)


def test_a_replica_that_fails_to_load_gets_the_last_good_weights_back_and_keeps_its_version(tmp_path, synced):
    async def main():
        async with SimServer(synced) as a, SimServer(synced) as b, ServingPool([a.url, b.url], "m") as pool:
            first = write_checkpoint(tmp_path / "step-1")
            await pool.sync_weights(CheckpointReload(str(first)), version=1)
            with pytest.raises(ServingError, match="no replica took the weights of version 2") as failed:
                await pool.sync_weights(_VanishesAfterTheCheck(str(write_checkpoint(tmp_path / "step-2"))), version=2)
            paused = [await ReplicaClient(s.url).is_paused() for s in (a, b)]
            async with pool.session("s"):
                after = await pool.chat("s", PROMPT, max_tokens=2)
            return failed.value, [(s.weights_path, s.weight_version) for s in (a, b)], paused, after, pool

    error, replicas, paused, after, pool = run(main())
    first = str((tmp_path / "step-1").resolve())
    assert replicas == [(first, "1"), (first, "1")] and paused == [False, False]  # reloaded, tagged, resumed
    assert "serves version 1 again" in str(error) and "serve version 1 as before" in str(error)
    assert after.policy_version == 1 and pool.policy_version == 1 and all(pool.is_up(u) for u in pool.replicas)


class _FailsOnceAt(CheckpointReload):
    """A load that fails at one replica, the first time only (a disk that hiccupped)."""

    def __init__(self, path: str, replica: str) -> None:
        super().__init__(path)
        object.__setattr__(self, "failing", [replica])

    async def load(self, replica) -> None:
        if replica.base_url in self.failing:
            self.failing.remove(replica.base_url)
            raise ServingError(f"{replica.base_url}/collective_rpc: HTTP 500: Worker failed")
        await super().load(replica)


def test_a_replica_that_fails_while_others_load_is_restored_kept_out_and_caught_up(tmp_path, synced):
    """The fleet moves on to the new version on the replicas that took it; the one that failed serves nobody of the
    pool's until it holds the new weights too (meanwhile it serves the old ones, under the old tag, to others)."""

    async def main():
        async with SimServer(synced) as a, SimServer(synced) as b:
            async with ServingPool([a.url, b.url], "m", scrape_interval_s=0.05, catch_up_retry_s=0.0) as pool:
                pool._scraper.cancel()  # scraped by hand below, so that the replica is seen out before it is back
                step = str(write_checkpoint(tmp_path / "step-1"))
                report = await pool.sync_weights(_FailsOnceAt(step, b.url), version=1)
                kept_out, old = not pool.is_up(b.url), (b.weights_path, b.weight_version, b.pauses)
                await pool._scrape_all()
                return report, kept_out, old, pool.is_up(b.url), (b.weights_path, b.weight_version)

    report, kept_out, old, back, caught_up = run(main())
    assert report.skipped == (report.skipped[0],) and kept_out
    assert old == (str((tmp_path / "served").resolve()), FRESH_WEIGHT_VERSION, 1)  # its start weights and tag again
    assert back and caught_up == (str((tmp_path / "step-1").resolve()), "1")


def test_a_new_pool_carries_on_from_the_version_the_replicas_report(tmp_path, synced):
    """A restarted trainer's rows carry the version the replicas hold, not None; replicas that disagree give None."""

    async def main():
        async with SimServer(synced) as a, SimServer(synced) as b:
            async with ServingPool([a.url, b.url], "m") as pool:
                fresh = pool.policy_version
                await pool.sync_weights(CheckpointReload(str(write_checkpoint(tmp_path / "step-12"))), version=12)
            async with ServingPool([a.url, b.url], "m") as again, again.session("s"):
                carried = (again.policy_version, (await again.chat("s", PROMPT, max_tokens=2)).policy_version)
            b.weight_version = "11"
            async with ServingPool([a.url, b.url], "m") as mixed:
                return fresh, carried, mixed.policy_version

    fresh, carried, mixed = run(main())
    assert fresh is None and carried == (12, 12) and mixed is None


def test_a_replica_back_with_other_weights_than_the_pool_can_load_stays_out(tmp_path, synced):
    """A pool that read version 12 from the replicas at start knows no checkpoint for it: a replica restarted since
    (its start weights, tagged 'default') takes no session until a sync gives it the pool's weights."""

    async def main():
        async with SimServer(synced) as a, SimServer(synced) as b:
            a.weight_version = b.weight_version = "12"
            async with ServingPool([a.url, b.url], "m", scrape_interval_s=3600) as pool:  # scraped by hand only
                pool._mark_down(b.url, RuntimeError("restarted"))
                b.weight_version = FRESH_WEIGHT_VERSION
                await pool._scrape_all()  # b answers /health: the scrape that would take it back, and does not
                out_before_sync = not pool.is_up(b.url)
                await pool.sync_weights(CheckpointReload(str(write_checkpoint(tmp_path / "step-13"))), version=13)
                await pool._scrape_all()  # now it loads the pool's weights and comes back
                return out_before_sync, pool.is_up(b.url), b.weight_version

    assert run(main()) == (True, True, "13")


def test_a_sync_named_like_the_broken_tag_is_refused(tmp_path, synced):
    async def main():
        async with SimServer(synced) as a, ServingPool([a.url], "m") as pool:
            with pytest.raises(ValueError, match="tag of a replica that failed"):
                await pool.sync_weights(CheckpointReload(str(write_checkpoint(tmp_path / "x"))), "terminus-env:broken")

    run(main())


def test_the_served_model_may_be_named_by_another_folder(tmp_path):
    """Replicas started from a folder this machine does not see: the check takes ``reference``, or says to give one."""
    elsewhere = ServerConfig(model="m", time_scale=0.0, weight_sync=True, root="/nowhere/on/this/machine")
    served = write_checkpoint(tmp_path / "served-copy")

    async def main():
        async with SimServer(elsewhere) as a, ServingPool([a.url], "m") as pool:
            with pytest.raises(CheckpointError, match=r"reference=FOLDER"):
                await pool.sync_weights(CheckpointReload(str(write_checkpoint(tmp_path / "new"))), version=1)
            await pool.sync_weights(CheckpointReload(str(tmp_path / "new"), reference=str(served)), version=1)
            return a.pauses, pool.policy_version

    assert run(main()) == (1, 1)  # the first was refused before any pause; the second was checked and loaded


def test_a_weight_update_call_whose_connection_dropped_is_sent_again_and_a_refusal_is_not():
    """A replica that dropped the kept-alive connection after a failed reload answered the pool's /resume with a
    ReadError, and both replicas stayed paused: such calls are idempotent and go again; an answer (500) is final."""
    import httpx

    calls: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path == "/resume" and calls.count("/resume") == 1:
            raise httpx.ReadError("[Errno 104] Connection reset by peer")
        if request.url.path == "/collective_rpc":
            return httpx.Response(500, json={"error": {"message": "Worker failed"}})
        return httpx.Response(200, json={"status": "ok"})

    async def main():
        async with ReplicaClient("http://x", transport=httpx.MockTransport(flaky)) as client:
            await client.resume()
            with pytest.raises(ServingError, match="Worker failed"):
                await client.collective_rpc("reload_weights", {"weights_path": "/x"})

    run(main())
    assert calls == ["/resume", "/resume", "/collective_rpc"]
