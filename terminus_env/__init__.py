"""terminus-env: terminal tasks as a Gymnasium environment, spoken to in the Terminus 2 protocol."""

__version__ = "0.1.0"
