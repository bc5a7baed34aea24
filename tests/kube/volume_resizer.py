"""A stand-in for a CSI driver's volume expansion on the real node (`node.py`), whose local
PersistentVolumes no driver can grow.

On a cluster with such a driver, a bound claim whose request grows is left by
kube-controller-manager to "an external controller" (the claim's `ExternalExpanding` event):
the driver's external-resizer grows the volume and sets the PersistentVolume's
`spec.capacity`, the kubelet grows the file system, and the claim's `status.capacity` then
shows the new size. This thread does those steps' API writes for the StorageClasses it is
given: a bound claim asking for more than its `status.capacity` has its volume's capacity
and then its own status set to the request. A local volume is a directory with no size of
its own, so nothing on disk changes; what the test sees is what Kubernetes shows a user.

A `paused` resizer writes nothing, so a test can watch a claim that waits for its driver.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.quantity import parse_quantity

log = logging.getLogger(__name__)


class VolumeResizer:
    """Grows the bound claims of `classes` to their requests every `interval_s`, in a thread."""

    def __init__(self, kubeconfig: Path, classes: set[str], interval_s: float = 1.0) -> None:
        self._api = config.new_client_from_config(config_file=str(kubeconfig))
        self._core = client.CoreV1Api(self._api)
        self._classes = set(classes)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="volume-resizer", daemon=True)
        self.paused = threading.Event()
        self.paused.set()
        self.grown: list[tuple[str, str]] = []
        """(namespace/claim, size) for every claim grown, in order."""

    def __enter__(self) -> VolumeResizer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._api.close()

    def resume(self) -> None:
        self.paused.clear()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            if self.paused.is_set():
                continue
            try:
                claims = self._core.list_persistent_volume_claim_for_all_namespaces().items
            except ApiException as exc:
                log.warning("listing claims failed: %s", exc.reason)
                continue
            for claim in claims:
                try:
                    self._grow(claim)
                except ApiException as exc:
                    log.warning("claim %s: %s", claim.metadata.name, exc.reason)

    def _grow(self, claim: client.V1PersistentVolumeClaim) -> None:
        spec, status = claim.spec, claim.status
        if spec.storage_class_name not in self._classes or status.phase != "Bound":
            return
        wanted = (spec.resources.requests or {}).get("storage")
        has = (status.capacity or {}).get("storage")
        if not wanted or wanted == has or _bytes(wanted) <= _bytes(has or "0"):
            return
        self._core.patch_persistent_volume(
            spec.volume_name, {"spec": {"capacity": {"storage": wanted}}}
        )
        self._core.patch_namespaced_persistent_volume_claim_status(
            claim.metadata.name,
            claim.metadata.namespace,
            {"status": {"capacity": {"storage": wanted}}},
        )
        self.grown.append((f"{claim.metadata.namespace}/{claim.metadata.name}", wanted))


def _bytes(quantity: str) -> float:
    return float(parse_quantity(quantity))
