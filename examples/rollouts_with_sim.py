# %% [markdown]
# # Group rollouts through a serving pool, without a GPU
#
# Two simulated vLLM replicas stand in for a real deployment (swap their URLs for your own
# `terminus-env serve` endpoints). Their "model" plays the reference solution, except that it
# forgets the XML on its first turn: exactly the habit the seed document saw RL lock in. Strict
# training ends those episodes at once with reward 0; lenient evaluation lets them be rescued.
# Run as a script or, with jupytext, as a notebook. Needs Docker and the base image (`make base-image`).

# %%
import asyncio
import contextlib

from terminus_env import load_task
from terminus_env.records.metrics import aggregate
from terminus_env.rollout import RolloutRunner, ServingPolicy
from terminus_env.rollout.policy import oracle_reply
from terminus_env.serving import ServingPool
from terminus_env.serving.sim.server import ServerConfig, SimServer
from terminus_env.tasks import shipped_tasks_dir

tasks = [load_task(shipped_tasks_dir() / name) for name in ("hello-world", "csv-to-json")]
by_instruction = {t.instruction.strip(): t for t in tasks}


def sloppy_model(messages: list[dict]) -> str:
    """Forgets the <response> tags on turn 0, then behaves."""
    turn = sum(m["role"] == "assistant" for m in messages)
    task = next(t for text, t in by_instruction.items() if text in messages[0]["content"])
    return "Sure, I'll do that now." if turn == 0 else oracle_reply(task, turn - 1)


async def run(mode: str):
    async with contextlib.AsyncExitStack() as stack:
        config = ServerConfig(model="sim", time_scale=0.0)
        servers = [await stack.enter_async_context(SimServer(config, sloppy_model)) for _ in range(2)]
        pool = await stack.enter_async_context(ServingPool([s.url for s in servers], "sim"))
        runner = RolloutRunner(ServingPolicy(pool, max_tokens=1024), env_kwargs={"mode": mode}, max_sandboxes=4)
        return await runner.run(tasks, group_size=2)


# %%
for mode in ("train", "eval"):
    trajectories = asyncio.run(run(mode))
    m = aggregate(trajectories)
    print(f"{mode:5}  mean reward {m.mean_reward:.2f}  format errors/rollout {m.mean_format_errors:.2f}  "
          f"opening streak {m.mean_opening_streak:.2f}  rescued {m.rescued_count}  ends {m.end_reasons}")

# %% [markdown]
# Each trajectory keeps, per turn, the token ids and logprobs the engine returned and the replica
# that served it: every turn of a rollout stayed on one replica.

# %%
t = trajectories[0]
print(t.task, t.reward, [turn.replica for turn in t.turns], len(t.turns[0].token_ids or []))
