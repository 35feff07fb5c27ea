"""The ``torchrun`` command, built in one place for the launches here and the job files there.
``command`` is only what a person types; a notebook's launch adds a log folder and rank labels
through torchrun's environment (``supervision``), so the printed line does the same in a terminal.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RDZV_BACKEND = "c10d"
STANDALONE = "--standalone"  # one machine: c10d on localhost, a free port, a random id
NPROC_WORDS = ("gpu", "cpu", "auto")  # torchrun's own non-numeric --nproc-per-node values
# The store init_process_group("env://") meets: rank 0's worker serves it on torch 2.4, node 0's
# agent from 2.5 (unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1). It outlives a restart: 2.5 keeps
# attempts apart by a key prefix from each agent's restart count, which differs between nodes
# (pytorch/pytorch#135712); 2.6 dropped the prefix (#136768) but creates the server once per agent,
# so from 2.6 a restarted worker can read a dead peer's address even on one node (Gloo: "Connection
# refused", seen on 2.14.1). So a launch that allows restarts gives its workers their own store:
# job files always (the cluster's torch is unknown; 2.4 ignores the variable), a notebook's launch
# where the installed torchrun shares its store.
OWN_STORE_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
RANK_LABEL = "[rank${rank}]: "  # torchrun fills in the global rank
RANK_PREFIX = re.compile(r"^\[rank(\d+)\]: ?")
# Every supported torchrun reads the label from this variable; the option exists only from 2.12.
RANK_LABEL_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"

# A host or port: a literal, or a variable of the shell ($NAME, ${NAME}) or Kubernetes ($(NAME)).
VARIABLE = r"\$(?:\w+|\{\w+\}|\(\w+\))"
HOST = re.compile(rf"{VARIABLE}|[A-Za-z0-9_.-]+|\[[0-9A-Fa-f:.]+\]")
_PORT = re.compile(rf"{VARIABLE}|\d+")
_NAME = re.compile(r"[A-Za-z0-9_.$(){}-]+")  # rendezvous ids: a word or a variable


def command(
    script: str | os.PathLike,
    *,
    nproc_per_node: int | str,
    nnodes: int | str = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    max_restarts: int = 0,
    local_addr: str | None = None,
    args: Sequence[str | int | float | os.PathLike] = (),
) -> list[str]:
    """The ``torchrun`` command for one machine of a job, as a list of words.

    Args:
        script: the training script.
        nproc_per_node: processes on the machine: a number, or ``"gpu"``, ``"cpu"``, ``"auto"``.
        nnodes: machines (torchrun agents) in the job, or a variable that holds their number
            (``"$SLURM_JOB_NUM_NODES"``).
        rdzv_endpoint: the rendezvous ``host:port`` (host may be a variable); ``None``: one machine.
        rdzv_id: a name unique to this job at the endpoint (needed with an endpoint).
        max_restarts: how often torchrun restarts all workers after one fails.
        local_addr: the address this agent advertises to the others (``None``: its host name).
        args: the script's own arguments.

    Raises:
        ValueError: an argument that would give a broken command, with what is expected.
    """
    if not (isinstance(nnodes, str) and re.fullmatch(VARIABLE, nnodes)):
        check_int("nnodes", nnodes, low=1)  # a number, or the scheduler's variable for it
    check_nproc(nproc_per_node)
    check_int("max_restarts", max_restarts, low=0)
    words = [f"--nnodes={nnodes}"] if nnodes != 1 else []
    if rdzv_endpoint is None:
        if nnodes != 1:
            raise ValueError("A job of several machines needs rdzv_endpoint ('host:port' of "
                             "the machine that hosts the rendezvous) and an rdzv_id.")
        words += [STANDALONE, f"--nproc-per-node={nproc_per_node}"]
    else:
        check_endpoint(rdzv_endpoint)
        if not isinstance(rdzv_id, str) or not _NAME.fullmatch(rdzv_id):
            raise ValueError(f"rdzv_id must be one word (letters, digits, '-', '_', '.') or a "
                             f"variable like '$SLURM_JOB_ID', got {rdzv_id!r}")
        words += [f"--nproc-per-node={nproc_per_node}", f"--rdzv-backend={RDZV_BACKEND}",
                  f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
    if local_addr:
        words.append(f"--local-addr={local_addr}")
    if max_restarts:
        words.append(f"--max-restarts={max_restarts}")
    return ["torchrun", *words, os.fspath(script), *script_args(args)]


def arguments(script: str | os.PathLike, **options: Any) -> list[str]:
    """``command`` without the program's name: what ``python -m torch.distributed.run`` takes."""
    program, *words = command(script, **options)
    return words


def supervision(log_dir: Path) -> dict[str, str]:
    """What a notebook's launch adds to ``command``, off the printed line, as ``PET_<OPTION>``
    variables (torchrun reads almost every option there, torch 2.4 to 2.14): each worker's output
    to ``log_dir``, copied (``--tee=3``), each line labelled ``[rankN]: ``."""
    return {"PET_LOG_DIR": os.fspath(log_dir), "PET_TEE": "3", RANK_LABEL_ENV: RANK_LABEL}


def shares_store() -> bool:
    """Whether the installed torchrun's agent serves its workers' store (torch 2.5 and later): from
    2.5 the c10d rendezvous handler has its own ``use_agent_store``; 2.4's inherits ``False``."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

    return "use_agent_store" in vars(DynamicRendezvousHandler)


def restart_env(max_restarts: int) -> dict[str, str]:
    """The workers' own store where restarts are allowed and torchrun would share its own."""
    return dict(OWN_STORE_ENV) if max_restarts and shares_store() else {}


def check_int(name: str, value: Any, *, low: int) -> None:
    """Refuse anything but an integer (``bool`` included) of at least ``low``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def check_nproc(nproc_per_node: Any) -> None:
    if nproc_per_node in NPROC_WORDS:
        return
    if not isinstance(nproc_per_node, int) or isinstance(nproc_per_node, bool) \
            or nproc_per_node < 1:
        raise ValueError(f"nproc_per_node must be an integer >= 1 or one of {NPROC_WORDS}, "
                         f"got {nproc_per_node!r}")


def check_port(port: Any, *, low: int = 1) -> None:
    """A TCP port; ``low=0`` admits 0, which asks the system for a free one."""
    if not isinstance(port, int) or isinstance(port, bool) or not low <= port <= 65535:
        raise ValueError(f"port must be an integer in [{low}, 65535], got {port!r}")


def check_endpoint(endpoint: Any) -> None:
    host, _, port = endpoint.rpartition(":") if isinstance(endpoint, str) else ("", "", "")
    if not (host and HOST.fullmatch(host) and _PORT.fullmatch(port)):
        raise ValueError(f"rdzv_endpoint must look like 'host:port' (the host may be a "
                         f"variable such as '$HEAD_NODE'), got {endpoint!r}")
    if port.isdigit():
        check_port(int(port), low=0)


def script_args(args: Sequence[str | int | float | os.PathLike]) -> list[str]:
    """The script's arguments as words: text, numbers and paths; anything else is refused."""
    if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
        raise ValueError(f"args must be a list of arguments, got {args!r}")
    for arg in args:
        if not isinstance(arg, (str, int, float, os.PathLike)) or isinstance(arg, bool):
            raise ValueError(f"each of args must be a string, a number or a path, got {arg!r}")
    return [os.fspath(arg) if isinstance(arg, os.PathLike) else str(arg) for arg in args]
