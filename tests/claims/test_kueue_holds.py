"""Kueue's workload-wide holds (its tiered QuotaReserved=False reasons, and the older Evicted shapes):
the wait stays Kueue's queue admission, and the reason names who has to act, since waiting never
lifts them: the run's owner (deactivated, on hold, a LocalQueue that does not exist), a queue admin
(a stopped or missing ClusterQueue, a stopped LocalQueue) or the platform (an admission gate).

Condition shapes follow Kueue's own (apis/kueue workload_types.go reasons; its controllers'
messages); the base object is tests/fixtures/kueue/workload_inadmissible_localqueue_missing_kueue_docs.yaml.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.dumpkit import fixture_status, ts
from tests.test_claim_owners import blocked
from tests.test_explain_fixtures import NOW, kueue_job, workload_for

USER = "for the run's owner to act on"
ADMIN = "for a Kueue queue admin to act on"
PLATFORM = "for the platform to act on"


def held(reason: str, message: str, **spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A suspended Kueue Job and its Workload held with QuotaReserved=False `reason` (Admitted=False,
    NoReservation, as Kueue writes it beside)."""
    job = kueue_job("train", "team-a", NOW - timedelta(minutes=40), suspend=True)
    status = fixture_status("kueue/workload_inadmissible_localqueue_missing_kueue_docs.yaml")
    cond = status["conditions"][0]
    cond.update(reason=reason, message=message, lastTransitionTime=ts(NOW - timedelta(minutes=30)))
    status["conditions"].append({"type": "Admitted", "status": "False", "reason": "NoReservation",
                                 "message": "The workload has no reservation",
                                 "lastTransitionTime": ts(NOW - timedelta(minutes=30))})
    wl = workload_for(job, status)
    wl["spec"].update(spec)
    return job, wl


@pytest.mark.parametrize(("reason", "message", "who"), [
    ("Deactivated", "The workload is deactivated", USER),
    ("OnHold", "StatefulSet scaled to zero; workload on hold", USER),
    ("Misconfigured", "LocalQueue team-a doesn't exist", USER),
    ("Misconfigured", "ClusterQueue gpu-a100 doesn't exist", ADMIN),
    ("Suspended", "ClusterQueue gpu-a100 is stopped", ADMIN),
    ("AdmissionGated", "Admission is gated by: example.com/budget-approver", PLATFORM),
    # before the tiers (Kueue < 0.19): the same missing queue, as `Inadmissible`
    ("Inadmissible", "LocalQueue user-queue doesn't exist", USER),
    ("Inadmissible", "ClusterQueue gpu-a100 is inactive", ADMIN),
])
def test_a_hold_names_who_must_act(tmp_path: Path, reason: str, message: str, who: str) -> None:
    job, wl = held(reason, message)
    b = blocked([job, wl], tmp_path)
    assert (b["stage"], b["owner"]) == ("queue-admission", "Kueue")
    assert f"({reason}" in b["reason"] and message in b["reason"], b["reason"]
    assert who in b["reason"] and "waiting will not lift it" in b["reason"], b["reason"]
    assert b["since"] == ts(NOW - timedelta(minutes=30))


def test_waiting_for_quota_names_nobody(tmp_path: Path) -> None:
    """Quota frees up by itself: no one is asked to act (the stage's owner stays the whole answer)."""
    job, wl = held("WaitingForQuota", "couldn't assign flavors to pod set main: insufficient unused quota for "
                                      "nvidia.com/gpu in flavor a100, 8 more needed")
    b = blocked([job, wl], tmp_path)
    assert b["stage"] == "queue-admission" and "to act on" not in b["reason"], b["reason"]


def test_admission_gate_controllers_come_from_the_annotation(tmp_path: Path) -> None:
    job, wl = held("AdmissionGated", "Admission is gated by: example.com/budget-approver,example.com/quota-audit")
    wl["metadata"]["annotations"] = {"kueue.x-k8s.io/admission-gated-by": "example.com/budget-approver,"
                                                                         "example.com/quota-audit"}
    b = blocked([job, wl], tmp_path)
    assert "gated by example.com/budget-approver,example.com/quota-audit" in b["reason"]
    assert any(e["field"] == "metadata.annotations[kueue.x-k8s.io/admission-gated-by]" for e in b["evidence"])


def test_spec_active_false_is_deactivated_whatever_the_condition_still_says(tmp_path: Path) -> None:
    """Kueue's status may lag the user's `spec.active: false` (or predate the Deactivated reason)."""
    job, wl = held("PendingEvaluation", "", active=False)
    b = blocked([job, wl], tmp_path)
    assert "deactivated (spec.active: false)" in b["reason"] and USER in b["reason"], b["reason"]
    assert any(e["field"] == "spec.active" and e["value"] is False for e in b["evidence"])


@pytest.mark.parametrize(("reason", "message", "who"), [
    ("Deactivated", "The workload is deactivated", USER),
    ("DeactivatedDueToRequeuingLimitExceeded",
     "The workload is deactivated due to exceeding the maximum number of re-queuing retries", USER),
    ("ClusterQueueStopped", "The ClusterQueue is stopped", ADMIN),
    ("LocalQueueStopped", "The LocalQueue is stopped", ADMIN),
])
def test_an_eviction_that_holds_it_names_who_must_act(tmp_path: Path, reason: str, message: str, who: str) -> None:
    """Kueue < 0.19 (and admitted workloads): Evicted=True with the hold's reason, quota released."""
    job, wl = held("Pending", "", active=not reason.startswith("Deactivated"))
    wl["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": reason, "message": message,
                                       "lastTransitionTime": ts(NOW - timedelta(minutes=20))})
    b = blocked([job, wl], tmp_path)
    assert b["stage"] == "queue-admission" and f"evicted ({reason}): {message}" in b["reason"], b["reason"]
    assert who in b["reason"], b["reason"]
