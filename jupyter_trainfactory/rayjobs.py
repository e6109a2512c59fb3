"""Ray clients of one job manager: Jobs API clients per cluster (cached), the headers of
plain HTTP calls (one token lookup: :func:`~.raytoken.find_token`), the cluster's nodes,
a submission's status, and the one-sentence :class:`~.errors.ClusterUnreachable` when a
cluster does not answer."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from .cluster import ClusterInfo, describe
from .errors import ClusterRefused, ClusterUnreachable
from .raytoken import cluster_headers, token_source
from .sentences import first_line
from .services import ServiceProcess, Services
from .spec import SpecError
from .tracking import TAG

__all__ = ["RayClients", "local_head_alive"]

#: Seconds to wait for another cluster's dashboard (the jobs of that cluster in a list), and
#: before asking one that did not answer again.
PROBE_TIMEOUT_S = 5.0
UNREACHABLE_RETRY_S = 60.0


def local_head_alive(head: str) -> bool:
    """Whether the embedded Ray head recorded as ``pid:start_time`` still runs."""
    pid, _, created = head.partition(":")
    try:
        return ServiceProcess("ray", int(pid), float(created), "", "").alive()
    except ValueError:
        return False


class RayClients:
    """The Ray side of a job manager whose own cluster is the dashboard at ``address``.

    Parameters
    ----------
    address : str
        The Ray dashboard (Jobs API) URL of the manager's cluster, ``http://host:8265``.
    services : Services, optional
        The embedded services when ``address`` is the embedded head (its token file is
        then the token); None for another cluster.
    """

    def __init__(self, address: str, services: Services | None = None):
        self.address = address
        self.services = services
        self._clients: dict[str, Any] = {}
        self._unreachable: dict[str, tuple[float, str]] = {}  # address -> (when, why)

    @property
    def local(self) -> bool:
        """Whether the manager's cluster is the embedded local head."""
        return self.services is not None

    def _embedded_token(self, address: str) -> str:
        return self.services.token_path if self.local and address == self.address else ""

    def local_head(self) -> str:
        """``pid:start_time`` of the embedded Ray head, "" for other clusters."""
        if not self.local:
            return ""
        head = self.services.processes["ray"]
        return f"{head.pid}:{head.create_time}"

    def headers(self, address: str) -> dict[str, str]:
        """The ``Authorization`` header of any call to the cluster at ``address`` (empty
        when no token is found: a cluster without token auth)."""
        return cluster_headers(address, self._embedded_token(address))

    def jobs_client(self, address: str | None = None):
        """A ``JobSubmissionClient`` for the cluster at ``address`` (default: the manager's),
        cached. Raises ClusterUnreachable (one sentence) when it does not answer (ClusterRefused when it
        refuses the token); another
        cluster that did not is not asked again for :data:`UNREACHABLE_RETRY_S`."""
        address = address or self.address
        client = self._clients.get(address)
        if client is not None:
            return client
        failed = self._unreachable.get(address)
        if failed and time.monotonic() - failed[0] < UNREACHABLE_RETRY_S:
            raise type(failed[1])(str(failed[1]))
        try:  # Ray's client waits without a timeout on an address that does not answer
            import requests

            # this manager's own cluster may be busy (a loaded head); others' jobs only list
            own = address == self.address
            requests.get(f"{address}/api/version", timeout=30.0 if own else PROBE_TIMEOUT_S)
        except Exception as exc:
            error = self.unreachable(address, exc)
            if address != self.address:  # another cluster's jobs: ask again in a minute
                self._unreachable[address] = (time.monotonic(), error)
            raise error from exc
        import ray._private.runtime_env.packaging as packaging
        import ray.dashboard.modules.dashboard_sdk as sdk
        import ray.dashboard.modules.job.sdk as job_sdk
        from ray.job_submission import JobSubmissionClient

        # Ray's upload chatter belongs in the job's logs, not in the notebook.
        for logger in (sdk.logger, job_sdk.logger, packaging.default_logger):
            logger.setLevel(logging.WARNING)
        try:
            client = JobSubmissionClient(address, headers=self.headers(address) or None)
        except Exception as exc:
            raise self.unreachable(address, exc) from exc
        self._clients[address] = client
        return client

    def unreachable(self, address: str, exc: BaseException) -> SpecError:
        """The error (one sentence) for the cluster at ``address`` that did not answer
        (ClusterUnreachable) or refused the token (ClusterRefused) with ``exc``."""
        import requests

        text = str(exc).strip()
        if "authentication" in text.lower() or "401" in text[:40] or "403" in text[:40]:
            first = first_line(text)
            return ClusterRefused(
                f"The Ray cluster at {address} refused the request ({first}); the token came"
                f" from {token_source(address, self._embedded_token(address))}: keep the"
                f" cluster's own with `jupyter trainfactory cluster --address {address}"
                " --token-file FILE`."
            )
        if isinstance(exc, requests.Timeout):
            first = "no answer in time"
        elif isinstance(exc, requests.ConnectionError):
            reason = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
            first = f"nothing answers there ({reason.group(1) if reason else 'no connection'})"
        else:
            first = first_line(exc, 300)
        hint = (
            self._local_log_hint()
            if self.local and address == self.address
            else "; check the address (the head's dashboard, port 8265 by default) and that"
            " this machine reaches it (KubeRay: kubectl port-forward svc/CLUSTER-head-svc 8265)"
        )
        return ClusterUnreachable(f"Cannot reach the Ray cluster at {address}: {first}{hint}.")

    def cluster(self, settle_s: float = 45.0) -> ClusterInfo:
        """The manager's cluster: versions, and every alive node's host, total resources
        and labels (:class:`~.cluster.ClusterInfo`).

        A head started a moment ago lists itself before its resources are registered;
        such a list (every node empty) is read again for up to ``settle_s`` seconds.
        Raises ClusterUnreachable when the cluster does not answer, ClusterRefused when it
        refuses the token.
        """
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        deadline = time.monotonic() + settle_s
        headers = self.headers(self.address)
        while True:
            try:
                client = StateApiClient(address=self.address, headers=headers or None)
                nodes = client.list(
                    StateResource.NODES,
                    options=ListApiOptions(filters=[("state", "=", "ALIVE")], detail=True),
                    raise_on_missing_output=False,
                )
            except Exception as exc:  # the head is gone or overloaded: one sentence
                raise self._no_answer(exc) from exc
            if any(n.resources_total for n in nodes) or time.monotonic() > deadline:
                return describe(self.address, headers, nodes)
            time.sleep(0.5)

    def _local_log_hint(self) -> str:
        """Where the embedded head's log is and how to restart it (for a local head)."""
        proc = self.services.processes.get("ray") if self.services else None
        if proc is None:
            return ""
        return (
            f"; its log is {proc.log} (`jupyter trainfactory services stop` then retry restarts it)"
        )

    def _no_answer(self, exc: BaseException) -> SpecError:
        if "authentication" in str(exc).lower():
            return self.unreachable(self.address, exc)
        where = self._local_log_hint() if self.local else ""
        first = first_line(exc)
        return ClusterUnreachable(
            f"The Ray cluster at {self.address} does not answer ({first}){where}."
        )

    def status(self, tags: dict[str, str]) -> tuple[str | None, str]:
        """(Ray's job status, Ray's message) of the current submission of the job whose
        run has ``tags``.

        The status is None when the job is gone for good (Ray does not know the
        submission, or the local head that ran it has stopped), and ``"UNKNOWN"`` when
        the job ran on a cluster this manager does not talk to. Raises ClusterUnreachable
        when the manager's own cluster does not answer.
        """
        address = tags.get(TAG.DASHBOARD, self.address)
        head = tags.get(TAG.LOCAL_HEAD, "")
        if address != self.address and head:  # another state directory's embedded head
            if not local_head_alive(head):
                return (
                    None,
                    f"the local Ray head that ran it (pid {head.split(':')[0]}) has stopped",
                )
            return "UNKNOWN", f"the job ran on another local Ray head ({address})"
        try:
            client = self.jobs_client(address)
        except SpecError as exc:  # ClusterUnreachable or ClusterRefused
            if address == self.address:
                raise
            return "UNKNOWN", f"its cluster does not answer: {exc}"
        try:
            info = client.get_job_info(tags.get(TAG.SUBMISSION, ""))
        except Exception as exc:  # 404: the cluster does not know this submission
            return None, str(exc).splitlines()[0] if str(exc) else ""
        status = info.status.value if hasattr(info.status, "value") else info.status
        return str(status), info.message or ""
