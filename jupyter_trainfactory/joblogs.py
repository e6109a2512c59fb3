"""A job's logs: the driver's (through the Jobs API) and each rank's worker log (through the
Ray dashboard's log API), read once or followed as they grow."""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .errors import JobNotFound
from .jobstate import TERMINAL_STATES
from .rayjobs import RayClients
from .spec import SpecError
from .tracking import TAG

__all__ = ["JobLogs"]

#: Lines Ray writes into worker logs to say which job, actor or task the lines belong to.
_RAY_LOG_MARKERS = (":job_id:", ":actor_name:", ":task_name:", ":task_attempt")


class JobLogs:
    """Reads the logs of jobs recorded in MLflow runs, through ``clients``' clusters."""

    def __init__(self, clients: RayClients):
        self.clients = clients

    def read(self, run, tail: int | None = None, rank: int | None = None) -> str:
        """The driver's log of the job of ``run`` (Ray's output included), or with ``rank``
        that rank's worker log (stdout, then stderr); the last ``tail`` lines if given.

        Raises JobNotFound when Ray has no such log (the job's cluster is gone, or the
        rank never started); ClusterUnreachable when the cluster does not answer."""
        if rank is not None:
            return self._rank_log(self.rank_where(run, rank), tail)
        text = self.driver(run)
        if tail:
            text = "\n".join(text.splitlines()[-tail:])
        return text

    def driver(self, run) -> str:
        """The whole driver log of the job's current submission (see :meth:`read`)."""
        try:
            client = self.clients.jobs_client(run.data.tags.get(TAG.DASHBOARD))
            return client.get_job_logs(run.data.tags[TAG.SUBMISSION])
        except SpecError:
            raise
        except Exception as exc:
            job_id = run.data.tags.get(TAG.JOB_ID, "")
            raise JobNotFound(
                f"Ray has no logs for job {job_id}: {str(exc).splitlines()[0]}"
            ) from exc

    def rank_where(self, run, rank: int) -> dict[str, Any]:
        """Where ``rank``'s worker runs (or last ran): ``pid``, ``node_id``, ``node_ip``
        and the dashboard ``address``. Raises JobNotFound for a rank that never started."""
        tags = run.data.tags
        known = sorted(int(k.removeprefix(TAG.RANK)) for k in tags if k.startswith(TAG.RANK))
        if rank not in known:
            ranks = ", ".join(map(str, known)) or "none has started yet"
            raise JobNotFound(f"Job {tags.get(TAG.JOB_ID)} has no rank {rank} (ranks: {ranks}).")
        where = json.loads(tags[f"{TAG.RANK}{rank}"])
        where["address"] = tags.get(TAG.DASHBOARD) or self.clients.address
        return where

    def chunks(
        self, where: dict[str, Any], suffix: str, tail: int, follow: bool = False
    ) -> Iterator[str]:
        """A worker's log file (``suffix`` ``out`` or ``err``) by pid, through the Ray
        dashboard's log API (``/api/v0/logs``, what ``ray logs`` uses), so it works with
        the dashboard URL alone; the cluster's token goes in the header. Ray's own
        marker lines are left out. Raises RuntimeError when the API refuses."""
        import requests

        address = where.get("address") or self.clients.address
        media = "stream" if follow else "file"
        query = {
            "node_id": where["node_id"],
            "pid": where["pid"],
            "suffix": suffix,
            "lines": tail,
            "media_type": media,
            "timeout": 30,
        }
        with requests.get(
            f"{address.rstrip('/')}/api/v0/logs/{media}",
            params=query,
            headers=self.clients.headers(address),
            stream=True,
            timeout=None if follow else 60,
        ) as reply:
            if reply.status_code != 200:
                raise RuntimeError(_refusal(reply.text))
            for chunk in reply.iter_content(chunk_size=None):
                text = chunk.decode("utf-8", errors="replace")
                yield "".join(
                    line
                    for line in text.splitlines(keepends=True)
                    if not line.startswith(_RAY_LOG_MARKERS)
                )

    def _rank_log(self, where: dict[str, Any], tail: int | None, wait_s: float = 5.0) -> str:
        """The worker's stdout then stderr. A worker that has just started may not have its
        log files listed by its node yet: asks again for up to ``wait_s`` s. A stream
        that stays missing is left out; raises JobNotFound when both are."""
        deadline = time.monotonic() + wait_s
        while True:
            parts, missing = [], []
            for suffix in ("out", "err"):
                try:
                    parts.append(self._worker_log(where, suffix, tail))
                except JobNotFound as exc:
                    missing.append(exc)
            other = [e for e in missing if "could not find a log file" not in str(e).lower()]
            if other:
                raise other[0]
            if not missing or (parts and time.monotonic() > deadline):
                return "\n".join(p for p in parts if p.strip())
            if time.monotonic() > deadline:
                raise missing[0]
            time.sleep(0.5)

    def _worker_log(self, where: dict[str, Any], suffix: str, tail: int | None) -> str:
        try:
            return "".join(self.chunks(where, suffix, tail or -1))
        except Exception as exc:
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if "agent for node" in text.lower():
                text += (
                    " (that node's dashboard agent does not answer: it serves the node's logs;"
                    " several nodes on one machine need their own --dashboard-agent-listen-port)"
                )
            raise JobNotFound(f"Ray has no log of pid {where['pid']}: {text}") from exc

    def follow(
        self,
        read_job: Callable[[], tuple[Any, str]],
        rank: int | None = None,
        write: Callable[[str], Any] = print,
        poll_s: float = 1.0,
    ) -> str:
        """Write the job's driver log (or ``rank``'s worker log) as it grows, until the job
        ends; returns the final state. ``read_job()`` gives the job's run and its state,
        once per poll (every ``poll_s`` s). Follows a rank's new worker after a restart."""
        if rank is None:
            return self._follow_driver(read_job, write, poll_s)
        return _RankFollower(self, rank, write).run(read_job, poll_s)

    def _follow_driver(
        self, read_job: Callable[[], tuple[Any, str]], write: Callable[[str], Any], poll_s: float
    ) -> str:
        seen = 0
        while True:
            run, state = read_job()
            text = self.driver(run)  # the run read once per poll
            if len(text) > seen:
                write(text[seen:].rstrip("\n"))
                seen = len(text)
            if state in TERMINAL_STATES:
                return state
            time.sleep(poll_s)


def _refusal(text: str) -> str:
    """The sentence of the log API's refusal: its first line (Ray follows "Could not find
    a log file ..." with one line per query field)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return (lines or ["the log API refused"])[0][:300]


class _RankFollower:
    """Follows one rank's worker log: a thread per stream of each worker pid seen."""

    def __init__(self, logs: JobLogs, rank: int, write: Callable[[str], Any]):
        self.logs, self.rank, self.write = logs, rank, write
        self.lines: queue.Queue[str] = queue.Queue()
        self.followed: set[int] = set()

    def _pump(self, where: dict[str, Any], suffix: str) -> None:
        try:
            for chunk in self.logs.chunks(where, suffix, 200, follow=True):
                self.lines.put(chunk)
        except Exception:  # the worker is gone; a restart is picked up by the loop
            pass

    def _watch(self, run) -> None:
        """Start following the rank's current worker when it is a new one."""
        with contextlib.suppress(JobNotFound):
            where = self.logs.rank_where(run, self.rank)
            if where["pid"] not in self.followed:
                if self.followed:
                    self.write(f"--- rank {self.rank} restarted: pid {where['pid']} ---")
                self.followed.add(where["pid"])
                for suffix in ("out", "err"):
                    threading.Thread(target=self._pump, args=(where, suffix), daemon=True).start()

    def run(self, read_job: Callable[[], tuple[Any, str]], poll_s: float) -> str:
        while True:
            run, state = read_job()
            self._watch(run)
            # after the end, the last lines: until none came for a second (10 s at most)
            ended = state in TERMINAL_STATES
            deadline = time.monotonic() + (10.0 if ended else poll_s)
            quiet_since = time.monotonic()
            while time.monotonic() < deadline:
                if ended and time.monotonic() - quiet_since > 1.0:
                    break
                with contextlib.suppress(queue.Empty):
                    self.write(self.lines.get(timeout=0.1).rstrip("\n"))
                    quiet_since = time.monotonic()
            if ended:
                return state
