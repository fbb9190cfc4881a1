"""Moved: the task-file reader is llmctl/tasks/files.py. This name stays for callers that have not
moved yet (train/plots.py)."""

from llmctl.tasks.files import read_records, where

__all__ = ["read_records", "where"]
