import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def pytest_report_header(config):
    return "thdcp torch tests: devices %s (CUDA cases are skipped without a GPU)" % DEVICES


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device visible: the CUDA cases run on the GPU machine")
    return request.param


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible: this case runs on the GPU machine")
    return "cuda"
