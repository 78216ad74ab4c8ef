"""The engine's torch intra-op threads, from the worker's settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from dataplane.worker.config import WorkerConfig


def apply_threads(config: WorkerConfig) -> None:
    """Set torch's intra-op threads when the settings name them: standalone (server.main) and managed
    (agent.__main__) alike; the agent once left them at torch's default."""
    if config.threads is not None:
        torch.set_num_threads(config.threads)
