#!/usr/bin/env python3
"""Runs Horovod 0.28.1's TensorFlow examples at np=2 on horovod_compat (issue 14 item 5).

Horovod's example files are not part of this repository: point HVDC_HOROVOD_EXAMPLES (or
--examples) at a folder holding them (the files of Horovod's examples/tensorflow2/ and
examples/tensorflow/, flat). For each example not in DEAD below (TF1-only APIs), and for
each Keras it can run on (Keras 3; tf_keras via TF_USE_LEGACY_KERAS=1), this script

1. copies the file into a scratch folder, applying the listed text substitutions of EXAMPLES
   (the "example-fix" edits today's TensorFlow and Keras 3 force, plus step-count cuts so a run takes seconds);
   an edit may name alternative texts (the forms the file has had); when none is in the file the
   run goes on unedited and the matrix reports the difference ("differs"), so a different
   upstream file is noticed without stopping the other examples;
2. runs it with ``mpirun -np 2 --timeout T python scripts/run_horovod_examples.py --exec
   example.py args...``: the --exec mode serves ``mnist.load_data`` (Keras 3's, tf_keras's and
   ``tf.keras``'s) from local Fashion-MNIST IDX files, makes every download attempt an error, then
   runs the example under the ``horovod`` import alias (horovod_compat.alias). The tf.data
   service example first starts its compute job (``horovodrun -np 2 python -m
   horovod.tensorflow.data.compute_worker``), then its training job (``horovodrun -np 2 python
   tensorflow2_mnist_data_service.py CONFIG``; an earlier form of the driver launches its
   ranks itself, through ``horovod.run``);
3. prints a matrix: example x Keras -> pass/fail, edits applied, seconds. A run that fails, or
   cannot start, is reported and the next one runs.

docs/horovod_examples.md has the matrix and what each example needs.
"""

import argparse
import gzip
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
KERAS3 = "keras3"
TF_KERAS = "tf_keras"
KERASES = (KERAS3, TF_KERAS)


class Edit(NamedTuple):
    """One text substitution: `old` -> `new`, on the Kerases listed in `on`. `old` may be a
    tuple of alternatives (forms the file has had): the first one present is replaced. When none
    is present the file differs from what the harness knows (reported), unless `optional` (a
    form of the file that needs no such edit)."""
    kind: str            # "example-fix" (forced by today's TF/Keras), "steps" (shorter run) or "data"
    why: str
    old: Union[str, Tuple[str, ...]]
    new: str
    on: Tuple[str, ...] = KERASES
    optional: bool = False

    def alternatives(self) -> Tuple[str, ...]:
        return (self.old,) if isinstance(self.old, str) else tuple(self.old)


class Example(NamedTuple):
    args: Tuple[str, ...] = ()
    edits: Tuple[Edit, ...] = ()
    kerases: Tuple[str, ...] = KERASES
    skip: Optional[str] = None      # reason the example is not run
    # The tf.data service driver: run once per dispatcher side with its own compute job.
    data_service: bool = False
    # Files the example imports from its own folder (copied and edited alongside it).
    companions: Tuple[str, ...] = ()


_OPT_VARIABLES = Edit("example-fix", "Keras 3 optimizer.variables is a list, not a method",
                      "opt.variables()", "opt.variables", (KERAS3,))
_RUN_TF_FUNCTION = Edit("example-fix", "Keras 3 compile() takes no experimental_run_tf_function",
                        ",\n{indent}experimental_run_tf_function=False)", ")", (KERAS3,))
# Forms differ here: the 0.26/0.27 files pick keras.optimizers.legacy by the Keras version (gone
# in Keras 3), the 0.28.1 release builds tf.optimizers.Adam (works on both): optional edits.
_LEGACY_OPTIMIZERS = Edit("example-fix", "keras.optimizers.legacy does not exist in Keras 3",
                          "from tensorflow.keras.optimizers import legacy as optimizers",
                          "from tensorflow.keras import optimizers", (KERAS3,), optional=True)
_KERAS_VERSION = Edit("example-fix", "tf_keras's tf.keras module has no __version__",
                      "tf.keras.__version__", "__import__('tf_keras').__version__", (TF_KERAS,),
                      optional=True)
_SYNTHETIC_ARGS = ("--num-iters", "2", "--num-batches-per-iter", "1", "--batch-size", "4")

EXAMPLES: Dict[str, Example] = {
    "tensorflow2_mnist.py": Example(edits=(
        _OPT_VARIABLES,
        Edit("steps", "10000 // size steps of batch 128 -> 8 // size",
             "dataset.take(10000 // hvd.size())", "dataset.take(8 // hvd.size())"),
    )),
    "tensorflow2_synthetic_benchmark.py": Example(
        args=("--num-warmup-batches", "1") + _SYNTHETIC_ARGS,
        edits=(_OPT_VARIABLES,)),
    "tensorflow2_keras_mnist.py": Example(edits=(
        _KERAS_VERSION,
        _LEGACY_OPTIMIZERS,
        _RUN_TF_FUNCTION._replace(old=_RUN_TF_FUNCTION.old.format(indent=" " * 24)),
        Edit("steps", "24 epochs of 500 // size steps -> 2 epochs of 8 // size",
             "steps_per_epoch=500 // hvd.size(), callbacks=callbacks, epochs=24",
             "steps_per_epoch=8 // hvd.size(), callbacks=callbacks, epochs=2"),
    )),
    "tensorflow2_keras_synthetic_benchmark.py": Example(
        args=_SYNTHETIC_ARGS,
        edits=(_RUN_TF_FUNCTION._replace(old=_RUN_TF_FUNCTION.old.format(indent=" " * 14)),)),
}

_DATA_SERVICE_STEPS = Edit("steps", "24 epochs of 32 // size steps -> 1 epoch of 4 // size",
                           "steps_per_epoch=32 // hvd.size(), callbacks=callbacks, epochs=24",
                           "steps_per_epoch=4 // hvd.size(), callbacks=callbacks, epochs=1")
DATA_SERVICE_TRAIN_FNS = (
    "tensorflow2_mnist_data_service_train_fn_compute_side_dispatcher.py",
    "tensorflow2_mnist_data_service_train_fn_training_side_dispatcher.py")
EXAMPLES["tensorflow2_mnist_data_service.py"] = Example(
    data_service=True, companions=DATA_SERVICE_TRAIN_FNS, edits=(
        # An earlier form of the driver imports the module from where it was before it moved
        # into horovod.tensorflow.data (no such module in 0.28.1).
        Edit("example-fix", "horovod.tensorflow.compute_service moved to "
                            "horovod.tensorflow.data.compute_service",
             "from horovod.tensorflow.compute_service import",
             "from horovod.tensorflow.data.compute_service import", optional=True),))
# The train_fn files run through tensorflow2_mnist_data_service.py (one per dispatcher side).
EXAMPLES[DATA_SERVICE_TRAIN_FNS[0]] = Example(edits=(
    _KERAS_VERSION, _LEGACY_OPTIMIZERS,
    _RUN_TF_FUNCTION._replace(old=_RUN_TF_FUNCTION.old.format(indent=" " * 24)),
    _DATA_SERVICE_STEPS))
EXAMPLES[DATA_SERVICE_TRAIN_FNS[1]] = Example(edits=(
    _KERAS_VERSION, _LEGACY_OPTIMIZERS,
    _RUN_TF_FUNCTION._replace(old=_RUN_TF_FUNCTION.old.format(indent=" " * 28)),
    _DATA_SERVICE_STEPS))
RUN_BY = {name: "tensorflow2_mnist_data_service.py" for name in DATA_SERVICE_TRAIN_FNS}
EXAMPLES["tensorflow_word2vec.py"] = Example(kerases=(KERAS3,), edits=(   # uses no Keras
    Edit("example-fix", "TF1 graph API: run on tf.compat.v1 with eager execution off",
         "import tensorflow as tf\n",
         "import tensorflow.compat.v1 as tf\ntf.disable_eager_execution()\n"),
    Edit("data", "the local text8 stand-in has ~2100 distinct words (text8: ~250000): "
                 "vocabulary 50000 -> 1000, else the nearest-word printout indexes past it",
         "vocabulary_size = 50000", "vocabulary_size = 1000"),
    Edit("steps", "100000 // size + 1 steps -> 20 // size + 1",
         "num_steps = 100000 // hvd.size() + 1", "num_steps = 20 // hvd.size() + 1"),
))

# Dead on TensorFlow 2 (TF1-only APIs: tf.Session, tf.estimator, tf.layers, ...): not run.
DEAD = ("tensorflow_mnist.py", "tensorflow_mnist_eager.py", "tensorflow_mnist_estimator.py",
        "tensorflow_synthetic_benchmark.py", "tensorflow_keras_mnist.py")


def apply_edits(text: str, edits: Sequence[Edit], keras: str
                ) -> Tuple[str, List[Edit], List[str]]:
    """Returns (text with the edits for `keras` applied, the edits applied, how the file differs
    from what the harness knows: one line per required edit whose text is not in it)."""
    applied = []
    differs = []
    for edit in edits:
        if keras not in edit.on:
            continue
        present = [old for old in edit.alternatives() if old in text]
        if not present:
            if not edit.optional:
                differs.append(f"text not found, edit not applied: "
                               f"{' / '.join(map(repr, edit.alternatives()))} ({edit.why})")
            continue
        text = text.replace(present[0], edit.new)
        applied.append(edit)
    return text, applied, differs


# ---- the --exec side: runs inside each rank -------------------------------------------------

def _read_idx(path: str):
    import numpy as np
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion_mnist_load_data(path: str = "mnist.npz"):
    """Stands in for mnist.load_data: Fashion-MNIST's uint8 arrays in MNIST's shapes (the `path`
    argument, a cache file name, is ignored). HVDC_EXAMPLES_DATA_DIR overrides the folder;
    HVDC_EXAMPLES_MNIST_LIMIT keeps only the first N training images."""
    del path
    data_dir = os.environ.get("HVDC_EXAMPLES_DATA_DIR", FASHION_MNIST_DIR)
    out = []
    for prefix in ("train", "t10k"):
        x = _read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
        y = _read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
        out.append((x, y))
    limit = int(os.environ.get("HVDC_EXAMPLES_MNIST_LIMIT", "0"))
    if limit > 0:
        out[0] = (out[0][0][:limit], out[0][1][:limit])
    return tuple(out)


def _blocked_download(*args, **kwargs):
    raise RuntimeError(f"run_horovod_examples: download blocked (nothing may download): {args!r}")


TEXT8_URL = "http://mattmahoney.net/dc/text8.zip"
TEXT8_BYTES = 31344016            # the size tensorflow_word2vec.py checks
TEXT_DIR = "/usr/share/common-licenses"


def local_text8(filename: str, corpus_dir: str = TEXT_DIR) -> None:
    """Writes a stand-in for text8.zip: the English text of corpus_dir's files, lower-cased,
    letters only (text8's form), in a zip member 'text8', padded in front to text8.zip's size
    (a zip is read from its end, so leading bytes do not disturb zipfile)."""
    import io
    import re
    import zipfile
    words = []
    for name in sorted(os.listdir(corpus_dir)):
        path = os.path.join(corpus_dir, name)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, errors="replace") as f:
                words += re.findall(r"[a-z]+", f.read().lower())
    if len(words) < 1000:
        raise RuntimeError(f"local_text8: too little text in {corpus_dir}")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("text8", " " + " ".join(words))
    payload = buffer.getvalue()
    if len(payload) > TEXT8_BYTES:
        raise RuntimeError("local_text8: corpus larger than text8.zip")
    with open(filename, "wb") as f:
        f.write(b"\0" * (TEXT8_BYTES - len(payload)) + payload)


def _local_urlretrieve(url, filename=None, *args, **kwargs):
    if url == TEXT8_URL and filename:
        local_text8(filename)
        return filename, None
    return _blocked_download(url, filename)


def install_redirects(module_names: Sequence[str] = ()) -> List[str]:
    """Points every mnist.load_data the example can reach at fashion_mnist_load_data and makes
    urllib downloads fail. Returns the module names patched."""
    import importlib
    import urllib.request
    urllib.request.urlopen = _blocked_download
    urllib.request.urlretrieve = _local_urlretrieve
    names = list(module_names) or ["keras.src.datasets.mnist", "keras.datasets.mnist",
                                   "tf_keras.src.datasets.mnist", "tf_keras.datasets.mnist"]
    patched = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        module.load_data = fashion_mnist_load_data
        patched.append(name)
    if not module_names:
        import tensorflow as tf
        tf.keras.datasets.mnist.load_data = fashion_mnist_load_data   # Keras 3 or tf_keras
        patched.append("tf.keras.datasets.mnist")
    return patched


def exec_example(argv: Sequence[str]) -> None:
    patched = install_redirects()
    if os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0":
        sys.stderr.write(f"run_horovod_examples: mnist.load_data served from Fashion-MNIST in "
                         f"{', '.join(patched)}; text8.zip from {TEXT_DIR}; other downloads "
                         f"blocked\n")
    from horovod_compat import alias
    alias.main(list(argv))


# ---- the driver -----------------------------------------------------------------------------

class Result(NamedTuple):
    example: str
    keras: str
    status: str          # pass / FAIL / skip / missing / error (could not run)
    edits: Tuple[str, ...]
    seconds: float
    detail: str
    differs: Tuple[str, ...] = ()   # how the file differs from what the harness knows


def _env(keras: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_", "HOROVOD_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="-1",
               HVDC_EXAMPLES_MNIST_LIMIT=env.get("HVDC_EXAMPLES_MNIST_LIMIT", "4096"))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("TF_USE_LEGACY_KERAS", None)
    if keras == TF_KERAS:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


def _run(cmd: List[str], cwd: str, env: Dict[str, str], timeout: int) -> Tuple[int, str]:
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout,
                              start_new_session=True)
        return proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        return -1, (out or "") + "\n[timeout]"


def _edited_copy(examples_dir: str, name: str, keras: str, work: str,
                 edits: Optional[Sequence[Edit]] = None) -> Tuple[Tuple[str, ...], List[str]]:
    """Writes name, edited (per EXAMPLES by default), into work; returns (edits applied, how
    the file differs)."""
    with open(os.path.join(examples_dir, name)) as f:
        text, applied, differs = apply_edits(
            f.read(), EXAMPLES[name].edits if edits is None else edits, keras)
    with open(os.path.join(work, name), "w") as f:
        f.write(text)
    return tuple(f"{e.kind}: {e.why}" for e in applied), [f"{name}: {d}" for d in differs]


def run_one(examples_dir: str, name: str, keras: str, python: str, np_: int,
            timeout: int, spec: Optional[Example] = None, side: str = "compute") -> Result:
    """Runs examples_dir/name (edited per `spec`, default EXAMPLES[name]) at np_ ranks. Never
    raises: what goes wrong is the Result's status and detail."""
    spec = spec or EXAMPLES[name]
    label = f"{name} ({side} side)" if spec.data_service else name
    if spec.skip:
        return Result(label, keras, "skip", (), 0.0, spec.skip)
    needed = (name,) + spec.companions
    absent = [n for n in needed if not os.path.exists(os.path.join(examples_dir, n))]
    if absent:
        return Result(label, keras, "missing", (), 0.0,
                      f"{', '.join(os.path.join(examples_dir, n) for n in absent)} not found")
    work = tempfile.mkdtemp(prefix="hvdc_example_")
    start = time.monotonic()
    try:
        edits, differs = _edited_copy(examples_dir, name, keras, work, spec.edits)
        for companion in spec.companions:
            more, found = _edited_copy(examples_dir, companion, keras, work)
            edits += tuple(f"{companion}: {e}" for e in more)
            differs += found
        script = os.path.join(work, name)
        if spec.data_service:
            with open(script) as f:
                launches = driver_launches_ranks(f.read())
            edits += (f"run: {DRIVER_FORMS[launches]}",)
            code, output = _run_data_service(script, work, keras, python, np_, timeout, side,
                                             launches)
        else:
            cmd = ["mpirun", "-np", str(np_), "--timeout", str(timeout), "--bind-to", "none",
                   "--oversubscribe", "--mca", "mpi_yield_when_idle", "1",
                   "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL", "-x",
                   "CUDA_VISIBLE_DEVICES", "-x", "HVDC_EXAMPLES_MNIST_LIMIT"]
            if keras == TF_KERAS:
                cmd += ["-x", "TF_USE_LEGACY_KERAS"]
            cmd += [python, os.path.abspath(__file__), "--exec", script, *spec.args]
            code, output = _run(cmd, work, _env(keras), timeout + 60)
    except Exception as error:  # noqa: BLE001 - reported in the matrix; the next run goes on
        return Result(label, keras, "error", (), time.monotonic() - start,
                      f"{type(error).__name__}: {error}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    status = "pass" if code == 0 else "FAIL"
    return Result(label, keras, status, edits, time.monotonic() - start, output, tuple(differs))


# Stand-ins the data-service ranks import (they are started by horovod.run, not by --exec).
_SITECUSTOMIZE = """\
import os
if os.environ.get("HVDC_EXAMPLES_REDIRECT") == "1":
    import importlib.util
    _spec = importlib.util.spec_from_file_location("_hvdc_harness", {harness!r})
    _harness = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_harness)
    _harness.install_redirects()
"""
_FILELOCK = """\
# Stand-in for the filelock package (not installed): an exclusive flock on the file.
import fcntl


class FileLock:
    def __init__(self, path, timeout=-1):
        self._path = path
        self._fd = None

    def __enter__(self):
        self._fd = open(self._path, "a")
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._fd.close()
"""


# The driver has had two forms. The released one (0.28.1's) trains in every rank of its own
# job, reading the config file its positional argument names (`horovodrun -np 2 python
# tensorflow2_mnist_data_service.py CONFIG`, as Horovod's docs run it); an earlier one is a
# launcher itself (`--compute-service-config-file CONFIG --training-tasks N`, ranks started
# through horovod.run). Keyed by driver_launches_ranks().
DRIVER_FORMS = {
    False: "training job `horovodrun -np N python <driver> CONFIG` (the released driver form)",
    True: "`python <driver> --compute-service-config-file CONFIG --training-tasks N`, ranks "
          "through horovod.run (an earlier driver form)",
}


def driver_launches_ranks(driver_text: str) -> bool:
    return "--compute-service-config-file" in driver_text


def _run_data_service(script: str, work: str, keras: str, python: str, np_: int, timeout: int,
                      side: str, launches_ranks: bool) -> Tuple[int, str]:
    """The tf.data service example: its compute job (np_ ranks, dispatchers on `side`) through
    our horovodrun, then the training on np_ ranks: the driver run by our horovodrun, or (the
    earlier form) the driver starting them through horovod.run (our run()). The ranks find the
    train_fn modules, the MNIST redirect and a filelock stand-in in the scratch folder (on
    PYTHONPATH)."""
    with open(os.path.join(work, "sitecustomize.py"), "w") as f:
        f.write(_SITECUSTOMIZE.format(harness=os.path.abspath(__file__)))
    try:
        import filelock  # noqa: F401
    except ImportError:
        with open(os.path.join(work, "filelock.py"), "w") as f:
            f.write(_FILELOCK)
    env = _env(keras)
    env["PYTHONPATH"] = work + os.pathsep + env["PYTHONPATH"]
    env["HVDC_EXAMPLES_REDIRECT"] = "1"
    env["HOME"] = work      # the example's lock file goes to ~/.horovod_lock
    config = os.path.join(work, "compute.json")
    compute_cmd = [python, "-m", "horovod_compat.runner.launch", "-np", str(np_),
                   f"--mpi-args=--timeout {timeout} --oversubscribe --bind-to none",
                   python, "-m", "horovod.tensorflow.data.compute_worker",   # as Horovod's docs
                   "--dispatcher-side", side, "--timeout", "300", config]
    compute = subprocess.Popen(compute_cmd, cwd=work, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not os.path.exists(config) and compute.poll() is None:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if not os.path.exists(config):
            # The training job would wait for the file until its timeout: report the compute
            # job's output instead.
            if compute.poll() is None:
                os.killpg(compute.pid, signal.SIGKILL)
            out = compute.communicate()[0]
            return 1, (f"--- compute job (exit {compute.returncode}) wrote no {config}; "
                       f"training not started ---\n{out}")
        if launches_ranks:
            training = [python, os.path.abspath(__file__), "--exec", script,
                        "--compute-service-config-file", config, "--training-tasks", str(np_)]
        else:
            training = [python, "-m", "horovod_compat.runner.launch", "-np", str(np_),
                        f"--mpi-args=--timeout {timeout} --oversubscribe --bind-to none",
                        python, script, config]
        code, output = _run(training, work, env, timeout + 60)
        try:
            compute_out = compute.communicate(timeout=60)[0]
        except subprocess.TimeoutExpired:
            os.killpg(compute.pid, signal.SIGKILL)
            compute_out = compute.communicate()[0] + "\n[compute job killed: still running]"
            code = code or 1
        if compute.returncode not in (0, None) and code == 0:
            code = compute.returncode
        logs = ""
        for root, _dirs, files in os.walk(os.path.join(work, "training-logs")):
            for name in sorted(files):
                with open(os.path.join(root, name), errors="replace") as f:
                    logs += f"--- {os.path.relpath(os.path.join(root, name), work)} ---\n"
                    logs += f.read()[-4000:] + "\n"
        return code, (f"--- compute job ---\n{compute_out}\n--- driver ---\n{output}\n"
                      f"{logs}")
    finally:
        if compute.poll() is None:
            os.killpg(compute.pid, signal.SIGKILL)
            compute.communicate()


def format_matrix(results: Sequence[Result]) -> str:
    lines = ["| example | Keras | result | edits applied | seconds |", "|---|---|---|---|---|"]
    for r in results:
        edits = "; ".join(r.edits) if r.edits else "none"
        if r.status in ("skip", "missing", "error"):
            edits = r.detail
        if r.differs:
            edits += "; DIFFERS: " + "; ".join(r.differs)
        lines.append(f"| `{r.example}` | {r.keras} | {r.status} | {edits} | {r.seconds:.0f} |")
    return "\n".join(lines)


def runs(names: Sequence[str], kerases: Sequence[str]) -> List[Tuple[str, str, str]]:
    """(example, keras, dispatcher side) of every run, in order."""
    out = []
    for name in names:
        spec = EXAMPLES[name]
        for keras in (kerases or spec.kerases):
            for side in (("compute", "training") if spec.data_service else ("compute",)):
                out.append((name, keras, side))
            if spec.skip:
                break
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--exec"]:
        exec_example(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", default=os.environ.get("HVDC_HOROVOD_EXAMPLES"),
                        help="folder with Horovod's example files (default $HVDC_HOROVOD_EXAMPLES)")
    parser.add_argument("--only", action="append", default=[],
                        help="run only this example (repeatable)")
    parser.add_argument("--keras", choices=KERASES, action="append", default=[],
                        help="run only on this Keras (repeatable)")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=600, help="mpirun --timeout per run")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--verbose", action="store_true", help="print every run's output")
    args = parser.parse_args(argv)
    if not args.examples or not os.path.isdir(args.examples):
        parser.error("give --examples DIR or set HVDC_HOROVOD_EXAMPLES to a folder holding "
                     "Horovod's examples/tensorflow2 and examples/tensorflow files")
    names = args.only or [n for n in EXAMPLES if n not in RUN_BY]
    unknown = [n for n in names if n not in EXAMPLES]
    if unknown:
        parser.error(f"unknown example(s) {unknown}; known: {sorted(EXAMPLES)}; "
                     f"dead (TF1-only APIs): {list(DEAD)}")
    names = list(dict.fromkeys(RUN_BY.get(n, n) for n in names))
    results = []
    for name, keras, side in runs(names, args.keras):
        result = run_one(args.examples, name, keras, args.python, args.np, args.timeout,
                         side=side)
        print(f"{result.status:7} {result.example} [{keras}] {result.seconds:.0f}s", flush=True)
        for line in result.differs:
            print(f"        differs: {line}", flush=True)
        if result.status in ("FAIL", "error") or (args.verbose and result.status == "pass"):
            print(result.detail[-6000:], flush=True)
        results.append(result)
    print(format_matrix(results))
    bad = [r for r in results if r.status in ("FAIL", "error") or r.differs]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
