"""Who holds a cluster's resources, from Ray's own state records (no cluster needed)."""

from __future__ import annotations

from ray.util.state.common import ActorState, PlacementGroupState

from jupyter_trainfactory.holders import Holding, held_by, holdings, holdings_text
from jupyter_trainfactory.jobstate import pending_reason, waiting_line
from jupyter_trainfactory.spec import JobSpec
from ray_backend.driver import workers_reason
from ray_backend.waiting import workers_wait


def _group(job_id, bundles, state="CREATED"):
    return PlacementGroupState(
        placement_group_id=f"pg{job_id}{len(bundles)}",
        name="",
        creator_job_id=job_id,
        state=state,
        bundles=[
            {
                "bundle_id": f"b{i}",
                "unit_resources": b,
                "node_id": "" if state == "PENDING" else "n",
            }
            for i, b in enumerate(bundles)
        ],
        is_detached=False,
        stats=None,
    )


def _actor(job_id, resources, group=None, state="ALIVE", name="RunRecorder"):
    return ActorState(
        actor_id=f"a{job_id}{name}",
        class_name=name,
        state=state,
        job_id=job_id,
        name="",
        node_id="n",
        pid=1,
        ray_namespace="",
        required_resources=resources,
        placement_group_id=group,
    )


class _Job:  # a JobState's two fields read here
    def __init__(self, job_id, submission_id):
        self.job_id, self.submission_id = job_id, submission_id


JOBS = [_Job("02000000", "tf-0127dacc-1"), _Job("03000000", "raysubmit_abc"), _Job("04", None)]


def test_groups_and_free_standing_actors_count_by_job_in_the_names_users_know():
    groups = [
        _group("02000000", [{"CPU": 1.0, "memory": 1e6}, {"CPU": 1.0}]),  # two workers
        _group("03000000", [{"GPU": 1.0, "CPU": 1.0}]),
        _group("05000000", [{"CPU": 4.0}], state="REMOVED"),  # gone: holds nothing
        _group("08000000", [{"CPU": 2.0}], state="PENDING"),  # waits itself: holds nothing
        _group("02000000", [{"memory": 1048576.0}]),  # a Tune trial's: nothing waited for
    ]
    actors = [
        _actor("02000000", {"CPU": 1.0}),  # outside any group: holds its own
        _actor("02000000", {"CPU_group_0_pg": 1.0}, group="pg020000002"),  # in a group
        _actor("04", {"CPU": 0.5, "node:__internal_head__": 0.001}),
        _actor("06", {"CPU": 1.0}, state="DEAD"),
        _actor("07", {}),  # num_cpus=0: nothing
    ]
    found = holdings(groups, actors, JOBS)
    assert found == [
        Holding("job tf-0127dacc", "02000000", {"CPU": 3.0}),
        Holding("job raysubmit_abc", "03000000", {"GPU": 1.0, "CPU": 1.0}),
        Holding("Ray job 04", "04", {"CPU": 0.5}),
    ]
    assert holdings_text(found) == (
        "job tf-0127dacc (3 CPU), job raysubmit_abc (1 CPU, 1 GPU), Ray job 04 (0.5 CPU)"
    )
    assert holdings_text(found, limit=1) == "job tf-0127dacc (3 CPU) and 2 more"
    assert holdings_text([]) == ""
    # a job short of GPUs is told who holds GPUs, and nothing else
    assert held_by(found, {"GPU"}) == [Holding("job raysubmit_abc", "03000000", {"GPU": 1.0})]


def test_a_waiting_job_names_who_holds_what_it_is_short_of():
    spec = JobSpec("train", workers=2, cpus_per_worker=1)
    held = [
        Holding("job tf-0127dacc", "02000000", {"CPU": 1.0}),
        Holding("Ray job 04", "04", {"GPU": 1.0}),
    ]
    assert workers_reason(spec, {"CPU": 1.0}, held) == (
        "waiting for resources: 2 workers x (1 CPU), placement pack; free now 1 of 2 CPU;"
        " held by job tf-0127dacc (1 CPU)"
    )
    assert workers_reason(spec, {"CPU": 2.0}, held) == (
        "starting the workers: 2 workers x (1 CPU), placement pack"
    )
    # nobody's actor or group holds it (a running task does): the reason without holders
    assert workers_reason(spec, {"CPU": 1.0}, []).endswith("free now 1 of 2 CPU")


def test_the_panel_reads_a_waiting_job_s_reason_in_a_few_words():
    spec = JobSpec("train", workers=2, cpus_per_worker=1, gpus_per_worker=1)
    held = [
        Holding("job tf-0127dacc", "02000000", {"CPU": 1.0, "GPU": 2.0}),
        Holding("Ray job 04", "04", {"GPU": 0.5}),
    ]
    reason, line = workers_wait(spec, {"CPU": 1.0, "GPU": 0.5}, held)
    assert line == "1 of 2 CPU free, 0.5 of 2 GPU free; held by job tf-0127dacc, Ray job 04"
    assert "held by job tf-0127dacc (1 CPU, 2 GPU), Ray job 04 (0.5 GPU)" in reason  # how much
    assert workers_wait(spec, {"CPU": 2.0}, [])[1] == "0 of 2 GPU free"
    assert workers_wait(spec, {"CPU": 2, "GPU": 2})[1] == "starting the workers"
    # the panel: the driver's line while it waits; its own words before the driver speaks
    assert waiting_line(reason, line) == line
    assert waiting_line(pending_reason("PENDING", "submitted"), line) == (
        "setting up the environment"
    )
    assert waiting_line(pending_reason("RUNNING", "resumed (1)")) == "starting the driver"
    assert waiting_line("something else") == "something else"  # a run without the tag
