import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The PPM's MLP is tiny: on a shared 2-core box extra threads only contend (55 s vs 2 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
