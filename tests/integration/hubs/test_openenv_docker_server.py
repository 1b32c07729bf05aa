"""``hub/OpenEnv-v0``'s image servers (agentrl/hubs/openenv_servers.py) in a real container of
``agentrl-base:latest`` (a stand-in server: Python's http.server answering ``/health``): the
container is on Docker's bridge network, the adapter reaches it at the container's own address,
and the server does not share this host's loopback (a host service bound to 127.0.0.1 does not
answer it). The container is gone with its lease."""

from __future__ import annotations

import socket
import uuid

import httpx
import pytest

from agentrl.hubs.openenv_servers import ServerSpec, lease_server, stop_servers
from sandboxes.docker.daemon import docker_client
from tests.helpers.sandbox_checks import containers_with_label, require_docker, wait_until

pytestmark = pytest.mark.docker

# argv: the server's port, then a port of this host's loopback to try; /health says what it found
SERVER = """import http.server, socket, sys
port, probe = int(sys.argv[1]), int(sys.argv[2])
try:
    socket.create_connection(("127.0.0.1", probe), 2).close()
    seen = b"reached the host's loopback"
except OSError:
    seen = b"isolated"
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(seen)))
        self.end_headers()
        self.wfile.write(seen)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("0.0.0.0", port), Health).serve_forever()
"""


def test_an_image_server_runs_on_the_bridge_network_at_the_containers_address():
    require_docker()
    host_service = socket.socket()
    host_service.bind(("127.0.0.1", 0))
    host_service.listen(1)
    run_id = f"test-oe-docker-{uuid.uuid4().hex[:8]}"
    spec = ServerSpec.parse({"image": "agentrl-base:latest", "run_id": run_id, "concurrent_sessions": False,
                             "startup_timeout_s": 60, "memory_mb": 256,
                             "command": ["python3", "-c", SERVER, "{port}", str(host_service.getsockname()[1])]})
    lease = lease_server(spec)
    try:
        (container,) = containers_with_label(run_id)
        client = docker_client()
        try:
            attrs = client.api.inspect_container(container)
        finally:
            client.close()
        assert attrs["HostConfig"]["NetworkMode"] == "bridge"
        address = attrs["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
        assert lease.base_url.startswith(f"http://{address}:") and not address.startswith("127.")
        with httpx.Client(trust_env=False, timeout=10) as http:
            assert http.get(lease.base_url + "/health").text == "isolated"
    finally:
        lease.release()
        stop_servers()
        host_service.close()
    assert wait_until(lambda: containers_with_label(run_id) == [], 10.0), containers_with_label(run_id)
