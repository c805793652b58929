"""Several processes generating one run: the process group torchrun sets up, and what ranks share.

``torchrun --nproc_per_node=N run.py ...`` starts N copies with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set; :func:`world_from_env` joins them into a
``torch.distributed`` process group (nccl on GPUs, gloo on CPU). Without those variables it is a
world of one and nothing is initialised. Image ``i`` belongs to rank ``i % world_size``: its
randomness depends only on (seed, i), so sharding never changes an image.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from lantern.errors import ConfigError


@dataclass
class World:
    """This process's place among the ranks of one run."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def shard(self, indices: list[int]) -> list[int]:
        """The indices this rank owns (``i % size == rank``), in order."""
        return [i for i in indices if i % self.size == self.rank]

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def gather(self, value) -> list:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        if not self.distributed:
            return [value]
        values = [None] * self.size
        torch.distributed.all_gather_object(values, value)
        return values

    def from_main(self, value):
        """Rank 0's ``value`` (picklable), on every rank."""
        if not self.distributed:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def world_size_from_env() -> int:
    """The number of ranks torchrun started (1 when not under torchrun), without joining them."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank_from_env() -> int:
    return int(os.environ.get("RANK", "0"))


def export_submitit_tasks() -> None:
    """Under a submitit SLURM job of several tasks (``hydra.launcher.tasks_per_node``), set the variables
    torchrun would (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) from submitit's job environment."""
    if (
        "WORLD_SIZE" in os.environ
        or int(os.environ.get("SLURM_NTASKS", "1")) <= 1
        or "SUBMITIT_EXECUTOR" not in os.environ
    ):
        return
    from submitit.helpers import TorchDistributedEnvironment

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)  # each rank picks cuda:LOCAL_RANK itself


LAUNCHER_POLL_S = 0.5
_watching: list[int] = []  # the launcher's pid once this process watches it


def die_with_launcher(poll_s: float = LAUNCHER_POLL_S) -> None:
    """End this process as soon as its launcher (the parent: torchrun's agent) is gone, however it ended.

    torchrun starts each worker in a session of its own, so killing the launcher (``kill -9``, a lost login)
    would leave the workers training on, holding the folder's lock and the accelerators. A daemon thread
    watches the parent pid and kills this process when it changes (the orphan is re-parented): exactly as if
    it had been killed with the launcher, so a rerun resumes from what the atomic writers finished.
    """
    if _watching:
        return
    parent = os.getppid()
    _watching.append(parent)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-launcher", daemon=True).start()


def world_from_env(device: str = "cpu", timeout_s: float = 1800.0) -> World:
    """Join the process group torchrun (or a multi-task submitit job) described in the environment.

    A world of one without either. ``device`` picks the backend: nccl for CUDA devices (each rank then
    uses ``cuda:LOCAL_RANK``), gloo otherwise.
    """
    export_submitit_tasks()
    size = world_size_from_env()
    if size <= 1:
        return World()
    rank, local_rank = rank_from_env(), int(os.environ.get("LOCAL_RANK", "0"))
    die_with_launcher()
    if not torch.distributed.is_initialized():
        backend = "nccl" if str(device).startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        torch.distributed.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return World(rank=rank, size=size, local_rank=local_rank)


def rank_device(device: str, world: World) -> str:
    """The device this rank decodes on: ``cuda`` becomes ``cuda:LOCAL_RANK`` in a multi-process run."""
    if world.distributed and device == "cuda":
        return f"cuda:{world.local_rank}"
    return device


def check_world(world: World, num_images: int) -> None:
    """Refuse more processes than images (a rank with nothing to do is a mistake in the launch line)."""
    if world.size > num_images:
        raise ConfigError(
            f"--nproc_per_node={world.size} is more than num_images={num_images}: use at most {num_images} processes"
        )
