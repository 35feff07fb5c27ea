"""The two models the lessons train."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.models import resnet18


class SmallCNN(nn.Module):
    """The CNN of PyTorch's CIFAR-10 tutorial: two conv layers, three linear layers (62k params).

    Small enough to train in seconds on a CPU, so lessons can repeat runs and compare them.
    """

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def resnet18_cifar(num_classes: int = 10) -> nn.Module:
    """ResNet-18 for 32x32 images (11M params): a 3x3 first convolution and no max-pool.

    The ImageNet stem (7x7 stride-2 convolution, then max-pool) would shrink a 32x32 image to
    8x8 before the first residual block and throw most of it away.
    """
    model = resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model
