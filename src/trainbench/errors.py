"""Errors that are the user's to fix, raised with messages that say where and how."""

from __future__ import annotations


class ConfigError(Exception):
    """A mistake in config.yaml (or a target naming something that does not exist)."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        shown = self.problems[:12]
        more = len(self.problems) - len(shown)
        text = "\n".join(f"  - {p}" for p in shown) + (f"\n  ... and {more} more" if more > 0 else "")
        super().__init__(f"invalid configuration:\n{text}")


class UsageError(ConfigError):
    """A command given something that does not exist or cannot be used (a file, a folder, a GPU type)."""

    def __init__(self, problem: str):
        super().__init__(problem)
        Exception.__init__(self, problem)
