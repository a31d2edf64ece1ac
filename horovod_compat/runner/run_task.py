"""Rank side of ``horovod_compat.run``: ``python -m horovod_compat.runner.run_task DIR``."""

import os
import pickle
import sys
import traceback

from horovod_compat import alias
from horovod_compat.common.launch_env import launcher_rank
from horovod_compat.runner.run_func import FUNC_FILE, _pickle_module, error_file, result_file


def _rank() -> int:
    return launcher_rank(os.environ)


def main(directory: str) -> None:
    rank = _rank()
    # An elastic worker's rank is the one of its last round, known only once func returns.
    elastic = os.environ.get("HOROVOD_ELASTIC") == "1"
    # The function may refer to `horovod...` modules by name (a script run through the alias).
    alias.install()
    try:
        with open(os.path.join(directory, FUNC_FILE), "rb") as f:
            func, args, kwargs = pickle.load(f)
        value = func(*args, **kwargs)
        if elastic:
            rank = _rank()
        tmp = result_file(directory, rank) + ".tmp"
        with open(tmp, "wb") as f:
            _pickle_module().dump(value, f)
        os.replace(tmp, result_file(directory, rank))
    except BaseException:  # noqa: BLE001 - reported to the caller with the rank
        if elastic:
            rank = _rank()
        text = traceback.format_exc()
        with open(error_file(directory, rank), "w") as f:
            f.write(text)
        sys.stderr.write(text)
        sys.stderr.write(f"horovod_compat.run: rank {rank} failed with exit code 1\n")
        sys.stderr.flush()
        # Skip MPI_Finalize so that the launcher takes the whole job down (alias._fail_fast).
        os._exit(1)


if __name__ == "__main__":
    main(sys.argv[1])
