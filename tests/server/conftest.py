"""Fixtures the service tests share."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="module")
def http(server):
    """A client of the module's ``server`` (each module starts its own, configured as its tests need). The timeout
    only bounds a hung test: a loaded machine must not fail a slow answer."""
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client
