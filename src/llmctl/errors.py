"""The two ways a command can fail, so the CLI can map each to its exit code (docs/design.md §3)."""


class UsageError(Exception):
    """The user asked for something impossible (missing file, bad flag value): exit 2, one line."""


class StageFailed(Exception):
    """The run itself failed (a shard errored under --strict, a worker died): exit 1."""


class Interrupted(Exception):
    """A long run stopped cleanly on SIGTERM/SIGINT after saving its state: exit 128 + signal."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
