"""capstan/kube/rest.py, the controller's JSON client of the API server: the statuses it is
answered with, a server that is gone or never answers, and a pod's credentials."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from capstan.kube.rest import (
    TOKEN_REREAD_S,
    KubeRest,
    KubeStatusError,
    KubeUnreachable,
    ServiceAccountToken,
)
from tests.kube.api_server import serve_in_thread

CONFIG_MAPS = "/api/v1/namespaces/default/configmaps"


def test_an_object_written_is_answered_as_json_and_a_refusal_names_its_status() -> None:
    with serve_in_thread() as server:
        rest = KubeRest(server.url)
        made = rest.request("POST", CONFIG_MAPS, {"metadata": {"name": "a"}, "data": {"k": "v"}})
        assert made["metadata"]["resourceVersion"]
        assert rest.request("GET", f"{CONFIG_MAPS}/a")["data"] == {"k": "v"}
        with pytest.raises(KubeStatusError) as missing:
            rest.request("GET", f"{CONFIG_MAPS}/b")
        assert missing.value.status == 404
        assert missing.value.reason == "NotFound"
        with pytest.raises(KubeStatusError) as taken:
            rest.request("POST", CONFIG_MAPS, {"metadata": {"name": "a"}})
        assert taken.value.status == 409 and "AlreadyExists" in str(taken.value)
        rest.close()


def test_a_server_that_is_gone_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(KubeUnreachable, match=f"GET {CONFIG_MAPS}"):
        KubeRest(f"http://127.0.0.1:{port}").request("GET", CONFIG_MAPS, timeout_s=2)


def test_a_server_that_never_answers_is_unreachable_once_the_timeout_has_passed() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(4)  # connections queue, nothing is ever read or answered
        host, port = listening.getsockname()
        began = time.monotonic()
        with pytest.raises(KubeUnreachable):
            KubeRest(f"http://{host}:{port}").request("GET", CONFIG_MAPS, timeout_s=1)
        assert time.monotonic() - began < 5


def test_the_pods_token_is_read_again_as_the_kubelet_rotates_it(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    now = [100.0]
    credential = ServiceAccountToken(token, clock=lambda: now[0])
    assert credential() == "Bearer first"
    token.write_text("second\n")
    now[0] += TOKEN_REREAD_S / 2
    assert credential() == "Bearer first"
    now[0] += TOKEN_REREAD_S
    assert credential() == "Bearer second"


def test_in_a_pod_the_server_is_the_service_address_and_outside_there_is_none(
    tmp_path: Path,
) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("")
    env = {"KUBERNETES_SERVICE_HOST": "198.18.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    found = KubeRest.in_cluster(env, tmp_path)
    assert found is not None and found.host == "https://198.18.0.1:443"
    v6 = KubeRest.in_cluster({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, tmp_path)
    assert v6 is not None and v6.host == "https://[fd00::1]:443"
    assert KubeRest.in_cluster({}, tmp_path) is None
    assert KubeRest.in_cluster(env, tmp_path / "no-account") is None
