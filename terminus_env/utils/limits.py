"""The bounds of every number a task or a sandbox spec may hold, so that what loads can also run.

Docker takes CPUs in nano-CPUs and memory in bytes, and asyncio takes seconds as floats: a value far outside
these bounds would overflow there (``cpus = 1e300``) long after loading. Loading refuses it instead, by name.
"""

from __future__ import annotations

MIN_CPUS, MAX_CPUS = 0.01, 1024.0
MIN_MEMORY_MB, MAX_MEMORY_MB = 16, 16 * 1024 * 1024
MIN_STORAGE_MB, MAX_STORAGE_MB = 1, 1024 * 1024 * 1024
MIN_PIDS, MAX_PIDS = 16, 1 << 22
MAX_TIMEOUT_S = 7 * 24 * 3600.0
"""Agent, verifier and build timeouts; a sandbox lives for their sum, so each stays well below its lifetime."""
MAX_LIFETIME_S = 30 * 24 * 3600.0
