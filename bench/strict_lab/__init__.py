"""The strict-against-lenient experiment's own machinery, kept out of the library (``bench/strict_vs_lenient.py``):
demonstrations recorded from real episodes, the supervised start, the GRPO runs, their analysis and figure."""
