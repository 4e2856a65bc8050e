import pytest
import torch

from state_reduction.backend import install_cpu_backend


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    install_cpu_backend()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
