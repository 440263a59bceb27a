"""The one error type for bad user input (files, flags, widget values).

The CLI turns it into one line on stderr and exit status 2; widgets show it inline.
The line names the file and the field: ``plan.yaml: calls.actor_gen.tp: 3 does not divide ...``.
"""

from __future__ import annotations


class ConfigError(ValueError):
    def __init__(self, message: str, field: str = "", source: str = ""):
        self.message, self.field, self.source = message, field, source
        super().__init__(_one_line(": ".join(str(p) for p in (source, field, message) if p)))

    def within(self, prefix: str) -> "ConfigError":
        """The same error with its field nested under `prefix` (``prefix.field``)."""
        field = f"{prefix}.{self.field}" if self.field else prefix
        return ConfigError(self.message, field, self.source)

    def in_file(self, source: str) -> "ConfigError":
        """The same error in file `source`, unless it already names the file where the problem
        lies (a checkpoint folder or data file that a scenario refers to)."""
        return ConfigError(self.message, self.field, self.source or source)


def _one_line(text: str) -> str:
    """Escape what would break the one-line promise (newlines, other control characters)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
