"""JobLogs' reading of a rank's worker log when Ray's log API refuses (no Ray here)."""

import pytest

from jupyter_trainfactory.errors import JobNotFound
from jupyter_trainfactory.joblogs import JobLogs, _refusal

# what Ray's dashboard answers (HTTP 500) for a pid whose log file it does not list
NOT_LISTED = (
    "Could not find a log file. Please make sure the given option exists in the cluster.\n"
    "\tnode_id: 6ece\n\tfilename: None\n\tpid: 30717\n\tsuffix: out\n\tattempt_number: 0\n"
)
WHERE = {"pid": 30717, "node_id": "6ece", "address": "http://127.0.0.1:1"}


def _logs(answers):
    """JobLogs whose log API answers ``answers[suffix]`` in turn (an exception: refused)."""
    logs = JobLogs(clients=None)
    asked = []

    def chunks(where, suffix, tail, follow=False):
        asked.append(suffix)
        answer = answers[suffix].pop(0) if len(answers[suffix]) > 1 else answers[suffix][0]
        if isinstance(answer, Exception):
            raise answer
        yield answer

    logs.chunks = chunks
    return logs, asked


def test_the_refusal_is_rays_sentence_not_its_last_field():
    assert _refusal(NOT_LISTED).startswith("Could not find a log file.")
    assert _refusal("") == "the log API refused"


def test_a_worker_whose_log_is_not_listed_yet_is_asked_again():
    # a worker that has just started: its node lists its files a moment later
    logs, asked = _logs({"out": [RuntimeError(NOT_LISTED), "step 1\n"], "err": ["warn\n"]})
    assert logs._rank_log(WHERE, tail=50, wait_s=5.0) == "step 1\n\nwarn\n"
    assert asked == ["out", "err", "out", "err"]


def test_a_stream_that_stays_missing_is_left_out_and_both_missing_raise():
    logs, _ = _logs({"out": [RuntimeError(NOT_LISTED)], "err": ["only stderr\n"]})
    assert logs._rank_log(WHERE, tail=50, wait_s=0.0) == "only stderr\n"
    logs, _ = _logs({"out": [RuntimeError(NOT_LISTED)], "err": [RuntimeError(NOT_LISTED)]})
    with pytest.raises(JobNotFound, match="Ray has no log of pid 30717: Could not find a log"):
        logs._rank_log(WHERE, tail=50, wait_s=0.0)


def test_another_refusal_is_not_waited_for():
    logs, asked = _logs({"out": [RuntimeError("agent for node 6ece is down")], "err": ["x"]})
    with pytest.raises(JobNotFound, match="dashboard agent does not answer"):
        logs._rank_log(WHERE, tail=50, wait_s=30.0)
    assert asked == ["out", "err"]
