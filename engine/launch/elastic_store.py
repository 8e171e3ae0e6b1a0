"""The key-value store a torchrun worker starts its process group on, with its keys scoped to the restart.

Since torch 2.4 torchrun's elastic agent shares one TCPStore server with its workers for the life of the agent
(``TORCHELASTIC_USE_AGENT_STORE=True``; ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` opts out), and ``env://``
connects every attempt's workers to it with no prefix of their own (torch's comment there still says each
restart gets a new store). The restarted workers therefore find the previous attempt's gloo addresses in the
store: a rank that reads its peer's key before the new peer has overwritten it gets a dead process's address.
Gloo decides which side of a pair connects by comparing the two addresses, so with one stale address both
sides may wait for the other (a hang in ``init_process_group``: a waiting listener has no timeout) or one
connects to the dead port (``connectFullMesh failed ... Connection refused``, the restart fails). It hit plain
``init_process_group("gloo")`` scripts as much as the Trainer (3 of 5 restarts failed on this machine).

Prefixing every key with the restart count, as torch itself did before the store was shared, gives each
attempt a namespace of its own; the agent's own keys (rendezvous state) live under other prefixes.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from engine.environment import EngineEnvironment

KEY_PREFIX = "ember/restart_{count}"


def restart_scoped_store(env: EngineEnvironment, timeout: timedelta | None) -> dist.Store | None:
    """A client of torchrun's shared store whose keys carry this restart's number, or None where the default
    ``env://`` rendezvous is safe (not a torchrun worker, or the agent starts a fresh store per restart).

    Args:
        env: the environment read at process start (``MASTER_ADDR`` / ``MASTER_PORT`` are the agent's store).
        timeout: how long a store operation waits (the process group's timeout; None: torch's default).
    """
    elastic = env.elastic
    if not elastic.agent_store or elastic.restart_count is None:
        return None
    if env.master_addr is None or env.master_port is None:
        raise ValueError(f"TORCHELASTIC_USE_AGENT_STORE=True but MASTER_ADDR={env.master_addr!r} / MASTER_PORT="
                         f"{env.master_port!r}: torchrun sets all three; unset TORCHELASTIC_USE_AGENT_STORE when "
                         "starting the processes another way.")
    client = dist.TCPStore(env.master_addr, int(env.master_port), is_master=False,
                           timeout=timeout if timeout is not None else dist.constants.default_pg_timeout)
    return dist.PrefixStore(KEY_PREFIX.format(count=elastic.restart_count), client)


__all__ = ["KEY_PREFIX", "restart_scoped_store"]
