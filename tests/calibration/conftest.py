"""Tiny random checkpoints shared by the calibration tests (built once per session)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_docs():
    return tiny.synthetic_docs(48)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory, tiny_docs):
    return tiny.write_text(tmp_path_factory.mktemp("data") / "docs.txt", tiny_docs)


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory, tiny_docs):
    made = {}

    def get(family: str) -> Path:
        if family not in made:
            made[family] = tiny.make_checkpoint(family, tmp_path_factory.mktemp(family), tiny_docs)
        return made[family]

    return get
