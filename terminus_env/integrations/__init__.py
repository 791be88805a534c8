"""Adapters for the RL libraries terminal agents are trained with, each behind an extra named after it.

- :mod:`terminus_env.integrations.trl`: ``make_rollout_func`` for TRL's ``GRPOTrainer(rollout_func=...)``
  and ``env_reward``, a reward function reading the env's reward (``pip install 'terminus-env[trl]'``).
- :mod:`terminus_env.integrations.verl`: ``TerminusAgentLoop``, a verl agent loop registered as
  ``terminus`` (``[verl]``).
- :mod:`terminus_env.integrations.skyrl`: ``TerminusGenerator``, SkyRL's step-wise generator, and
  ``TerminusTextEnv``, a ``skyrl_gym`` text env (``[skyrl]``, Python >= 3.12).

Each drives the env through its async API on the caller's event loop; the token data comes from
:mod:`terminus_env.training`, built from the engine's token ids. Importing this package imports no
library; each submodule imports its own.
"""
