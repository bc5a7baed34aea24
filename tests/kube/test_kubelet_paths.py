"""How the test kubelet rewrites a pod's mount paths in its command to the pod's folders."""

from __future__ import annotations

from pathlib import Path

from tests.kube.kubelet import _rewrite


def test_mount_paths_in_a_command_become_the_pods_folders_once() -> None:
    folders = {
        "/tmp": Path("/tmp/pod/volumes/tmp"),
        "/etc/capstan/webhook": Path("/tmp/pod/volumes/webhook"),
        "/etc/capstan": Path("/tmp/pod/volumes/config"),
    }
    assert _rewrite("--cert=/etc/capstan/webhook/tls.crt", folders) == (
        "--cert=/tmp/pod/volumes/webhook/tls.crt"  # not rewritten again by the /tmp mount
    )
    assert _rewrite("--config /etc/capstan/broker.yaml", folders) == (
        "--config /tmp/pod/volumes/config/broker.yaml"
    )
    assert _rewrite("/tmp", folders) == "/tmp/pod/volumes/tmp"
    untouched = "/tmpfiles /etc/capstanx /var/tmp"
    assert _rewrite(untouched, folders) == untouched
