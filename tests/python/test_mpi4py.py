"""mpi4py communicators: hvd.init(comm=<Comm>) and hvd.ProcessSet(<Comm>), in one nested np=3 job
(run only from the test process started without mpirun, like the other end-to-end jobs).

The job checks, on every rank, each against values it computes itself:
- two ProcessSets whose communicators disagree across ranks (an even/odd split) fail init() with
  ValueError on every rank, and leave Horovod uninitialized;
- init(comm=<all ranks in reverse order>): hvd.rank() follows the communicator, not the world, and
  allreduce/allgather/broadcast run over it;
- after shutdown, init(process_sets=[ProcessSet(<ranks 0 and 2>)]) where rank 1 passes
  MPI.COMM_NULL: the set's ranks are known everywhere, and its members reduce among themselves.
"""

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

needs_single_process = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="end-to-end launcher tests run from the test process started without mpirun")

JOB = """
from mpi4py import MPI
import horovod_compat.tensorflow as hvd
import tensorflow as tf

w = MPI.COMM_WORLD
me, n = w.rank, w.size
assert n == 3, n

# 1. Communicators that are different sets on different ranks.
split = w.Split(color=me % 2, key=me)
try:
    hvd.init(process_sets=[hvd.ProcessSet(split)])
except ValueError as e:
    assert "same set on every rank" in str(e), e
    assert not hvd.is_initialized()
    print(f"rank {me}: mismatched communicators rejected", flush=True)
else:
    raise AssertionError("init() accepted process sets that differ across ranks")

# 2. Horovod on a borrowed communicator: every rank, in reverse order.
rev = w.Split(color=0, key=n - 1 - me)
hvd.init(comm=rev)
assert (hvd.rank(), hvd.size()) == (n - 1 - me, n), (hvd.rank(), hvd.size())
total = hvd.allreduce(tf.constant([float(me + 1)]), op=hvd.Sum, name="rev_sum").numpy()
assert total.tolist() == [float(sum(range(1, n + 1)))], total
gathered = hvd.allgather(tf.constant([me]), name="rev_gather").numpy().tolist()
assert gathered == list(reversed(range(n))), gathered  # in Horovod's rank order
root_value = hvd.broadcast(tf.constant([me]), root_rank=0, name="rev_bcast").numpy().tolist()
assert root_value == [n - 1], root_value  # Horovod's rank 0 is world rank n - 1
print(f"rank {me}: borrowed communicator ok (hvd rank {hvd.rank()})", flush=True)
hvd.shutdown()

# 3. A process set from a communicator that rank 1 is not part of.
pair = w.Split(color=MPI.UNDEFINED if me == 1 else 0, key=me)
assert (pair == MPI.COMM_NULL) == (me == 1)
ps = hvd.ProcessSet(pair)
hvd.init(process_sets=[ps])
assert ps.ranks == [0, 2], ps
assert ps.process_set_id is not None and ps.process_set_id > 0, ps
assert ps.included() == (me != 1), ps
if ps.included():
    s = hvd.allreduce(tf.constant([float(me)]), op=hvd.Sum, process_set=ps, name="pair_sum")
    assert s.numpy().tolist() == [2.0], s
    assert ps.size() == 2 and ps.rank() == (0 if me == 0 else 1), (ps.size(), ps.rank())
world_sum = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="world_sum").numpy().tolist()
assert world_sum == [3.0], world_sum
print(f"rank {me}: communicator process set ok", flush=True)
"""


@needs_single_process
def test_mpi4py_communicators(tmp_path):
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(JOB))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_", "HOROVOD_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "-np", "3",
           "--mpi-args=--timeout 200", sys.executable, str(path)]
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=240)
    out = result.stdout
    assert result.returncode == 0, out[-8000:]
    for rank in range(3):
        assert f"rank {rank}: mismatched communicators rejected" in out, out[-8000:]
        assert f"rank {rank}: borrowed communicator ok (hvd rank {2 - rank})" in out, out[-8000:]
        assert f"rank {rank}: communicator process set ok" in out, out[-8000:]
