"""A real server (uvicorn on a free loopback port, in a thread) on a tiny random Qwen3-MoE
(8 experts, top-2, 2 layers, random predictor, policy base), shared by the module's tests."""

import socket
import threading
import time
from dataclasses import dataclass

import pytest
import torch
import uvicorn

from base_sglang.engine.tiny import create_tiny_moe
from base_sglang.server.app import create_app
from base_sglang.server.backends import create_backend
from base_sglang.server.settings import Settings

MODEL = "tiny"


@dataclass
class LiveServer:
    url: str
    app: object
    backend: object
    model_dir: str

    @property
    def engine(self):
        return self.backend.engine


@pytest.fixture(scope="session")
def server_model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return create_tiny_moe(tmp_path_factory.mktemp("tiny-server-moe"))


@pytest.fixture(scope="module")
def server(server_model_dir):
    settings = Settings(model=str(server_model_dir), served_model_name=MODEL, policy="base",
                        default_budget="dense", max_running_requests=16, max_waiting_requests=16)
    backend = create_backend(settings)
    app = create_app(backend, settings)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield LiveServer(f"http://127.0.0.1:{port}", app, backend, str(server_model_dir))
    srv.should_exit = True
    thread.join(timeout=15)


@pytest.fixture
def settings_override(server):
    """Swap the live app's settings for one test (the routes read them per request)."""
    original = server.app.state.settings

    def apply(**changes):
        server.app.state.settings = original.model_copy(update=changes)

    yield apply
    server.app.state.settings = original
