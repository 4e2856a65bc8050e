import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_thread_in_every_module(one_thread):  # tests/conftest.py
    yield
