# %% [markdown]
# # terminus-env quickstart
#
# One shipped task, driven by hand through the Terminus 2 protocol. Run it as a script
# (`python examples/quickstart.py`) or open it as a notebook with jupytext (`# %%` cells).
# It needs a Docker engine and the local base image: `make base-image` sets both up.

# %%
from terminus_env import Reply, TerminusEnv

env = TerminusEnv("hello-world", mode="eval")  # eval: lenient, like Terminal-Bench
obs, info = env.reset()
print(obs[-1500:])

# %% [markdown]
# A broken turn (no `<response>`) is rejected: nothing runs, and in eval mode the model is told why.
# In train mode (`SWE_STRICT_FORMAT=1`, the default) the episode would end here with reward 0.

# %%
obs, reward, terminated, truncated, info = env.step("Let me create the file.")
print(info["format_error"], "| format errors so far:", info["format_errors"])

# %%
REPLY = """<response>
<analysis>The file does not exist yet.</analysis>
<plan>Write it with printf, then check it.</plan>
<commands>
<keystrokes duration="1.0">printf 'Hello, world!\\n' > /app/hello.txt && cat /app/hello.txt
</keystrokes>
</commands>
<task_complete>true</task_complete>
</response>"""
obs, reward, terminated, truncated, info = env.step(REPLY)
print(obs[-800:])  # the env asks us to confirm completion

# %%
obs, reward, terminated, truncated, info = env.step(Reply(text=REPLY, finish_reason="stop"))
print("reward", reward, "| end:", info["end_reason"])
print(info["episode"])  # rescued=True: a format error, yet reward > 0 -- the pattern strict training forbids
env.close()
