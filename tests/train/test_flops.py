"""Which peak a GPU's name gets for MFU: the specific name before one it contains."""

import pytest

from transformer_mt.train.flops import peak_flops


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),  # matched "H100" (989) before
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),  # matched "H200" before
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA H800", 989e12),
        ("NVIDIA B200", 2250e12),
        ("NVIDIA GB200", None),  # not given B200's figure
        ("NVIDIA L40S", 362e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Tesla T4", None),
    ],
)
def test_a_device_name_gets_its_own_peak(name, peak):
    assert peak_flops(name) == peak
