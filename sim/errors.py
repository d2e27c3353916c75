"""User-facing errors.

Internal protocol errors carry their wire consequence and never reach here; these are the mistakes a
user can fix. ``str()`` of each is one line that names the file or key and says the fix, so the
command line prints it without a traceback.
"""

from __future__ import annotations

from typing import Any


class NcpsimError(Exception):
    """Base of every error the command line reports to the user (exit code 2 or a failed report)."""


class ConfigError(NcpsimError):
    """A values file or other configuration is wrong.

    ``issues`` holds every problem found (``sim.model.values.ValuesIssue``), the message only the first, so a
    caller can print one line by default and all of them on request.
    """

    issues: tuple[Any, ...] = ()


class ScenarioError(NcpsimError):
    """A scenario file is malformed or names something that does not exist."""


class BackendError(NcpsimError):
    """A backend could not bring clusters up or down (missing tool, port clash, failed command)."""
