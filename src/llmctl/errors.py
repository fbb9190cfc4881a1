"""The two ways a command can fail, so the CLI can map each to its exit code (DESIGN §3)."""


class UsageError(Exception):
    """The user asked for something impossible (missing file, bad flag value): exit 2, one line."""


class StageFailed(Exception):
    """The run itself failed (a shard errored under --strict, a worker died): exit 1."""
