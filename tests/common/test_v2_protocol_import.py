"""The official client's package loads its client only when something asks for it
(capstan/common/v2_protocol_import.py): a broker's protocol imports leave it out, and code
using the client sees the same package as without Capstan."""

from __future__ import annotations

import json
import subprocess
import sys


def _run(code: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_broker_importing_the_protocol_does_not_load_the_official_client():
    seen = _run(
        "import json, sys\n"
        "import capstan.broker.server\n"
        "from rocketmq.grpc_protocol import definition_pb2\n"
        "print(json.dumps({'client': 'rocketmq.v5.client' in sys.modules,\n"
        "                  'code_ok': definition_pb2.Code.OK}))\n"
    )
    assert seen == {"client": False, "code_ok": 20000}


def test_code_using_the_official_client_gets_the_whole_package_on_first_use():
    names = "Producer SimpleConsumer PushConsumer ClientConfiguration Credentials Message"
    probe = (
        "import json, sys@FIRST@\n"
        "from rocketmq.grpc_protocol import service_pb2\n"
        "import rocketmq\n"
        "from rocketmq import Producer, SimpleConsumer\n"
        f"names = {names.split()!r}\n"
        "print(json.dumps({'all': sorted(rocketmq.__all__),\n"
        "  'found': {n: type(getattr(rocketmq, n)).__name__ for n in names},\n"
        "  'missing': not hasattr(rocketmq, 'NoSuchThing')}))\n"
    )
    deferred = _run(probe.replace("@FIRST@", "\nimport capstan"))
    eager = _run(probe.replace("@FIRST@", ""))  # the package as it is without Capstan
    assert deferred == eager
    assert deferred["missing"] is True
    assert set(names.split()) <= set(deferred["all"])  # type: ignore[arg-type]


def test_a_package_imported_before_capstan_is_left_as_it_is():
    seen = _run(
        "import json, sys\n"
        "import rocketmq\n"
        "first = sys.modules['rocketmq']\n"
        "import capstan\n"
        "print(json.dumps({'same': sys.modules['rocketmq'] is first,\n"
        "                  'client': 'rocketmq.v5.client' in sys.modules}))\n"
    )
    assert seen == {"same": True, "client": True}
