"""The emulator keeps the API server's write rules that the Kubernetes backends rely on, as
the official client sees them (api_server.py lists the rules)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

import kmock
import pytest
from kubernetes import client
from kubernetes.client import ApiException

from tests.kube.api_server import RunningApiServer, sees

NS = "default"
WIDGETS = ("example.dev", "v1", NS, "widgets")


def _config_map(name: str = "cm", **metadata: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **metadata}, "data": {"a": "1", "b": "2"}}


def _refused(call: Callable[[], object]) -> tuple[int, str]:
    with pytest.raises(ApiException) as caught:
        call()
    body = caught.value.body
    return caught.value.status, json.loads(body)["reason"] if body else ""


@pytest.fixture
def core(api_server: RunningApiServer) -> client.CoreV1Api:
    return client.CoreV1Api(api_server.api_client())


@pytest.fixture
def widgets(api_server: RunningApiServer) -> client.CustomObjectsApi:
    """A custom resource with a status subresource, as its CRD would declare it."""
    assert api_server.emulator is not None
    api_server.emulator.resources["example.dev/v1/widgets"] = kmock.ResourceInfo(
        kind="Widget", namespaced=True, subresources={"status"}
    )
    return client.CustomObjectsApi(api_server.api_client())


def test_the_server_sets_uid_creation_time_and_one_growing_resource_version(core):
    first = core.create_namespaced_config_map(NS, _config_map("one"))
    second = core.create_namespaced_config_map(NS, _config_map("two"))
    assert first.metadata.namespace == NS  # from the URL
    assert first.metadata.uid and first.metadata.creation_timestamp
    assert first.metadata.uid != second.metadata.uid
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    body = _config_map("one", uid="forged", resourceVersion=first.metadata.resource_version)
    replaced = core.replace_namespaced_config_map("one", NS, body)
    assert replaced.metadata.uid == first.metadata.uid
    assert replaced.metadata.creation_timestamp == first.metadata.creation_timestamp
    assert int(replaced.metadata.resource_version) > int(second.metadata.resource_version)


def test_a_name_is_taken_once_until_deleted(core):
    core.create_namespaced_config_map(NS, _config_map())
    assert _refused(lambda: core.create_namespaced_config_map(NS, _config_map())) == (
        409,
        "AlreadyExists",
    )
    core.delete_namespaced_config_map("cm", NS)
    core.create_namespaced_config_map(NS, _config_map())
    generated = core.create_namespaced_config_map(NS, {"metadata": {"generateName": "cm-"}})
    assert generated.metadata.name.startswith("cm-") and len(generated.metadata.name) == 8
    refusal = _refused(
        lambda: core.create_namespaced_config_map(NS, _config_map("x", resourceVersion="1"))
    )
    assert refusal[0] == 500


def test_a_write_based_on_a_stale_version_is_a_conflict(core):
    stale = core.create_namespaced_config_map(NS, _config_map()).metadata.resource_version
    core.replace_namespaced_config_map("cm", NS, _config_map(resourceVersion=stale))
    conflict = (409, "Conflict")
    assert (
        _refused(
            lambda: core.replace_namespaced_config_map("cm", NS, _config_map(resourceVersion=stale))
        )
        == conflict
    )
    merge = {"metadata": {"resourceVersion": stale}, "data": {"a": "9"}}
    assert (
        _refused(
            lambda: core.patch_namespaced_config_map(
                "cm", NS, merge, _content_type="application/merge-patch+json"
            )
        )
        == conflict
    )
    test_op = [{"op": "test", "path": "/metadata/resourceVersion", "value": stale}]
    assert _refused(lambda: core.patch_namespaced_config_map("cm", NS, test_op)) == (422, "Invalid")
    rewind = [{"op": "replace", "path": "/metadata/resourceVersion", "value": stale}]
    assert _refused(lambda: core.patch_namespaced_config_map("cm", NS, rewind)) == conflict
    precondition = {"preconditions": {"resourceVersion": stale}}
    assert (
        _refused(lambda: core.delete_namespaced_config_map("cm", NS, body=precondition)) == conflict
    )
    assert core.read_namespaced_config_map("cm", NS).data == {"a": "1", "b": "2"}
    unconditional = core.replace_namespaced_config_map(
        "cm", NS, {"metadata": {"name": "cm"}, "data": {}}
    )
    assert unconditional.data is None or unconditional.data == {}


def test_a_missing_object_or_an_undeclared_resource_is_not_found(api_server, core):
    not_found = (404, "NotFound")
    assert _refused(lambda: core.read_namespaced_config_map("cm", NS)) == not_found
    assert (
        _refused(lambda: core.replace_namespaced_config_map("cm", NS, _config_map())) == not_found
    )
    assert _refused(lambda: core.patch_namespaced_config_map("cm", NS, {"data": {}})) == not_found
    assert _refused(lambda: core.delete_namespaced_config_map("cm", NS)) == not_found
    custom = client.CustomObjectsApi(api_server.api_client())
    assert (
        _refused(
            lambda: custom.create_namespaced_custom_object(*WIDGETS, {"metadata": {"name": "w"}})
        )
        == not_found
    )


def test_a_merge_patch_merges_objects_and_null_deletes(core):
    core.create_namespaced_config_map(NS, _config_map())
    patch = {"data": {"a": None, "c": "3"}}
    patched = core.patch_namespaced_config_map(
        "cm", NS, patch, _content_type="application/merge-patch+json"
    )
    assert patched.data == {"b": "2", "c": "3"}


def test_status_changes_only_through_the_status_subresource(widgets):
    widget = {"metadata": {"name": "w"}, "spec": {"size": 1}, "status": {"ready": True}}
    created = widgets.create_namespaced_custom_object(*WIDGETS, widget)
    assert "status" not in created
    through_object = {"spec": {"size": 2}, "status": {"ready": True}}
    patched = widgets.patch_namespaced_custom_object(*WIDGETS, "w", through_object)
    assert patched["spec"] == {"size": 2} and "status" not in patched
    through_status = {"spec": {"size": 3}, "status": {"ready": True}}
    patched = widgets.patch_namespaced_custom_object_status(*WIDGETS, "w", through_status)
    assert patched["spec"] == {"size": 2} and patched["status"] == {"ready": True}


def test_finalizers_hold_a_deletion_until_the_last_one_goes(core):
    core.create_namespaced_config_map(NS, _config_map(finalizers=["example.dev/cleanup"]))
    core.delete_namespaced_config_map("cm", NS)
    marked = core.read_namespaced_config_map("cm", NS)
    assert marked.metadata.deletion_timestamp is not None
    core.delete_namespaced_config_map("cm", NS)
    again = core.read_namespaced_config_map("cm", NS).metadata
    assert again.resource_version == marked.metadata.resource_version
    core.patch_namespaced_config_map(
        "cm", NS, {"metadata": {"finalizers": None}}, _content_type="application/merge-patch+json"
    )
    assert _refused(lambda: core.read_namespaced_config_map("cm", NS)) == (404, "NotFound")


def test_lease_times_need_six_fractional_digits_as_apimachinery_parses_them(api_server):
    leases = client.CoordinationV1Api(api_server.api_client())

    def lease(name: str, microsecond: int) -> client.V1Lease:
        moment = datetime.datetime(2030, 1, 1, microsecond=microsecond, tzinfo=datetime.UTC)
        spec = client.V1LeaseSpec(holder_identity="a", renew_time=moment)
        return client.V1Lease(metadata=client.V1ObjectMeta(name=name), spec=spec)

    # The client writes "2030-01-01T00:00:00+00:00" for a whole second: a real server's 400.
    assert _refused(lambda: leases.create_namespaced_lease(NS, lease("whole", 0))) == (
        400,
        "BadRequest",
    )
    leases.create_namespaced_lease(NS, lease("fraction", 5))


def test_a_reaction_answering_a_write_keeps_it_from_landing(api_server, core):
    assert api_server.emulator is not None
    posts = api_server.emulator[kmock.method.POST, kmock.resource("v1/configmaps")]
    posts[:1] << 503  # the first create fails, as an overloaded server's would
    assert _refused(lambda: core.create_namespaced_config_map(NS, _config_map()))[0] == 503
    assert _refused(lambda: core.read_namespaced_config_map("cm", NS))[0] == 404
    core.create_namespaced_config_map(NS, _config_map())


def test_the_quick_membership_test_agrees_with_kmock(api_server, core):
    core.create_namespaced_config_map(NS, _config_map())
    core.read_namespaced_config_map("cm", NS)
    core.list_namespaced_config_map(NS)
    _refused(lambda: core.read_namespaced_config_map("missing", "other"))
    emulator = api_server.emulator
    assert emulator is not None
    views = [
        emulator[kmock.method.GET],
        emulator.fallback[kmock.action.FETCH],
        emulator[kmock.resource("v1/configmaps")][kmock.method.POST],
        emulator[kmock.resource("v1/configmaps")][1:],
        emulator[kmock.method.GET] | emulator[kmock.method.POST],
        *(reaction._source for reaction in emulator._payloads),
    ]
    for view in views:
        for request in list(emulator):
            assert sees(view, request) == (request in view), (view, request)
