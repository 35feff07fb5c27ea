"""``python -m ddp_lib.launching.torchrun_main ARGS`` is ``torchrun ARGS`` (torchrun's own
``main``: same workers, output, report and exit status), also writing what torchrun only prints,
as JSON, to ``DDP_WORKSHOP_FAILURES`` (``ddp_lib.launching.records``): each failed rank's
``ProcessFailure`` and the parser's refusal of the command line, caught by parsing it once before
``main`` does.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser
from torch.distributed.run import main as torchrun_main

from ddp_lib.launching import records


def main(argv: list[str]) -> None:
    """Run torchrun with ``argv``; record its failures, then fail as torchrun does."""
    record_to = os.environ[records.ENV_VAR]
    parser = get_args_parser()

    def refuse(message: str) -> NoReturn:
        records.record_refusal(record_to, message)
        argparse.ArgumentParser.error(parser, message)  # usage and message, exit status 2

    parser.error = refuse
    parser.parse_args(argv)
    try:
        torchrun_main(argv)
    except ChildFailedError as failed:
        records.record(record_to, failed)
        raise  # torchrun's report, and its exit status


if __name__ == "__main__":
    main(sys.argv[1:])
