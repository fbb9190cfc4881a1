"""llmctl: a Unix-style toolchain from web crawl to a trained, evaluated, RL-tuned model."""

__version__ = "0.1.0"
