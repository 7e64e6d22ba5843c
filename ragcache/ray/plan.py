"""How many actors a Ray pipeline runs, how large its batches are, and what each actor asks the cluster for.

Pure arithmetic on the cluster's resources (no Ray import), so the choice is tested without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from ragcache.errors import ConfigError

__all__ = ["ActorPlan", "plan_actors", "MAX_RETRIES"]

# A batch whose actor died is retried on a restarted actor this many times; a deterministic crash then
# fails the run instead of looping (Ray Data's default is to retry without end).
MAX_RETRIES = 4
# A local model on a GPU: one actor per card; 256 texts per batch keep a small model's card busy
# (~10,000 texts/s, docs/DESIGN.md) at a few Redis round trips per 256 texts.
GPU_BATCH = 256
# A local model on CPUs: one actor per 4 CPUs on large nodes (torch scales to a few intra-op threads;
# more actors means more model copies), per CPU on small ones; batches of two model calls.
CPUS_PER_ACTOR_LARGE = 4
LARGE_NODE_CPUS = 8
CPU_BATCH = 64
# A remote model: the actors mostly wait on the upstream, so they are light (half a CPU each) and take
# batches that fill several upstream requests.
REMOTE_CPUS_PER_ACTOR = 0.5
REMOTE_BATCH = 256
MAX_REMOTE_ACTORS = 32


@dataclass(frozen=True)
class ActorPlan:
    """What ``map_batches`` is given: the actor pool's size, the batch size, and each actor's resources."""

    num_actors: int
    batch_size: int
    num_cpus: float
    num_gpus: float

    def ray_arguments(self) -> dict:
        """The keyword arguments of ``Dataset.map_batches`` this plan stands for, retries included.

        The actors are spread over the nodes (one model per node before two on one), and a batch whose actor
        died is retried on a restarted one. Ray 2.60 takes ``max_restarts``, ``max_task_retries`` and
        ``scheduling_strategy`` only as free remote arguments, which it says it will stop taking in 2.64:
        the ``ray`` extra pins 2.60."""
        from ray.data import ActorPoolStrategy

        return {
            "compute": ActorPoolStrategy(size=self.num_actors),
            "batch_size": self.batch_size,
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "scheduling_strategy": "SPREAD",
            "max_restarts": MAX_RETRIES,
            "max_task_retries": MAX_RETRIES,
        }


def plan_actors(
    *,
    cluster_cpus: float,
    cluster_gpus: float,
    remote: bool,
    device: str = "auto",
    num_actors: int | None = None,
    batch_size: int | None = None,
) -> ActorPlan:
    """The plan for a cluster with these resources; ``num_actors`` and ``batch_size`` override the choice.

    ``device``: the settings' (``auto``, ``cpu``, ``cuda``...): a local model uses GPUs when the cluster has
    them and the device allows it. At least one CPU is left for Ray Data's read tasks where the cluster has
    more than one, so an actor pool that holds every CPU never starves the reads that feed it."""
    if num_actors is not None and num_actors < 1:
        raise ConfigError(f"num_actors must be at least 1, got {num_actors}")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
    spare_cpus = max(cluster_cpus - 1, 1)
    if remote:
        plan = ActorPlan(min(MAX_REMOTE_ACTORS, max(1, int(spare_cpus / REMOTE_CPUS_PER_ACTOR))), REMOTE_BATCH,
                         REMOTE_CPUS_PER_ACTOR, 0)
    elif cluster_gpus >= 1 and device != "cpu":
        plan = ActorPlan(int(cluster_gpus), GPU_BATCH, 1, 1)
    else:
        cpus = CPUS_PER_ACTOR_LARGE if cluster_cpus >= LARGE_NODE_CPUS else 1
        plan = ActorPlan(max(1, int(spare_cpus // cpus)), CPU_BATCH, cpus, 0)
    return ActorPlan(num_actors or plan.num_actors, batch_size or plan.batch_size, plan.num_cpus, plan.num_gpus)
