"""A real server (uvicorn on a free loopback port, in a thread) on a tiny random Qwen3-MoE
(8 experts, top-2, 2 layers, random predictor, policy base), shared by the module's tests."""

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
import torch
import uvicorn

from base_sglang.server.app import create_app
from base_sglang.server.backends import create_backend
from base_sglang.server.settings import Settings
from base_sglang.testing.models import create_tiny_moe

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


@contextmanager
def serve_app(app):
    """uvicorn on a free loopback port in a thread; yields the base URL."""
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
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=15)


@pytest.fixture(scope="module")
def server(server_model_dir):
    settings = Settings(model=str(server_model_dir), served_model_name=MODEL, policy="base",
                        default_budget="dense", max_running_requests=16, max_waiting_requests=16)
    backend = create_backend(settings)
    app = create_app(backend, settings)
    with serve_app(app) as url:
        yield LiveServer(url, app, backend, str(server_model_dir))


@pytest.fixture
def settings_override(server):
    """Swap the live app's settings for one test (the routes read them per request)."""
    original = server.app.state.settings

    def apply(**changes):
        server.app.state.settings = original.model_copy(update=changes)

    yield apply
    server.app.state.settings = original


@pytest.fixture(scope="module")
def proxy_server():
    """base-serve's defaults (the shipped proxy model, policy base) on a live loopback server."""
    from base_sglang.engine import DEFAULT_MODEL_DIR

    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("the embedded proxy model is not installed")
    torch.set_num_threads(1)
    settings = Settings(served_model_name="proxy-moe", max_running_requests=16,
                        max_waiting_requests=512, num_threads=1)
    backend = create_backend(settings)
    app = create_app(backend, settings)
    with serve_app(app) as url:
        yield LiveServer(url, app, backend, str(DEFAULT_MODEL_DIR))


@pytest.fixture(scope="module")
def tools_server(server_model_dir, tmp_path_factory):
    """The tiny model with a Qwen-style chat template that renders tools (tool_call_cases.py)."""
    import shutil

    from transformers import AutoTokenizer

    from base_sglang.testing.tool_call_cases import QWEN_STYLE_TEMPLATE

    model_dir = tmp_path_factory.mktemp("tiny-tools-moe") / "m"
    shutil.copytree(server_model_dir, model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = QWEN_STYLE_TEMPLATE
    tok.save_pretrained(model_dir)
    settings = Settings(model=str(model_dir), served_model_name=MODEL, policy="base",
                        default_budget="dense", max_running_requests=8, max_waiting_requests=8)
    backend = create_backend(settings)
    app = create_app(backend, settings)
    with serve_app(app) as url:
        yield LiveServer(url, app, backend, str(model_dir))
