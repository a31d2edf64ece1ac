"""The compute job of a tf.data service (``horovod.tensorflow.data.compute_worker``):

    horovodrun -np N python -m horovod_compat.tensorflow.data.compute_worker \\
        [--dispatchers D] [--dispatcher-side compute|training] [--timeout T] CONFIG_FILE

Rank 0 runs the compute service and writes CONFIG_FILE (what the training job reads with
``TfDataServiceConfig.read``); every rank then runs a tf.data worker (and, with dispatchers on
the compute side, the first rank of each group of N / D runs that group's dispatcher) until the
training side calls ``compute_client().shutdown()``.
"""

import argparse
import os
import sys
import time
from typing import Optional, Sequence

from horovod_compat.runner.common.service.compute_service import (
    HEARTBEAT_SECONDS, ComputeService)
from horovod_compat.runner.common.util import secret
from horovod_compat.tensorflow.data.compute_service import (
    DISPATCHER_SIDES, TfDataServiceConfig, compute_worker_fn)


def main(dispatchers: int, dispatcher_side: str, configfile: str,
         timeout: Optional[int] = None) -> None:
    import horovod_compat.tensorflow as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    print(f"compute worker rank={rank} size={size} dispatchers={dispatchers} "
          f"dispatcher_side={dispatcher_side} pid={os.getpid()}", flush=True)
    if dispatchers <= 0 or size % dispatchers:
        raise ValueError(f"the number of processes ({size}) must be a multiple of the number "
                         f"of dispatchers ({dispatchers})")
    service = None
    try:
        if rank == 0:
            key = secret.make_secret_key()
            service = ComputeService(dispatchers, size // dispatchers, key=key)
            config = TfDataServiceConfig(
                dispatchers=dispatchers, workers_per_dispatcher=size // dispatchers,
                dispatcher_side=dispatcher_side, addresses=service.addresses(), key=key,
                timeout=timeout if timeout is not None else 60)
            config.write(configfile)
            print(f"compute worker: wrote {configfile}", flush=True)
        else:
            config = None
        # The other ranks get the configuration from rank 0 over the job itself, never from a
        # file a previous run may have left behind.
        config = TfDataServiceConfig.from_dict(hvd.broadcast_object(
            config.to_dict() if config is not None else None, root_rank=0,
            name="compute_worker_config"))
        compute_worker_fn(config, timeout)
    finally:
        if service is not None:
            # Long enough for every worker and training rank to hear of the shutdown.
            time.sleep(2 * HEARTBEAT_SECONDS)
            service.shutdown()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m horovod_compat.tensorflow.data.compute_worker",
                                     description="Runs the compute job of a tf.data service.")
    parser.add_argument("configfile", help="where rank 0 writes the compute service's "
                                           "configuration (read by the training job)")
    parser.add_argument("--dispatchers", type=int, default=1,
                        help="number of dispatchers (the job's size must be a multiple)")
    parser.add_argument("--dispatcher-side", dest="dispatcher_side", default="compute",
                        choices=DISPATCHER_SIDES,
                        help="where the dispatchers run: 'compute' (here) or 'training'")
    parser.add_argument("--timeout", type=int, default=60,
                        help="seconds to wait for dispatchers and workers to register")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    main(args.dispatchers, args.dispatcher_side, args.configfile, args.timeout)
    sys.exit(0)
