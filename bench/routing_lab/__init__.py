"""The routing benchmarks' own machinery, kept out of the library: the agentic RL workload, the
virtual-time cluster that serves it through the production :class:`Scheduler`, and the harness that
serves it over real HTTP through real router processes."""
