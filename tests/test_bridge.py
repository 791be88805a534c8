"""The process-wide background loop: every sync env runs on it, so sync envs can share one warm SandboxPool."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading

import pytest

from terminus_env import TerminusEnv, load_task
from terminus_env.sandbox import SandboxPool
from terminus_env.utils.bridge import BackgroundLoop, shared_loop

WRITE_AND_FINISH = (
    "<response><analysis>Write it.</analysis><plan>Write the file.</plan>"
    '<commands><keystrokes duration="1">echo hello > /app/hello.txt\n</keystrokes></commands>'
    "<task_complete>true</task_complete></response>"
)


def test_the_shared_loop_is_one_loop_for_every_caller_and_thread():
    loop = shared_loop()
    assert shared_loop() is loop

    async def which() -> asyncio.AbstractEventLoop:
        await asyncio.sleep(0.01)
        return asyncio.get_running_loop()

    seen: list[asyncio.AbstractEventLoop] = []
    threads = [threading.Thread(target=lambda: seen.append(loop.run(which()))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(seen) == 4 and len(set(seen)) == 1 and seen[0] is loop.loop


def test_a_forked_child_gets_a_fresh_shared_loop():
    parent = shared_loop()
    parent.run(asyncio.sleep(0))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's loop thread does not exist here, so a new loop must serve
        try:
            ok = shared_loop() is not parent and shared_loop().run(asyncio.sleep(0, result=7)) == 7
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"


@pytest.mark.usefixtures("docker_required")
def test_sync_envs_share_one_warm_sandbox_pool(tiny_task_dir):
    task = load_task(tiny_task_dir)
    pool = SandboxPool(warm_per_spec=1)
    envs = [TerminusEnv(task, mode="eval", sandbox_pool=pool) for _ in range(2)]
    try:
        for env in envs:
            env.reset()
        shared_loop().run(pool.wait_warm())
        spec = task.sandbox_spec(envs[0]._image)
        assert pool.warm_count(spec) == 1  # refilled on the shared loop while both episodes run
        for env in envs:  # both episodes' sandboxes answer on the one loop that started them
            _, _, terminated, _, info = env.step(WRITE_AND_FINISH)
            assert not terminated and info["format_error"] is None
            _, reward, terminated, _, info = env.step(WRITE_AND_FINISH)
            assert terminated and reward == 1.0 and info["end_reason"] == "task_complete"
        third = TerminusEnv(task, mode="eval", sandbox_pool=pool)
        envs.append(third)
        third.reset()  # takes the warm sandbox that was started for the others
        _, _, _, _, info = third.step(WRITE_AND_FINISH)
        assert info["format_error"] is None
    finally:
        for env in envs:
            with contextlib.suppress(Exception):
                env.close()
        shared_loop().run(pool.aclose())


def test_an_interrupted_call_is_cancelled_and_waited_for_before_the_interruption_goes_on():
    """Ctrl-C while a sync call waits (a KeyboardInterrupt in the waiting thread): the coroutine must not run on
    beside the next call on the same terminal. It is cancelled, and its clean-up has ended when the interruption
    reaches the caller."""
    loop = BackgroundLoop("terminus-env-test-loop")
    seen: list[str] = []

    async def long_call() -> None:
        try:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # Ctrl-C while run() waits
            await asyncio.Event().wait()  # never set: only a cancellation ends this call
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # a clean-up that takes a while (a sandbox's request to finish)
            seen.append("cleaned up")
            raise

    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run(long_call())
        assert seen == ["cleaned up"]
        assert loop.run(asyncio.sleep(0, result="next")) == "next"  # the loop serves the next call
    finally:
        loop.close()
