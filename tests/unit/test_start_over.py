"""A resume of a job that saved no checkpoint starts over as a new job (issue 48,
finding 1): the tags its run opens with, and the sentence said before and after."""

from __future__ import annotations

from jupyter_trainfactory.submission import start_over_sentence, start_over_tags
from jupyter_trainfactory.tracking import TAG


def test_the_new_run_keeps_the_code_and_data_and_none_of_what_the_old_job_did():
    old = {
        TAG.JOB_ID: "tf-0000aaaa",
        TAG.SUBMISSION: "tf-0000aaaa-2",
        TAG.OWNER: "alice",
        TAG.FUNCTION: "train",
        TAG.DASHBOARD: "http://127.0.0.1:8265",
        "mlflow.source.git.commit": "abc123",
        TAG.CODE_FUNCTION_SHA256: "f" * 64,
        f"{TAG.DATA}train": "{}",
        TAG.STATE: "STOPPED",
        TAG.REASON: "user",
        TAG.STEP: "17716",
        TAG.RESUMES: "1",
        TAG.TIMELINE: "[]",
        TAG.STOP: "user",
        "mlflow.runName": "digits",
    }
    tags = start_over_tags(old, "tf-0000bbbb", "tf-0000aaaa")
    assert tags == {
        TAG.OWNER: "alice",
        TAG.FUNCTION: "train",
        TAG.DASHBOARD: "http://127.0.0.1:8265",
        "mlflow.source.git.commit": "abc123",
        TAG.CODE_FUNCTION_SHA256: "f" * 64,
        f"{TAG.DATA}train": "{}",
        TAG.JOB_ID: "tf-0000bbbb",
        TAG.SUBMISSION: "tf-0000bbbb-0",
        TAG.STATE: "PENDING",
        TAG.REASON: "submitted",
        TAG.STARTED_OVER_FROM: "tf-0000aaaa",
    }


def test_the_sentence_names_both_jobs_and_what_stays():
    text = start_over_sentence("tf-0000aaaa", "tf-0000bbbb")
    assert text.startswith("Job tf-0000aaaa saved no checkpoint")
    assert "as job tf-0000bbbb" in text and "record stays as it is" in text
    assert "\n" not in text
