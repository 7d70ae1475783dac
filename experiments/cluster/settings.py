"""`[cluster]`: where a run's (cell, engine) pairs go when it runs on a Ray cluster
(`inferlab run CONFIG --cluster ADDRESS`, or `address` here). A cell may override any key, e.g. to pin
one cell to one accelerator kind. Nothing here imports Ray: a config without an address runs locally."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Cluster(BaseModel):
    """`address`: "auto" (RAY_ADDRESS, else a cluster started on this machine with `ray start`), "HOST:PORT" or
    "ray://HOST:10001"; None runs locally. Each (cell, engine) task asks for GPUs = the engine's tensor x pipeline
    size on a GPU engine or a GPU-pinned cell (`gpus`), else `cpus` CPUs; `accelerator` pins a GPU kind (Ray's
    accelerator_type, e.g. "H100"); `resources` asks for custom resources too (a node started with
    `ray start --resources='{"h200": 8}'`). `attempts`: nodes a pair is tried on (a node that dies mid-level
    costs that level, rerun whole elsewhere) before it is reported failed."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = None
    cpus: float = Field(1.0, ge=0)
    gpus: bool | None = None  # None: as the engine's spec says (GPU engines ask for GPUs)
    accelerator: str | None = None
    resources: dict[str, float] = {}
    attempts: int = Field(3, ge=1, le=20)
    client_env: dict[str, str] = {}  # environment of `[load] clients` processes (e.g. their thread counts)
