"""A simulated vLLM replica: the engine model (engine.py), its HTTP surface and a virtual-time cluster."""
