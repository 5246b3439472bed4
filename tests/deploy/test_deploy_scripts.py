"""The helper scripts the images run: the health probe (against a real HTTP server on loopback)
and the pyproject -> requirements resolver of the dependency layer."""

import importlib.util
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import tomllib
from deploy_helpers import ROOT


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"deploy_{name}", ROOT / "deploy" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


healthcheck = load("healthcheck")
requirements = load("requirements")


class Handler(BaseHTTPRequestHandler):
    STATUS = {"/health": 200, "/readiness": 503, "/missing": 404}

    def do_GET(self):
        self.send_response(self.STATUS.get(self.path, 500))
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    thread.join(timeout=10)


def test_probe_is_healthy_only_on_200(http_server):
    base = f"http://127.0.0.1:{http_server}"
    assert healthcheck.probe(f"{base}/health") == 0
    assert healthcheck.probe(f"{base}/readiness") == 1
    assert healthcheck.probe(f"{base}/missing") == 1


def test_probe_fails_on_a_closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connection refused
        assert healthcheck.probe(f"http://127.0.0.1:{port}/health", timeout=2) == 1


def test_default_url_is_health_on_base_port(http_server, monkeypatch):
    monkeypatch.setenv("BASE_PORT", str(http_server))
    assert healthcheck.default_url() == f"http://127.0.0.1:{http_server}/health"
    assert healthcheck.main([]) == 0
    monkeypatch.delenv("BASE_PORT")
    assert healthcheck.default_url() == "http://127.0.0.1:8000/health"
    assert healthcheck.main(["a", "b"]) == 2


def test_script_exit_codes(http_server):
    script = str(ROOT / "deploy" / "healthcheck.py")
    ok = subprocess.run([sys.executable, script, f"http://127.0.0.1:{http_server}/health"])
    bad = subprocess.run([sys.executable, script, f"http://127.0.0.1:{http_server}/readiness"],
                         capture_output=True, text=True)
    assert ok.returncode == 0
    assert bad.returncode == 1 and "HTTP 503" in bad.stderr
    assert (ROOT / "deploy" / "healthcheck.py").read_text().startswith("#!/usr/bin/env python3\n")


def test_requirements_of_the_sglang_extra_expand_self_references():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    got = requirements.resolve(project, ["sglang"])
    expected = list(project["dependencies"])
    for extra in ("sglang", "server", "models", "grammar"):
        expected += [r for r in extras[extra] if not r.startswith("base-sglang")]
    assert sorted(got) == sorted(set(expected))
    assert len(got) == len(set(got))
    assert not any(r.lower().startswith("base-sglang") for r in got)
    assert "sglang==0.5.23" in got


def test_requirements_cycles_and_unknown_extras():
    project = {"dependencies": ["numpy"],
               "optional-dependencies": {"a": ["x>=1", "base-sglang[b]"],
                                         "b": ["y", "base_sglang [a, c]"], "c": ["x>=1", "z"]}}
    assert requirements.resolve(project, ["a"]) == ["numpy", "x>=1", "y", "z"]
    with pytest.raises(SystemExit, match="unknown extra 'nope'.*known: a, b, c"):
        requirements.resolve(project, ["nope"])


def test_requirements_cli(tmp_path):
    py = tmp_path / "pyproject.toml"
    py.write_text('[project]\nname = "base-sglang"\ndependencies = ["torch>=2.5"]\n'
                  '[project.optional-dependencies]\nserver = ["fastapi>=0.110"]\n')
    out = subprocess.run([sys.executable, str(ROOT / "deploy" / "requirements.py"), "--pyproject", str(py),
                          "server"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["torch>=2.5", "fastapi>=0.110"]


def test_skip_installed_keeps_the_image_pins_and_reports_disagreements(tmp_path):
    # as in the GPU image: numpy and pytest are installed here, the third distribution is not
    py = tmp_path / "pyproject.toml"
    py.write_text('[project]\nname = "base-sglang"\ndependencies = ["numpy>=99", "pytest"]\n'
                  '[project.optional-dependencies]\nx = ["base-sglang-not-installed-dist>=1"]\n')
    out = subprocess.run([sys.executable, str(ROOT / "deploy" / "requirements.py"), "--pyproject", str(py),
                          "--skip-installed", "x"], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["base-sglang-not-installed-dist>=1"]
    assert "numpy: keeping the installed" in out.stderr and "asks >=99" in out.stderr
    assert "pytest" not in out.stderr  # satisfied: nothing to report
