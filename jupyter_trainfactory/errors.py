"""The job manager's errors by kind, so that a caller decides by type (the side panel: 404,
503 or 409), never by the words of a message.

Each is one sentence for the user. The outages are :class:`~.spec.SpecError`\\ s, so every
door that shows a SpecError shows them as before.
"""

from __future__ import annotations

from .spec import SpecError

__all__ = [
    "ClusterRefused",
    "ClusterUnreachable",
    "JobNotFound",
    "TrackingUnreachable",
    "Unreachable",
]


class JobNotFound(LookupError):
    """No job with this id is known to the tracking server (or Ray has no log of it)."""


class Unreachable(SpecError):
    """A service the job manager needs did not answer, or refused its credentials."""


class ClusterUnreachable(Unreachable):
    """The Ray cluster's dashboard (Jobs API) did not answer or refused the token."""


class TrackingUnreachable(Unreachable):
    """The MLflow tracking server did not answer (no run could be created)."""


class ClusterRefused(SpecError):
    """The Ray cluster answered but refused the request's token (HTTP 401 or 403)."""
