"""A Ray cluster's token: where ``jupyter trainfactory cluster --token-file`` keeps it,
and the one lookup (:func:`find_token`) that every Ray client, HTTP call and proxy of this
project uses."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlparse

from .errors import ClusterUnreachable
from .spec import SpecError

__all__ = [
    "cluster_headers",
    "find_token",
    "save_token",
    "token_file",
    "token_source",
    "verify_token",
]


def token_file(address: str, home: Path | None = None) -> Path:
    """Where the token of the cluster at ``address`` may be kept:
    ``<state dir>/clusters/<host>_<port>.token`` (mode 0600, one line)."""
    from .services import state_dir

    url = urlparse(address)
    port = url.port or (443 if url.scheme == "https" else 80)
    host = re.sub(r"[^A-Za-z0-9.-]", "-", url.hostname or "cluster")
    return (home or state_dir()) / "clusters" / f"{host}_{port}.token"


def save_token(address: str, token: str) -> Path:
    """Keep ``token`` as the cluster's own token file (mode 0600); returns its path.

    Raises SpecError for an empty token."""
    token = token.strip()
    if not token:
        raise SpecError("The token is empty; pass the cluster's token (KubeRay: its Secret).")
    path = token_file(address)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    path.chmod(0o600)
    return path


def _read_token(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def find_token(address: str, embedded_token_path: str = "") -> tuple[str, str]:
    """``(token, where it came from in words)`` for the cluster at ``address``: the one
    token lookup of every Ray client, HTTP call and proxy of this project.

    In this order: ``embedded_token_path`` (the embedded head's token file, given when
    ``address`` is that head), the cluster's own token file (:func:`token_file`, where
    ``jupyter trainfactory cluster --token-file`` keeps it), ``RAY_AUTH_TOKEN``, the file
    named by ``RAY_AUTH_TOKEN_PATH``, then Ray's default ``~/.ray/auth_token``.
    ``("", "nowhere ...")`` when there is none (a cluster without token auth).
    """
    if embedded_token_path and (token := _read_token(Path(embedded_token_path))):
        return token, f"the embedded head's token file {embedded_token_path}"
    path = token_file(address)
    if token := _read_token(path):
        return token, f"its token file {path}"
    if token := os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return token, "RAY_AUTH_TOKEN"
    env_path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if env_path and (token := _read_token(Path(env_path).expanduser())):
        return token, f"RAY_AUTH_TOKEN_PATH ({env_path})"
    if token := _read_token(Path.home() / ".ray" / "auth_token"):
        return token, "~/.ray/auth_token"
    return "", "nowhere (no token was found)"


def token_source(address: str, embedded_token_path: str = "") -> str:
    """Where :func:`find_token` takes the token for ``address`` from, in words."""
    return find_token(address, embedded_token_path)[1]


def verify_token(address: str, token: str, timeout: float = 30.0) -> None:
    """Raise SpecError unless the cluster at ``address`` accepts ``token``
    (ClusterUnreachable when it does not answer)."""
    import requests

    try:
        reply = requests.get(
            f"{address}/api/v0/cluster_metadata",
            headers={"authorization": f"Bearer {token.strip()}"},
            timeout=timeout,
        )
    except requests.RequestException as exc:
        raise ClusterUnreachable(
            f"Cannot reach the Ray cluster at {address} ({type(exc).__name__}); nothing was"
            " kept: check the address (the head's dashboard, port 8265 by default)."
        ) from exc
    if reply.status_code in (401, 403):
        detail = reply.text.strip().splitlines()[0][:120] if reply.text.strip() else ""
        raise SpecError(
            f"The Ray cluster at {address} refused this token (HTTP {reply.status_code}"
            f"{': ' + detail if detail else ''}); nothing was kept: check it (KubeRay: the"
            " auth_token key of the cluster's Secret)."
        )


def cluster_headers(address: str, embedded_token_path: str = "") -> dict[str, str]:
    """The HTTP ``Authorization`` header for the cluster at ``address``, with the token
    :func:`find_token` finds (in its order); empty when there is none."""
    token, _ = find_token(address, embedded_token_path)
    return {"authorization": f"Bearer {token}"} if token else {}
