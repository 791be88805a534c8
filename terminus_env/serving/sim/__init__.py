"""A simulated vLLM replica: the engine model (engine.py) and its HTTP surface (server.py).

The routing benchmarks' virtual-time cluster and workload live in ``bench/routing_lab``."""
