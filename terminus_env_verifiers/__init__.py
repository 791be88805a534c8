"""The verifiers plugin module: verifiers imports a taskset or env by id (``terminus-env-verifiers``) as a top-level
module and takes the classes its ``__all__`` exports. The code is in :mod:`terminus_env.integrations.verifiers`."""

from terminus_env.integrations.verifiers import TerminusTaskset, TerminusVfEnv

__all__ = ["TerminusTaskset", "TerminusVfEnv"]
