"""Process sets: subsets of ranks that run their own collectives (Horovod's process_sets)."""

import numbers
from typing import Any, List, Optional, Sequence, Tuple, Union

# The HorovodBasics instance of the frontend that imported us (bound by _setup()).
_basics: Any = None


def _setup(basics: Any) -> None:
    """Binds the process-set helpers to a frontend's basics object."""
    global _basics
    _basics = basics


def _is_mpi_comm(obj: Any) -> bool:
    return hasattr(obj, "Get_group") and hasattr(obj, "Get_size")


class ProcessSet:
    """A set of global ranks that can run collectives among themselves.

    Build it from a list of ranks (stored sorted) or an mpi4py communicator, then register it with
    ``hvd.init(process_sets=[...])`` or ``hvd.add_process_set(...)`` and pass it as
    ``process_set=`` to collectives.
    """

    def __init__(self, ranks_or_comm: Union[Sequence[int], Any]) -> None:
        self.process_set_id: Optional[int] = None
        self.ranks: Optional[List[int]] = None
        self.mpi_comm: Any = None
        if _is_mpi_comm(ranks_or_comm):
            from horovod_compat.common.util import mpi_built
            if not mpi_built():
                raise ValueError("Process sets from MPI communicators need an MPI build.")
            self.mpi_comm = ranks_or_comm
        else:
            ranks = list(ranks_or_comm)
            if not all(isinstance(r, numbers.Integral) and not isinstance(r, bool)
                       for r in ranks):
                raise ValueError("ProcessSet expects a list of integer ranks or an mpi4py "
                                 f"communicator, got {ranks_or_comm!r}")
            self.ranks = sorted(int(r) for r in ranks)

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """Number of ranks in the set; None while it is not registered."""
        if self.process_set_id is None:
            return None
        return _basics._process_set_size(self.process_set_id)

    def rank(self) -> Optional[int]:
        """This process's rank within the set; None while it is not registered."""
        if self.process_set_id is None:
            return None
        return _basics._process_set_rank(self.process_set_id)

    def included(self) -> Optional[bool]:
        """Whether this process's global rank belongs to the set (None if ranks are unknown)."""
        if self.ranks is None:
            return None
        return _basics.rank() in self.ranks

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


# The communicator Horovod's ranks are numbered in when init() was given an mpi4py one.
_base_comm: Any = None


def _comm_world_ranks(comm: Any) -> List[int]:
    """Ranks of an mpi4py communicator's members, numbered as Horovod numbers them (in init()'s
    communicator, else MPI_COMM_WORLD), sorted.

    Collective over that communicator: members pass their communicator, other ranks
    MPI.COMM_NULL, and every rank gets the same list. Members that disagree (each rank passing a
    different split, say) raise ValueError on every rank.
    """
    from mpi4py import MPI
    base = _base_comm if _base_comm is not None else MPI.COMM_WORLD
    mine = None
    if comm != MPI.COMM_NULL:
        group = comm.Get_group()
        translated = MPI.Group.Translate_ranks(group, list(range(group.Get_size())),
                                               base.Get_group())
        if MPI.UNDEFINED in translated:
            mine = "outside"
        else:
            mine = sorted(int(r) for r in translated)
    views = base.allgather(mine)
    if "outside" in views:
        raise ValueError("A process set's MPI communicator has members outside the "
                         "communicator Horovod runs on.")
    lists = {tuple(v) for v in views if v is not None}
    if len(lists) != 1:
        raise ValueError("A process set built from an MPI communicator must be the same set "
                         "on every rank (members pass the communicator, the other ranks "
                         f"MPI.COMM_NULL); the ranks passed {sorted(lists)}.")
    return list(lists.pop())


def _ranks_of(process_set: ProcessSet) -> List[int]:
    if process_set.ranks is None and process_set.mpi_comm is not None:
        process_set.ranks = _comm_world_ranks(process_set.mpi_comm)
    return list(process_set.ranks or [])


def _registered_sets() -> dict:
    """Maps tuple(ranks) -> id for every set the runtime knows."""
    return {tuple(_basics._process_set_ranks(i)): i for i in _basics._process_set_ids()}


def _init_process_sets(process_sets: Optional[List[ProcessSet]]) -> None:
    """After init: fills the global set's ranks and gives registered sets their ids."""
    global_process_set.ranks = _basics._process_set_ranks(0)
    if not process_sets:
        return
    known = _registered_sets()
    given = set()
    for ps in process_sets:
        ranks = tuple(_ranks_of(ps))
        # A repeated entry stays unregistered (id None), as in Horovod.
        ps.process_set_id = None if ranks in given else known.get(ranks)
        given.add(ranks)


def _init_time_rank_lists(process_sets: Optional[List[ProcessSet]]
                          ) -> Tuple[List[List[int]], Optional[str]]:
    """Rank lists to register at init, each once, and the complaint about the first entry that
    repeats an earlier one (None when there is none). As in Horovod, a duplicate does not stop
    init: the runtime starts with the distinct sets and init() raises afterwards."""
    if not process_sets:
        return [], None
    lists: List[List[int]] = []
    duplicate = None
    for index, ps in enumerate(process_sets):
        if not isinstance(ps, ProcessSet):
            raise ValueError(f"init(process_sets=...) expects ProcessSet objects, got {ps!r}")
        ranks = _ranks_of(ps)
        if ranks in lists:
            if duplicate is None:
                duplicate = (f"Horovod could not register process_sets entry number {index}: "
                             f"it is a duplicate (ranks {ranks}); the runtime was started with "
                             f"the other sets")
            continue
        lists.append(ranks)
    return lists, duplicate


def add_process_set(process_set_or_ranks: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Registers a new process set after init (needs HOROVOD_DYNAMIC_PROCESS_SETS=1).

    Collective: every rank must call it, in the same order, with the same ranks.
    """
    if isinstance(process_set_or_ranks, ProcessSet):
        process_set = process_set_or_ranks
    else:
        process_set = ProcessSet(process_set_or_ranks)
    if process_set.mpi_comm is not None:
        raise NotImplementedError("Adding process sets from MPI communicators after init is "
                                  "not supported; pass them to hvd.init(process_sets=...).")
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} is already registered.")
    ranks = _ranks_of(process_set)
    if tuple(ranks) in _registered_sets():
        raise ValueError(f"A process set with ranks {ranks} already exists.")
    process_set.process_set_id = _basics._add_process_set(ranks)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregisters ``process_set`` (collective). False for the global or an unregistered set."""
    process_set_id = process_set.process_set_id
    if process_set_id is None or process_set_id == 0:
        return False
    process_set._invalidate()
    return _basics._remove_process_set(process_set_id)


def _temp_process_set_object(process_set_id: int) -> ProcessSet:
    """A ProcessSet handle for an id read back from an op's attributes."""
    if process_set_id == 0:
        return global_process_set
    ps = ProcessSet([])
    ps.ranks = None
    ps.process_set_id = process_set_id
    return ps

