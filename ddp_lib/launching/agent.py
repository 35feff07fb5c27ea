"""``python -m ddp_lib.agent ARGS``: ``torchrun ARGS``, keeping what failed as data.

A launch runs each torchrun agent through this entry point. It calls torchrun's own ``main`` with
the same arguments: the same workers, the same output and failure report, the same exit status.
What torchrun only prints for a person, it also writes, as JSON, to the file named by
``DDP_WORKSHOP_FAILURES`` (``ddp_lib.failures``), where the launch reads it:

* each failed rank's ``ProcessFailure`` (exit code, signal, error file, time), from the
  ``ChildFailedError`` that torchrun's ``main`` raises when workers fail;
* the complaint of torchrun's argument parser when it refuses the command line and no worker
  runs. argparse only prints it; its ``error`` method, which every refusal goes through, is where
  to keep it. The arguments are parsed once before ``main`` parses them again (a millisecond).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser
from torch.distributed.run import main as torchrun_main

from ddp_lib import failures


def main(argv: list[str]) -> None:
    """Run torchrun with ``argv``; record its failures, then fail as torchrun does."""
    record_to = os.environ[failures.ENV_VAR]
    parser = get_args_parser()

    def refuse(message: str) -> NoReturn:
        failures.record_refusal(record_to, message)
        argparse.ArgumentParser.error(parser, message)  # usage and message, exit status 2

    parser.error = refuse
    parser.parse_args(argv)
    try:
        torchrun_main(argv)
    except ChildFailedError as failed:
        failures.record(record_to, failed)
        raise  # torchrun's report, and its exit status


if __name__ == "__main__":
    main(sys.argv[1:])
