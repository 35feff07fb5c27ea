"""The two models take CIFAR-shaped batches and have the sizes the lessons quote."""

import torch

from course_helpers import SmallCNN, resnet18_cifar


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_small_cnn():
    model = SmallCNN()
    assert model(torch.randn(4, 3, 32, 32)).shape == (4, 10)
    assert parameters(model) == 62_006


def test_resnet18_for_32x32_keeps_spatial_detail():
    model = resnet18_cifar()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert model.conv1.stride == (1, 1) and isinstance(model.maxpool, torch.nn.Identity)
    assert 11_000_000 < parameters(model) < 11_300_000
