"""Filter steps. Importing this package registers every step under its config name."""

from llmctl.data.filters import c4, classifier, fineweb, gopher, simple  # noqa: F401  (registration)
from llmctl.data.filters.base import STEPS, Step, all_stats, build_step, first_failure
from llmctl.data.filters.doc import Doc

__all__ = ["STEPS", "Step", "Doc", "all_stats", "build_step", "first_failure"]
