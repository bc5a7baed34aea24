"""The operator's reads and writes of Kubernetes objects, off the event loop.

Children are written with server-side apply (beta and on by default since 1.16, GA in
1.22): the operator states the whole object and the API server merges it, so fields other
managers set (a user's labels, the StatefulSet controller's status) are left alone. Each
owner applies under its own field manager, so objects with several owners (the namespace's
controller) keep every owner's reference.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

FIELD_MANAGER = "capstan-operator"
CALL_TIMEOUT_S = 30
"""The longest any one request to the API server may take: a connection that stops
answering fails the call (and the handler retries) rather than hold it for ever."""

_PATHS = {
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("v1", "Secret"): "/api/v1/namespaces/{ns}/secrets",
    ("v1", "Service"): "/api/v1/namespaces/{ns}/services",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts",
    ("v1", "Pod"): "/api/v1/namespaces/{ns}/pods",
    ("apps/v1", "StatefulSet"): "/apis/apps/v1/namespaces/{ns}/statefulsets",
    ("policy/v1", "PodDisruptionBudget"): "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    ("policy/v1beta1", "PodDisruptionBudget"): (
        "/apis/policy/v1beta1/namespaces/{ns}/poddisruptionbudgets"
    ),
    ("rbac.authorization.k8s.io/v1", "Role"): (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"
    ),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): (
        "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"
    ),
    ("networking.k8s.io/v1", "NetworkPolicy"): (
        "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
    ),
    ("batch/v1", "CronJob"): "/apis/batch/v1/namespaces/{ns}/cronjobs",
    ("batch/v1beta1", "CronJob"): "/apis/batch/v1beta1/namespaces/{ns}/cronjobs",
    ("cert-manager.io/v1", "Certificate"): "/apis/cert-manager.io/v1/namespaces/{ns}/certificates",
    ("cert-manager.io/v1", "Issuer"): "/apis/cert-manager.io/v1/namespaces/{ns}/issuers",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): (
        "/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors"
    ),
}


def path_of(api_version: str, kind: str, namespace: str, name: str = "") -> str:
    try:
        base = _PATHS[(api_version, kind)].format(ns=namespace)
    except KeyError:
        raise ValueError(f"the operator does not write {kind} ({api_version})") from None
    return f"{base}/{name}" if name else base


class KubeObjects:
    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self.configuration: client.Configuration = api.configuration
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.storage = client.StorageV1Api(api)

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """One request; a status of 400 or more raises ApiException."""
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        # The client serialises a JSON body itself; a YAML one (apply) goes as text, and
        # JSON is YAML.
        text = body if body is None or content_type.endswith("json") else json.dumps(body)
        method, url, headers, _, _ = self._api.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            auth_settings=["BearerToken"],
        )
        response = self._api.call_api(method, url, headers, text, _request_timeout=CALL_TIMEOUT_S)
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        if response.status >= 400:
            raise ApiException(status=response.status, reason=data.decode(errors="replace"))
        return json.loads(data) if data else None

    async def apply(self, obj: Mapping[str, Any], manager: str = FIELD_MANAGER) -> Any:
        meta = obj["metadata"]
        path = path_of(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
        query = [("fieldManager", manager), ("force", "true")]
        return await asyncio.to_thread(
            self._call, "PATCH", path, dict(obj), query, "application/apply-patch+yaml"
        )

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any | None:
        try:
            return await asyncio.to_thread(
                self._call, "GET", path_of(api_version, kind, namespace, name)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def delete(
        self, api_version: str, kind: str, namespace: str, name: str, orphan: bool = False
    ) -> bool:
        """Delete an object (with `orphan`, leaving what it owns); whether it existed."""
        body = {"propagationPolicy": "Orphan"} if orphan else None
        try:
            await asyncio.to_thread(
                self._call, "DELETE", path_of(api_version, kind, namespace, name), body
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def namespace_terminating(self, namespace: str) -> bool:
        """Whether `namespace` is being deleted (a missing one counts as gone)."""
        try:
            found = await asyncio.to_thread(
                self.core.read_namespace, namespace, _request_timeout=CALL_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return found.metadata is not None and found.metadata.deletion_timestamp is not None

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            await asyncio.to_thread(
                self.core.delete_namespaced_pod, name, namespace, _request_timeout=CALL_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def claims(self, namespace: str, selector: Mapping[str, str]) -> list[Any]:
        """The PersistentVolumeClaims with `selector`'s labels."""
        return await self._labelled(
            self.core.list_namespaced_persistent_volume_claim, namespace, selector
        )

    async def resize_claim(self, namespace: str, name: str, size: str) -> None:
        await asyncio.to_thread(
            self.core.patch_namespaced_persistent_volume_claim,
            name,
            namespace,
            {"spec": {"resources": {"requests": {"storage": size}}}},
            _request_timeout=CALL_TIMEOUT_S,
        )

    async def delete_claim(self, namespace: str, name: str) -> None:
        try:
            await asyncio.to_thread(
                self.core.delete_namespaced_persistent_volume_claim,
                name,
                namespace,
                _request_timeout=CALL_TIMEOUT_S,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def storage_classes(self) -> list[Any]:
        found = await asyncio.to_thread(
            self.storage.list_storage_class, _request_timeout=CALL_TIMEOUT_S
        )
        return list(found.items)

    async def node_labels(self, name: str) -> dict[str, str] | None:
        """The labels of node `name`; None when there is no such node."""
        try:
            node = await asyncio.to_thread(
                self.core.read_node, name, _request_timeout=CALL_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict((node.metadata.labels if node.metadata else None) or {})

    async def label_pod(self, namespace: str, name: str, labels: Mapping[str, str]) -> None:
        """Set `labels` on a pod (a merge patch: other labels stay)."""
        await self._patch_pod(namespace, name, {"metadata": {"labels": dict(labels)}})

    async def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        """Set (None: remove) `annotations` on a pod; a pod gone meanwhile is left be."""
        try:
            await self._patch_pod(namespace, name, {"metadata": {"annotations": dict(annotations)}})
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def _patch_pod(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        await asyncio.to_thread(
            self.core.patch_namespaced_pod,
            name,
            namespace,
            dict(body),
            _request_timeout=CALL_TIMEOUT_S,
        )

    async def annotate_custom(
        self, plural: str, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        """Set (None: remove) `annotations` on one of Capstan's resources."""
        await asyncio.to_thread(
            self._call,
            "PATCH",
            f"/apis/capstan.io/v1alpha1/namespaces/{namespace}/{plural}/{name}",
            {"metadata": {"annotations": dict(annotations)}},
            None,
            "application/merge-patch+json",
        )

    async def services(self, namespace: str, selector: Mapping[str, str]) -> list[Any]:
        return await self._labelled(self.core.list_namespaced_service, namespace, selector)

    async def pods(self, namespace: str, selector: Mapping[str, str]) -> list[Any]:
        return await self._labelled(self.core.list_namespaced_pod, namespace, selector)

    @staticmethod
    async def _labelled(
        list_method: Callable[..., Any], namespace: str, selector: Mapping[str, str]
    ) -> list[Any]:
        """What `list_method` lists in `namespace` with `selector`'s labels."""
        text = ",".join(f"{k}={v}" for k, v in selector.items())
        found = await asyncio.to_thread(
            list_method, namespace, label_selector=text, _request_timeout=CALL_TIMEOUT_S
        )
        return list(found.items)

    async def get_custom(self, plural: str, namespace: str, name: str) -> Any | None:
        try:
            return await asyncio.to_thread(
                self._call,
                "GET",
                f"/apis/capstan.io/v1alpha1/namespaces/{namespace}/{plural}/{name}",
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def patch_custom_status(
        self, plural: str, namespace: str, name: str, status: Mapping[str, Any]
    ) -> bool:
        """Merge `status` into the object's status subresource; False if the object is gone."""
        path = f"/apis/capstan.io/v1alpha1/namespaces/{namespace}/{plural}/{name}/status"
        try:
            await asyncio.to_thread(
                self._call,
                "PATCH",
                path,
                {"status": dict(status)},
                None,
                "application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def has_api(self, group_version: str, kind: str) -> bool:
        """Whether the server serves `kind` in `group_version` (discovery; at start)."""
        path = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
        try:
            found = self._call("GET", path)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("kind") == kind for r in (found or {}).get("resources", []))

    async def list_custom(self, plural: str, namespace: str) -> list[dict[str, Any]]:
        found = await asyncio.to_thread(
            self._call, "GET", f"/apis/capstan.io/v1alpha1/namespaces/{namespace}/{plural}"
        )
        return list((found or {}).get("items", []))


def refusal_message(exc: ApiException) -> str:
    """The message of the Status the API server answered with, or its whole text."""
    try:
        status = json.loads(exc.reason)
    except (TypeError, ValueError):
        return str(exc.reason)
    return str(status.get("message") or exc.reason) if isinstance(status, dict) else str(exc.reason)
