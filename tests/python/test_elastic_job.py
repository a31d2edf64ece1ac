"""An elastic job where the test plays the launcher (elastic_fake_driver.py): three workers
(elastic_worker_job.py) join round 0, one is SIGKILLed mid-training, the test forms round 1 of
the two survivors, and they roll back to their last commit, re-initialise, finish with
identical weights, and the weights hold exactly the committed steps.

Needs the core's HVDC_TCP_RENDEZVOUS_SCOPE (each round rendezvouses in its own scope). The
workers are separate processes, so it runs once, in a job of one process (under mpirun -np N
every rank would start its own workers: skipped there)."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import horovod_compat.tensorflow as hvd

from elastic_fake_driver import FakeDriver

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JOB = os.path.join(HERE, "elastic_worker_job.py")

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _one_process_job():
    # The same answer on every rank of an mpirun job, so all skip together.
    if hvd.size() > 1:
        pytest.skip("starts its own workers; runs in a job of one process")


def _progress(out_dir, identity):
    try:
        with open(os.path.join(out_dir, identity.replace(":", "_") + ".progress")) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


def _wait(condition, what, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def _start(driver, identity, mode, out_dir, total, commit_every):
    host, local_rank = identity.split(":")
    env = dict(os.environ)
    for name in list(env):
        # Whatever launched pytest must not leak its identity into the workers.
        if name.startswith(("HOROVOD_", "HVDC_", "OMPI_", "PMIX_", "PMI_")):
            del env[name]
    env.update(driver.worker_env(host, int(local_rank)))
    env["PYTHONPATH"] = os.pathsep.join([ROOT, HERE, env.get("PYTHONPATH", "")])
    env["HOROVOD_ELASTIC_TIMEOUT"] = "120"
    if mode == "tf_keras":
        env["TF_USE_LEGACY_KERAS"] = "1"
    # A short peer-loss exit timer, which an elastic job must not arm (the survivors re-form).
    env["HOROVOD_PEER_LOSS_EXIT_SECONDS"] = "1"
    log = open(os.path.join(out_dir, identity.replace(":", "_") + ".log"), "w")
    return subprocess.Popen([sys.executable, JOB, mode, out_dir, str(total), str(commit_every)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def _logs(out_dir):
    text = []
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".log"):
            with open(os.path.join(out_dir, name)) as f:
                text.append(f"--- {name}\n{f.read()[-3000:]}")
    return "\n".join(text)


def _run_job(tmp_path, mode, total, commit_every, kill_after):
    out_dir = str(tmp_path)
    ids = ["localhost:0", "localhost:1", "localhost:2"]
    procs = {}
    with FakeDriver(secret=b"elastic-test") as driver:
        try:
            for identity in ids:
                procs[identity] = _start(driver, identity, mode, out_dir, total, commit_every)
            for identity in ids:
                driver.wait_ready(identity, -1)
            driver.form_round(0, ids)
            victim = ids[2]
            _wait(lambda: _progress(out_dir, victim) >= kill_after,
                  f"{victim} never committed step {kill_after}:\n{_logs(out_dir)}")
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(timeout=30)
            survivors = ids[:2]
            for identity in survivors:
                driver.wait_ready(identity, 0)
            committed_at_kill = _progress(out_dir, survivors[0])
            driver.form_round(1, survivors)
            for identity in survivors:
                assert procs[identity].wait(timeout=180) == 0, _logs(out_dir)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    results = []
    for identity in survivors:
        with open(os.path.join(out_dir, identity.replace(":", "_") + ".json")) as f:
            results.append(json.load(f))
    return results, committed_at_kill, _logs(out_dir)


def test_survivors_roll_back_reinitialise_and_finish(tmp_path):
    total, commit_every = 60, 5
    results, committed_at_kill, logs = _run_job(tmp_path, "loop", total, commit_every,
                                                kill_after=10)
    first, second = results
    assert first["weights"] == second["weights"], logs
    # Every step added the average of step + 1: sum(1..total) exactly when each step counted
    # once (the rolled-back ones were undone).
    assert first["weights"] == [total * (total + 1) / 2] * 4, logs
    assert first["step"] == second["step"] == total
    assert [r["size"] for r in results] == [2, 2] and sorted(r["rank"] for r in results) == [0, 1]
    for result in results:
        starts = [e["start_at"] for e in result["events"] if "start_at" in e]
        # The first attempt from 0; the second from the commit the survivors rolled back to.
        assert starts[0] == 0 and len(starts) == 2, logs
        assert starts[1] % commit_every == 0 and starts[1] >= committed_at_kill - commit_every
        assert [e["reset_to_size"] for e in result["events"] if "reset_to_size" in e] == [2]


@pytest.mark.parametrize("mode", ["keras", "tf_keras"])
def test_keras_fit_with_elastic_callbacks_survives_a_lost_worker(tmp_path, mode):
    import keras

    commit_every = 2
    steps_per_epoch, epochs = commit_every * 3, 3
    results, _, logs = _run_job(tmp_path, mode, steps_per_epoch * epochs, commit_every,
                                kill_after=steps_per_epoch + 1)
    first, second = results
    assert first["weights"] == second["weights"], logs
    for result in results:
        starts = [e["start_at"] for e in result["events"] if "start_at" in e]
        # Started at (epoch 0, batch 0), then again from a commit after the first epoch.
        assert len(starts) == 2 and starts[0] == [0, 0] and starts[1] >= [1, 0], logs
        assert [e["reset_to_size"] for e in result["events"] if "reset_to_size" in e] == [2]
    *kernel, count = first["weights"]
    # Each training batch ran once in the committed weights: the counter rolled back too.
    assert count == steps_per_epoch * epochs, logs
    # The same data on every rank: the averaged gradient is one process's, so the result is
    # that of an uninterrupted fit of the same batches (Keras 3 computes it for tf_keras too:
    # the same SGD on the same mean squared error).
    x = np.linspace(-1.0, 1.0, steps_per_epoch * 2 * 4, dtype=np.float32).reshape(-1, 4)
    y = x.sum(axis=1, keepdims=True) * 0.5
    reference = keras.Sequential([keras.Input((4,)),
                                  keras.layers.Dense(1, use_bias=False,
                                                     kernel_initializer="zeros")])
    reference.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    reference.fit(x, y, batch_size=2, epochs=epochs, shuffle=False, verbose=0)
    np.testing.assert_allclose(kernel, reference.get_weights()[0].ravel(), rtol=1e-5,
                               atol=1e-7)
