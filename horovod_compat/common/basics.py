"""HorovodBasics: lifecycle, topology and capability queries over the runtime's C API."""

import atexit
import os
from typing import Any, Dict, List, Optional, Sequence, Union

from horovod_compat import _core
from horovod_compat.common import elastic_rendezvous as _elastic_rendezvous
from horovod_compat.common import launch_env as _launch_env
from horovod_compat.common.exceptions import HorovodInternalError
from horovod_compat.common import process_sets as _ps

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


def _mpi_comm_address(comm: Any) -> int:
    """Address of the MPI_Comm handle inside an mpi4py communicator."""
    from mpi4py import MPI
    return MPI._addressof(comm)


class HorovodBasics:
    """The functions every frontend re-exports as hvd.init, hvd.rank, hvd.size, ..."""

    def __init__(self) -> None:
        self.Average = _core.AVERAGE
        self.Sum = _core.SUM
        self.Adasum = _core.ADASUM
        self.Min = _core.MIN
        self.Max = _core.MAX
        self.Product = _core.PRODUCT
        self.HOROVOD_PROCESS_SET_ERROR_INIT = _core.PROCESS_SET_ERROR_INIT
        self.HOROVOD_PROCESS_SET_ERROR_DYNAMIC = _core.PROCESS_SET_ERROR_DYNAMIC
        self.HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET = _core.PROCESS_SET_ERROR_UNKNOWN_SET
        self.HOROVOD_PROCESS_SET_ERROR_FOREIGN_SET = _core.PROCESS_SET_ERROR_FOREIGN_SET
        self.HOROVOD_PROCESS_SET_ERROR_SHUTDOWN = _core.PROCESS_SET_ERROR_SHUTDOWN
        self.HOROVOD_PROCESS_SET_ERROR_EXISTING_SET = _core.PROCESS_SET_ERROR_EXISTING_SET
        self._atexit_registered = False

    # -- lifecycle ----------------------------------------------------------------------------

    def init(self, comm: Optional[Union[Sequence[int], Any]] = None,
             process_sets: Optional[Union[str, List["_ps.ProcessSet"]]] = None) -> None:
        """Starts the runtime (harmless when it already runs).

        comm: None for every process of the job, a list of world ranks to run on, or an mpi4py
        communicator to borrow. process_sets: ProcessSet objects to register now, or "dynamic"
        to allow add_process_set()/remove_process_set() later.
        """
        if isinstance(process_sets, str):
            if process_sets != "dynamic":
                raise ValueError(f"process_sets must be a list or 'dynamic', got {process_sets!r}")
            os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
            process_sets = None
        if _core.is_initialized():
            _ps._init_process_sets(process_sets)
            return
        elastic = comm is None and _elastic_rendezvous.configured(os.environ)
        if elastic:
            # An elastic worker takes its rank and size from the launcher's current round
            # (docs/elastic.md); the variables it was started with may be stale.
            _elastic_rendezvous.join_round(os.environ)
        # A TF_CONFIG cluster becomes the identity variables the TCP transport reads.
        _launch_env.prepare(os.environ)
        ranks: List[int] = []
        comm_addr = 0
        if comm is not None:
            if isinstance(comm, (list, tuple)):
                ranks = [int(r) for r in comm]
            else:
                if not self.mpi_built():
                    raise ValueError("Passing an mpi4py communicator to init() needs an MPI "
                                     "build of horovod_compat.")
                comm_addr = _mpi_comm_address(comm)
        _ps._base_comm = comm if comm_addr else None
        set_ranks, duplicate = _ps._init_time_rank_lists(process_sets)
        if _core.init(ranks, comm_addr, set_ranks) != _core.OK:
            if elastic:
                # A peer of the round failed or left while the round connected: the launcher
                # forms another, which hvd.elastic.run joins after this error.
                raise HorovodInternalError(
                    f"Horovod initialization failed in elastic round "
                    f"{_elastic_rendezvous.last_round()}: {_core.last_error()}")
            raise ValueError(f"Horovod initialization failed: {_core.last_error()}")
        if not self._atexit_registered:
            atexit.register(self.shutdown)
            self._atexit_registered = True
        _ps._init_process_sets(process_sets)
        if duplicate is not None:
            # Horovod's behaviour: initialised all the same, so size()/rank() work and a later
            # init() with a valid list goes on.
            raise ValueError(duplicate)

    def shutdown(self) -> None:
        """Stops the runtime; later collectives fail."""
        _elastic_rendezvous.stop_hosts_event_watch()
        _core.shutdown()
        _ps.global_process_set.ranks = []

    def is_initialized(self) -> bool:
        """Whether init() has run (and shutdown() has not)."""
        return bool(_core.is_initialized())

    # -- topology -----------------------------------------------------------------------------

    @staticmethod
    def _checked(value: int) -> int:
        if value < 0:
            raise ValueError(_NOT_INITIALIZED)
        return value

    def size(self) -> int:
        """Number of processes in the job."""
        return self._checked(_core.size())

    def local_size(self) -> int:
        """Number of processes on this node."""
        return self._checked(_core.local_size())

    def cross_size(self) -> int:
        """Number of nodes that have a process with this process's local rank."""
        return self._checked(_core.cross_size())

    def rank(self) -> int:
        """This process's rank in the job (0 .. size-1)."""
        return self._checked(_core.rank())

    def local_rank(self) -> int:
        """This process's rank on its node."""
        return self._checked(_core.local_rank())

    def cross_rank(self) -> int:
        """Index of this process's node."""
        return self._checked(_core.cross_rank())

    def is_homogeneous(self) -> bool:
        """Whether every node runs the same number of processes."""
        return bool(self._checked(_core.is_homogeneous()))

    # -- timeline -----------------------------------------------------------------------------

    def start_timeline(self, file_path: str, mark_cycles: bool = False) -> None:
        """Starts writing a timeline to ``file_path`` (needs HOROVOD_TIMELINE set at init)."""
        if not self.is_initialized():
            raise ValueError(_NOT_INITIALIZED)
        if _core.start_timeline(file_path, bool(mark_cycles)) != _core.OK:
            message = _core.last_error() or (
                "Set HOROVOD_TIMELINE=DYNAMIC in the environment to enable the timeline.")
            raise ValueError(message)

    def stop_timeline(self) -> None:
        """Stops the timeline (no-op when it is not running)."""
        if not self.is_initialized():
            raise ValueError(_NOT_INITIALIZED)
        if _core.stop_timeline() != _core.OK:
            raise ValueError(_core.last_error())

    # -- capabilities -------------------------------------------------------------------------

    def mpi_threads_supported(self) -> bool:
        """Whether MPI runs with MPI_THREAD_MULTIPLE."""
        if not self.is_initialized():
            raise ValueError(_NOT_INITIALIZED)
        value = _core.mpi_threads_supported()
        if value < 0:
            raise ValueError("Horovod MPI is not enabled at runtime.")
        return bool(value)

    def mpi_enabled(self) -> bool:
        """Whether MPI is in use at runtime."""
        return bool(_core.mpi_enabled())

    def mpi_built(self) -> bool:
        """Whether the runtime was compiled with MPI."""
        return bool(_core.mpi_built())

    def gloo_enabled(self) -> bool:
        """Whether the TCP transport (Horovod's Gloo controller) is in use at runtime."""
        query = getattr(_core, "gloo_enabled", None)
        return bool(query()) if query is not None else False

    def gloo_built(self) -> bool:
        """Whether the runtime was compiled with the TCP transport (Horovod's Gloo)."""
        query = getattr(_core, "gloo_built", None)
        return bool(query()) if query is not None else False

    def nccl_built(self) -> int:
        """NCCL_VERSION_CODE if compiled with NCCL, else 0."""
        return int(_core.nccl_built())

    def ddl_built(self) -> bool:
        """IBM DDL is never built."""
        return False

    def ccl_built(self) -> bool:
        """oneCCL is never built."""
        return False

    def cuda_built(self) -> bool:
        """Whether the runtime was compiled with CUDA."""
        return bool(_core.cuda_built())

    def rocm_built(self) -> bool:
        """ROCm is never built."""
        return False

    def sycl_built(self) -> bool:
        """SYCL (Intel GPUs) is never built."""
        return False

    # -- process sets (used by horovod_compat.common.process_sets) ----------------------------

    def _process_set_error(self, process_set_id: int, code: int) -> ValueError:
        if code == self.HOROVOD_PROCESS_SET_ERROR_INIT:
            return ValueError(_NOT_INITIALIZED)
        if code == self.HOROVOD_PROCESS_SET_ERROR_UNKNOWN_SET:
            return ValueError(f"Process set id {process_set_id} is not known.")
        if code == self.HOROVOD_PROCESS_SET_ERROR_FOREIGN_SET:
            return ValueError(f"This rank is not part of process set {process_set_id}.")
        if code == self.HOROVOD_PROCESS_SET_ERROR_SHUTDOWN:
            return ValueError("Horovod has been shut down.")
        if code == self.HOROVOD_PROCESS_SET_ERROR_DYNAMIC:
            return ValueError("Process sets can only be added or removed after init with "
                              "HOROVOD_DYNAMIC_PROCESS_SETS=1 (or hvd.init(process_sets="
                              "'dynamic')).")
        if code == self.HOROVOD_PROCESS_SET_ERROR_EXISTING_SET:
            return ValueError("A process set with these ranks already exists.")
        return ValueError(f"Process set operation failed ({code}): {_core.last_error()}")

    def _process_set_size(self, process_set_id: int) -> int:
        value = _core.process_set_size(process_set_id)
        if value < 0:
            raise self._process_set_error(process_set_id, value)
        return value

    def _process_set_rank(self, process_set_id: int) -> int:
        value = _core.process_set_rank(process_set_id)
        if value < 0:
            raise self._process_set_error(process_set_id, value)
        return value

    def _process_set_included(self, process_set_id: int) -> int:
        return _core.process_set_included(process_set_id)

    def _process_set_ids(self) -> List[int]:
        code, ids = _core.process_set_ids()
        if code < 0:
            raise self._process_set_error(-1, code)
        return list(ids)

    def _process_set_ranks(self, process_set_id: int) -> List[int]:
        code, ranks = _core.process_set_ranks(process_set_id)
        if code < 0:
            raise self._process_set_error(process_set_id, code)
        return list(ranks)

    def _get_process_set_ids_and_ranks(self) -> Dict[int, List[int]]:
        """Every registered process set: id -> its global ranks in ascending order (Horovod's
        private helper, used by code that checks dynamic process sets)."""
        return {i: sorted(self._process_set_ranks(i)) for i in self._process_set_ids()}

    def _add_process_set(self, ranks: List[int]) -> int:
        value = _core.add_process_set(ranks)
        if value < 0:
            raise self._process_set_error(-1, value)
        return value

    def _remove_process_set(self, process_set_id: int) -> bool:
        return _core.remove_process_set(process_set_id) == _core.OK

    def _barrier(self, process_set_id: int, name: str) -> None:
        code, message = _core.barrier(process_set_id, name)
        if code == getattr(_core, "PEER_LOST", None):
            raise HorovodInternalError(f"barrier failed: {message}")
        if code != _core.OK:
            raise RuntimeError(f"barrier failed: {message}")

