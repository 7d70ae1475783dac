"""`torchrun --nproc-per-node N -m reference_engine.distributed.torchrun MODEL_DIR [inferlab serve flags]`.

The same ranks as `inferlab serve --tensor-parallel-size N`, started by torchrun instead of by the
engine (multi-node: torchrun's `--nnodes`/`--rdzv-endpoint`; every rank reads the same model
directory). Rank 0 runs the server, whose engine finds its rank in torchrun's environment
(`group.torchrun_rank`) and hosts the store at MASTER_ADDR:MASTER_PORT instead of starting
workers; ranks > 0 build the same engine config from the same flags and run the worker loop.
The tensor-parallel size is torchrun's world size.
"""
from __future__ import annotations

import sys

from reference_engine.distributed import group, worker
from reference_engine.server import cli


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    env = group.torchrun_rank()
    if env is None:
        print("reference_engine.distributed.torchrun: start it with torchrun (no RANK / TORCHELASTIC_RUN_ID "
              "in the environment); without torchrun use inferlab serve --tensor-parallel-size N", file=sys.stderr)
        return 2
    rank, world = env
    argv = [*argv, "--tensor-parallel-size", str(world)]  # the last flag wins: torchrun's world size
    if rank == 0:
        return cli.main(argv)
    cfg = cli.engine_config(cli.parse(argv))
    return worker.run(cfg, group.join_torchrun(rank, world, cfg.device))


if __name__ == "__main__":
    sys.exit(main())
