"""Lifecycle, topology, constants and Python-side validation."""

import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import tensorflow as tf

import horovod_compat
import horovod_compat.tensorflow as hvd
from horovod_compat.common.exceptions import HorovodInternalError


def _launcher_size() -> int:
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if var in os.environ:
            return int(os.environ[var])
    return 1


def _launcher_rank() -> int:
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def test_topology_matches_launcher():
    assert hvd.is_initialized()
    assert hvd.size() == _launcher_size()
    assert hvd.rank() == _launcher_rank()
    assert 0 <= hvd.local_rank() < hvd.local_size()
    assert 0 <= hvd.cross_rank() < hvd.cross_size()
    assert hvd.is_homogeneous() in (True, False)
    hvd.init()  # a second init is harmless
    assert hvd.size() == _launcher_size()


def test_runtime_valued_ops_match_python():
    assert int(hvd.size_op()) == hvd.size()
    assert int(hvd.rank_op()) == hvd.rank()
    assert int(hvd.local_rank_op()) == hvd.local_rank()
    assert int(hvd.local_size_op()) == hvd.local_size()
    assert int(hvd.process_set_included_op()) == 1


def test_constants_and_capabilities():
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    assert hvd.mpi_built() is True
    assert isinstance(hvd.nccl_built(), int)
    assert hvd.ddl_built() is False and hvd.ccl_built() is False
    import horovod_compat.keras as hk
    import horovod_compat.tensorflow.keras as hvdk
    from horovod_compat.common import util as common_util
    assert hvd.sycl_built() is False and hvdk.sycl_built() is False
    assert hk.sycl_built() is False and common_util.sycl_built() is False
    # The TCP transport answers for Gloo once the core reports it (issue 11).
    from horovod_compat import _core
    from horovod_compat.common import util
    core_gloo_built = getattr(_core, "gloo_built", None)
    expected = bool(core_gloo_built()) if core_gloo_built is not None else False
    assert hvd.gloo_built() is expected and util.gloo_built() is expected
    assert isinstance(hvd.gloo_enabled(), bool)
    assert not (hvd.gloo_enabled() and hvd.mpi_enabled())
    if not expected or "OMPI_COMM_WORLD_SIZE" in os.environ:
        assert hvd.gloo_enabled() is False
    assert hvd.rocm_built() is False
    assert isinstance(horovod_compat.__version__, str)
    assert hvd.check_num_rank_power_of_2(4) and not hvd.check_num_rank_power_of_2(3)
    assert hvd.Compression.none is hvd.compression.NoneCompressor
    assert hvd.Compression.fp16 is hvd.compression.FP16Compressor


def test_average_backwards_compatibility():
    assert hvd.handle_average_backwards_compatibility(None, None) == hvd.Average
    with pytest.raises(ValueError):
        hvd.handle_average_backwards_compatibility(hvd.Sum, True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert hvd.handle_average_backwards_compatibility(None, False) == hvd.Sum
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)


def test_process_set_str_and_validation():
    ps = hvd.ProcessSet([2, 0, 1])
    assert ps.ranks == [0, 1, 2]
    assert str(ps) == "ProcessSet(process_set_id=None, ranks=[0, 1, 2], mpi_comm=None)"
    assert ps.size() is None and ps.rank() is None
    with pytest.raises(ValueError):
        hvd.ProcessSet([0, "a"])
    assert hvd.global_process_set.process_set_id == 0
    assert hvd.global_process_set.ranks == list(range(hvd.size()))
    assert hvd.global_process_set.size() == hvd.size()
    assert hvd.global_process_set.rank() == hvd.rank()
    assert hvd.global_process_set.included()


def test_unknown_process_set_raises_value_error():
    bogus = hvd.ProcessSet([0])
    bogus.process_set_id = 1234
    with pytest.raises(ValueError):
        hvd.allreduce(tf.constant([1.0]), process_set=bogus)


def test_adasum_not_implemented():
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(tf.constant([1.0]), op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                 op=hvd.Adasum)


def test_elastic_run_outside_an_elastic_job():
    # One sync and one call; a lost peer is not retried without an elastic launcher
    # (test_elastic_run.py and test_elastic_job.py test the elastic job).
    state = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, value=hvd.rank())
    calls = []

    @hvd.elastic.run
    def train(state, extra):
        calls.append((state.value, extra))
        return "done"

    assert train(state, extra=3) == "done" and calls == [(0, 3)]

    @hvd.elastic.run
    def fails(state):
        raise HorovodInternalError("lost")

    with pytest.raises(HorovodInternalError):
        fails(state)


def test_broadcast_global_variables_eager_raises():
    with pytest.raises(RuntimeError):
        hvd.broadcast_global_variables(0)


def test_barrier():
    hvd.barrier()


def _run_child(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI_", "PMIX_", "HOROVOD_"))}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=240)


def test_use_before_init_and_single_process():
    """In a fresh process with no launcher: ValueError before init, then rank 0 of 1."""
    result = _run_child("""
        import tensorflow as tf
        import horovod_compat.tensorflow as hvd
        for call in (hvd.size, hvd.rank, hvd.local_rank,
                     lambda: hvd.allreduce(tf.constant([1.0]))):
            try:
                call()
            except ValueError as e:
                assert "hvd.init()" in str(e), e
            else:
                raise AssertionError("no ValueError before init")
        hvd.init()
        assert (hvd.rank(), hvd.size()) == (0, 1)
        x = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum)
        assert x.numpy().tolist() == [1.0, 2.0]
        hvd.shutdown()
        assert not hvd.is_initialized()
        print("CHILD-OK")
    """)
    assert "CHILD-OK" in result.stdout, result.stdout + result.stderr



DUPLICATE_SETS_CHILD = """
    import tensorflow as tf
    import horovod_compat.tensorflow as hvd
    first, again = hvd.ProcessSet([0]), hvd.ProcessSet([0])
    try:
        hvd.init(process_sets=[first, again])
    except ValueError as e:
        assert "entry number 1" in str(e) and "duplicate" in str(e), e
    else:
        raise AssertionError("no ValueError for a duplicate process set")
    assert hvd.is_initialized() and hvd.size() == 2
    assert first.process_set_id is not None and again.process_set_id is None
    valid, odd = hvd.ProcessSet([0]), hvd.ProcessSet([1])
    hvd.init(process_sets=[valid])
    assert valid.process_set_id == first.process_set_id
    x = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
    assert x.numpy().tolist() == [3.0], x
    if hvd.rank() == 0:
        y = hvd.allreduce(tf.constant([5.0]), op=hvd.Sum, process_set=valid)
        assert y.numpy().tolist() == [5.0], y
    print(f"CHILD-OK {hvd.rank()}", flush=True)
"""


@pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ or "HOROVOD_RANK" in os.environ,
                    reason="starts its own mpirun; run from the test process without a launcher")
def test_init_with_duplicate_process_sets_stays_initialised(tmp_path):
    """Horovod raises ValueError for a repeated set but is initialised afterwards: size() and
    rank() work, the first entry is registered, and a later init() with a valid list goes on."""
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(DUPLICATE_SETS_CHILD))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI_", "PMIX_", "HOROVOD_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    result = subprocess.run(["mpirun", "--timeout", "200", "-np", "2", "--oversubscribe",
                             "--bind-to", "none", sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            timeout=240)
    assert result.returncode == 0, result.stdout
    assert sorted(re.findall(r"CHILD-OK \d", result.stdout)) == ["CHILD-OK 0", "CHILD-OK 1"], \
        result.stdout
