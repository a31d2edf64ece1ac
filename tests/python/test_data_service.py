"""horovod.tensorflow.data: the compute service on its own, then compute jobs (horovodrun -np 2
python -m horovod_compat.tensorflow.data.compute_worker) feeding a training process through
TensorFlow's tf.data service, with the dispatcher on either side, the compute job started
before or after the training, a compute worker that dies, and a client with the wrong key.

The jobs run only from a test process started without a launcher."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from horovod_compat.runner.common.service import compute_service as cs
from horovod_compat.tensorflow.data import TfDataServiceConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

needs_single_process = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ or "HOROVOD_RANK" in os.environ,
    reason="starts its own jobs; run from the test process started without a launcher")


# -- the compute service on its own ------------------------------------------------------------

@pytest.fixture
def service():
    svc = cs.ComputeService(dispatchers=2, workers_per_dispatcher=1, key=b"the key")
    yield svc
    svc.shutdown()


@pytest.mark.timeout(60)
def test_dispatchers_and_workers_register_and_are_waited_for(service):
    client = cs.ComputeClient(service.addresses(), b"the key")
    found = {}
    waiter = threading.Thread(target=lambda: found.update(
        address=client.wait_for_dispatcher_registration(1, 30)))
    waiter.start()
    client.register_dispatcher(1, "grpc://h:1")
    waiter.join(30)
    assert found == {"address": "grpc://h:1"}
    client.register_dispatcher(1, "grpc://h:1")       # the same again is fine
    with pytest.raises(ValueError, match="already registered at grpc://h:1"):
        client.register_dispatcher(1, "grpc://h:2")
    with pytest.raises(IndexError, match=r"within \[0..1\]"):
        client.register_dispatcher(2, "grpc://h:3")
    with pytest.raises(TimeoutError, match="the 1 worker.s. of dispatcher 1 to register"):
        client.wait_for_dispatcher_worker_registration(1, 0.5)
    client.register_worker_for_dispatcher(1, 7)
    client.wait_for_dispatcher_worker_registration(1, 5)
    assert client.status() == {"shutdown": False, "lost": []}
    assert client.wait_for_shutdown(0.2) is False
    client.shutdown()
    assert client.wait_for_shutdown(5) is True
    assert client.heartbeat(7) is True


@pytest.mark.timeout(60)
def test_wrong_key_is_refused(service):
    client = cs.ComputeClient(service.addresses(), b"another key")
    with pytest.raises(cs.ComputeServiceError, match="the key differs from the compute job's"):
        client.register_dispatcher(0, "grpc://h:1")
    right = cs.ComputeClient(service.addresses(), b"the key")
    with pytest.raises(TimeoutError):
        right.wait_for_dispatcher_registration(0, 0.2)   # nothing was registered


@pytest.mark.timeout(60)
def test_a_silent_worker_is_reported_lost(service, monkeypatch):
    monkeypatch.setattr(cs, "WORKER_LOST_AFTER_SECONDS", 0.5)
    client = cs.ComputeClient(service.addresses(), b"the key")
    client.register_worker_for_dispatcher(0, 3)
    time.sleep(1.0)
    with pytest.raises(cs.ComputeServiceError, match="compute worker 3 .of dispatcher 0. sent "
                                                     "no heartbeat"):
        client.wait_for_dispatcher_worker_registration(1, 5)
    assert len(client.status()["lost"]) == 1


@pytest.mark.timeout(60)
def test_a_service_that_is_gone_is_a_clear_error():
    svc = cs.ComputeService(1, 1, key=b"k")
    addresses = svc.addresses()
    svc.shutdown()
    client = cs.ComputeClient(addresses, b"k")
    with pytest.raises(cs.ComputeServiceError, match="cannot reach the compute service"):
        client.register_dispatcher(0, "grpc://h:1")


def test_config_file_round_trip(tmp_path):
    config = TfDataServiceConfig(dispatchers=2, workers_per_dispatcher=3,
                                 dispatcher_side="training",
                                 addresses={"lo": [("127.0.0.1", 4000)]}, key=b"\x00\xffk",
                                 timeout=9)
    path = str(tmp_path / "config.json")
    config.write(path)
    assert os.stat(path).st_mode & 0o077 == 0       # it holds the key
    assert TfDataServiceConfig.read(path) == config
    with pytest.raises(ValueError, match="dispatcher_side"):
        TfDataServiceConfig(1, 1, "elsewhere", {}, b"k")


# -- jobs --------------------------------------------------------------------------------------

# One training process: 120 elements through the data service, each exactly once.
TRAINING = """
    import sys
    import tensorflow as tf
    from horovod.tensorflow.data import TfDataServiceConfig, tf_data_service
    config = TfDataServiceConfig.read(sys.argv[1], wait_for_file_creation=True)
    with tf_data_service(config, 0) as address:
        dataset = tf.data.Dataset.range(120).map(lambda x: x * 3).apply(
            tf.data.experimental.service.distribute(processing_mode="distributed_epoch",
                                                    service=address))
        values = sorted(int(v) for v in dataset.as_numpy_iterator())
        assert values == [3 * i for i in range(120)], values
        print("TRAINING-OK", config.dispatcher_side, flush=True)
        if len(sys.argv) > 2:      # keep reading until the compute job fails
            print("TRAINING-WAITING", flush=True)
            for _ in dataset.repeat():
                pass
    config.compute_client().shutdown()
"""


def _env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_", "PRTE_", "HOROVOD_", "HVDC_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    return env


def _compute_job(config_file, side, timeout=60):
    cmd = [sys.executable, "-m", "horovod_compat.runner.launch", "-np", "2",
           "--mpi-args=--timeout 200", sys.executable, "-m",
           "horovod_compat.tensorflow.data.compute_worker", "--dispatcher-side", side,
           "--timeout", str(timeout), config_file]
    return subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def _training(tmp_path, config_file, *extra):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAINING))
    return subprocess.Popen([sys.executable, "-m", "horovod_compat.alias", str(script),
                             config_file, *extra], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(*procs, timeout=200):
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    return outputs


@needs_single_process
@pytest.mark.timeout(300)
@pytest.mark.parametrize("side,compute_first", [("compute", True), ("training", False)])
def test_compute_job_feeds_training(tmp_path, side, compute_first):
    config_file = str(tmp_path / "compute.json")
    if compute_first:
        compute = _compute_job(config_file, side)
        training = _training(tmp_path, config_file)
    else:
        training = _training(tmp_path, config_file)
        time.sleep(2)   # the training waits for the file
        compute = _compute_job(config_file, side)
    train_out, compute_out = _finish(training, compute)
    assert training.returncode == 0, train_out + compute_out
    assert f"TRAINING-OK {side}" in train_out, train_out
    assert compute.returncode == 0, compute_out


@needs_single_process
@pytest.mark.timeout(300)
def test_a_dying_compute_worker_ends_the_training_with_an_error(tmp_path):
    config_file = str(tmp_path / "compute.json")
    compute = _compute_job(config_file, "compute")
    training = _training(tmp_path, config_file, "--wait")
    lines = []
    try:
        for line in training.stdout:
            lines.append(line)
            if "TRAINING-WAITING" in line:
                break
        else:
            raise AssertionError("".join(lines))
        # The compute job's rank 1 dies; the launcher ends its job, the service with it.
        compute_lines = []
        for line in compute.stdout:
            compute_lines.append(line)
            match = re.search(r"compute worker rank=1 .* pid=(\d+)", "".join(compute_lines))
            if match:
                os.kill(int(match.group(1)), signal.SIGKILL)
                break
    finally:
        train_out, _ = _finish(training, compute, timeout=120)
    assert training.returncode != 0, "".join(lines) + train_out
    assert "the tf.data service failed" in train_out, train_out
