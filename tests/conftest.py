import pytest
import torch

from state_reduction.backend import install_cpu_backend


@pytest.fixture(scope="module")
def one_thread():
    """The CPU backend and one torch thread for a module: tiny models run fastest on one thread; several
    threads on a shared CPU make such modules ~10x slower."""
    install_cpu_backend()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
