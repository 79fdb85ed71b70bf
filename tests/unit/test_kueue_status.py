"""Kueue's part of the status (kueue/status.py): kept by the core's status without being read, read and written by
Kueue alone, and carried by the CRD with its columns."""

from __future__ import annotations

from elasticjob import crd, integrations
from elasticjob.kueue.status import AdmissionStatus, admission, set_admission
from elasticjob.models import ElasticJobStatus


def wire(status: ElasticJobStatus) -> dict:
    return status.model_dump(by_alias=True, mode="json")  # what the operator writes (controller/reconcile.py)


def test_the_core_keeps_the_part_as_the_api_gave_it_and_kueue_reads_it_typed():
    status = ElasticJobStatus.model_validate({"phase": "Running", "admission": {"state": "Admitted",
                                                                                 "clusterQueue": "cq"}})
    assert wire(status)["admission"] == {"state": "Admitted", "clusterQueue": "cq"}
    found = admission(status)
    assert isinstance(found, AdmissionStatus) and (found.state, found.cluster_queue) == ("Admitted", "cq")
    assert wire(status)["admission"]["clusterQueue"] == "cq"  # unchanged by the reading


def test_a_clear_is_written_only_where_there_was_an_admission():
    """A job Kueue never saw gets no key of Kueue's (its status write would otherwise differ from what it read at
    every reconcile); one that had an admission gets null, which the status patch removes."""
    never = ElasticJobStatus.model_validate({"phase": "Running"})
    set_admission(never, None)
    assert "admission" not in wire(never) and admission(never) is None
    had = ElasticJobStatus.model_validate({"phase": "Queued", "admission": {"state": "Preempted"}})
    set_admission(had, None)
    assert wire(had)["admission"] is None and admission(had) is None
    set_admission(had, AdmissionStatus(state="Queued", workload="wl"))
    assert wire(had)["admission"]["state"] == "Queued"


def test_the_crd_carries_the_parts_schema_and_columns_only_from_the_registry():
    with_parts, without = crd.crd(integrations.status_parts()), crd.crd()

    def status(doc):
        return doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]

    def columns(doc):
        return [c["name"] for c in doc["spec"]["versions"][0]["additionalPrinterColumns"]]

    assert "clusterQueue" in status(with_parts)["properties"]["admission"]["properties"]
    assert "admission" not in status(without)["properties"]
    assert "additionalProperties" not in status(with_parts)  # structural: the API server prunes other keys
    assert columns(with_parts) == [*columns(without)[:columns(without).index("Weighted") + 1], "Admission",
                                   *[c for c in columns(without)[columns(without).index("Weighted") + 1:]
                                     if c != "Age"], "Queue", "Age"]
