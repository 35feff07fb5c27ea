"""ddp_lib: the plumbing behind the ddp-workshop notebooks.

It writes the lessons' scripts to disk, launches them under ``torchrun`` (or ``mpiexec``,
lesson 10), streams and collects what they print and report, and draws figures. What the scripts
themselves share (the data, the models, ``report``) is ``course_helpers``, beside this package,
which needs torch and torchvision only. Neither does the thing a lesson teaches: that code stays
in the scripts, in plain PyTorch.
"""

from ddp_lib.hardware import detect, plan
from ddp_lib.launching.launcher import launch, launch_nodes
from ddp_lib.launching.result import (
    LaunchError,
    LaunchInterrupted,
    LaunchResult,
    LaunchTimeout,
    RankFailed,
    StaleResult,
)
from ddp_lib.scripts import write_script

__all__ = [
    "LaunchError",
    "LaunchInterrupted",
    "LaunchResult",
    "LaunchTimeout",
    "RankFailed",
    "StaleResult",
    "detect",
    "launch",
    "launch_nodes",
    "load_ipython_extension",
    "plan",
    "write_script",
]


def load_ipython_extension(ipython) -> None:
    """``%load_ext ddp_lib`` registers the ``%%write_script NAME`` cell magic."""
    from ddp_lib.scripts import write_script_magic

    ipython.register_magic_function(write_script_magic, magic_kind="cell",
                                    magic_name="write_script")
