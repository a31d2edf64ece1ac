"""scripts/run_horovod_examples.py: its substitutions and MNIST redirect on a fake example of our
own, and (only with HVDC_HOROVOD_EXAMPLES set) the real matrix over Horovod's example files."""

import importlib.util
import os
import sys
import types
import urllib.request
import re
import zipfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FASHION = "/usr/share/datasets/fashion-mnist"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


harness = _load("run_horovod_examples", os.path.join(ROOT, "scripts", "run_horovod_examples.py"))
fashion = _load("fashion_mnist_data", os.path.join(ROOT, "examples", "fashion_mnist_data.py"))

needs_data = pytest.mark.skipif(not os.path.isdir(FASHION), reason=f"no {FASHION}")
single_process = pytest.mark.skipif(
    "OMPI_COMM_WORLD_SIZE" in os.environ,
    reason="launches its own mpirun job; runs from the test process started without mpirun")

FAKE_EXAMPLE = """\
import tensorflow as tf
import horovod.tensorflow as hvd

LOOP = 1000
hvd.init()
(x, y), (xt, yt) = tf.keras.datasets.mnist.load_data(path='mnist-%d.npz' % hvd.rank())
# every rank contributes its own data: the sum shows both ranks read the same arrays
total = hvd.allreduce(tf.constant(float(x[:, 14, :].sum() + hvd.rank()), tf.float64),
                      op=hvd.Sum)
if hvd.rank() == 0:
    print('size %d: train %s %s test %s sum %d LOOP=%d' % (
        hvd.size(), x.shape, x.dtype, xt.shape, int(total.numpy()), LOOP))
"""


def test_apply_edits_per_keras():
    text = "a = opt.variables()\nfor i in range(1000):\n    pass\n"
    edits = (harness.Edit("example-fix", "k3 only", "opt.variables()", "opt.variables",
                          (harness.KERAS3,)),
             harness.Edit("steps", "shorter", "range(1000)", "range(2)"))
    k3, applied3, differs3 = harness.apply_edits(text, edits, harness.KERAS3)
    tfk, applied_tfk, differs_tfk = harness.apply_edits(text, edits, harness.TF_KERAS)
    assert differs3 == differs_tfk == []
    assert k3 == "a = opt.variables\nfor i in range(2):\n    pass\n"
    assert tfk == "a = opt.variables()\nfor i in range(2):\n    pass\n"
    assert [e.why for e in applied3] == ["k3 only", "shorter"]
    assert [e.why for e in applied_tfk] == ["shorter"]


def test_apply_edits_reports_missing_text_and_goes_on():
    edits = (harness.Edit("steps", "shorter", "range(1000)", "range(2)"),
             harness.Edit("data", "smaller", ("n = 50", "n = 40"), "n = 4"),
             harness.Edit("example-fix", "an older form", "legacy", "new", optional=True))
    text, applied, differs = harness.apply_edits("for i in range(10):\nn = 40\n", edits,
                                                 harness.KERAS3)
    assert text == "for i in range(10):\nn = 4\n"         # the second alternative applied
    assert [e.why for e in applied] == ["smaller"]
    assert len(differs) == 1 and "range(1000)" in differs[0] and "shorter" in differs[0]


def test_data_service_driver_runs_once_per_dispatcher_side():
    name = "tensorflow2_mnist_data_service.py"
    assert harness.runs([name], [harness.KERAS3]) == [(name, harness.KERAS3, "compute"),
                                                       (name, harness.KERAS3, "training")]
    # The train_fn files are run by the driver, not on their own.
    assert set(harness.RUN_BY) == set(harness.EXAMPLES[name].companions)


def test_data_service_driver_form_is_told_from_its_arguments():
    released = 'parser.add_argument("configfile", type=str)\n'
    earlier = 'parser.add_argument("--compute-service-config-file", required=True)\n'
    assert not harness.driver_launches_ranks(released)
    assert harness.driver_launches_ranks(earlier)
    assert set(harness.DRIVER_FORMS) == {False, True}


@needs_data
@single_process
def test_a_file_that_differs_is_reported_and_the_next_runs(tmp_path, capsys):
    """One example's substitution does not apply, another is missing: both are reported in the
    matrix and the run goes on to the next example (exit status 1)."""
    (tmp_path / "fake_example.py").write_text(FAKE_EXAMPLE)
    known = dict(harness.EXAMPLES)
    try:
        harness.EXAMPLES.clear()
        harness.EXAMPLES["gone.py"] = harness.Example(kerases=(harness.KERAS3,))
        harness.EXAMPLES["fake_example.py"] = harness.Example(kerases=(harness.KERAS3,), edits=(
            harness.Edit("steps", "a form this file does not have", "LOOP = 5", "LOOP = 2"),))
        code = harness.main(["--examples", str(tmp_path), "--timeout", "120"])
    finally:
        harness.EXAMPLES.clear()
        harness.EXAMPLES.update(known)
    out = capsys.readouterr().out
    assert code == 1, out
    assert "| `gone.py` | keras3 | missing |" in out, out
    assert "| `fake_example.py` | keras3 | pass | none; DIFFERS: fake_example.py: text not " \
        "found" in out, out
    assert "LOOP=1000" not in out       # the output of a pass is printed only with --verbose


def test_every_listed_edit_names_a_known_keras():
    for name, spec in harness.EXAMPLES.items():
        assert spec.skip or name.endswith(".py")
        for edit in spec.edits:
            assert edit.kind in ("example-fix", "steps", "data"), (name, edit)
            assert set(edit.on) <= set(harness.KERASES), (name, edit)
    assert not set(harness.DEAD) & set(harness.EXAMPLES)


@needs_data
def test_redirect_serves_fashion_mnist_and_blocks_downloads(monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", urllib.request.urlopen)
    monkeypatch.setattr(urllib.request, "urlretrieve", urllib.request.urlretrieve)
    fake = types.ModuleType("hvdc_fake_mnist")
    fake.load_data = lambda path="mnist.npz": pytest.fail("the real load_data was called")
    monkeypatch.setitem(sys.modules, "hvdc_fake_mnist", fake)
    monkeypatch.setenv("HVDC_EXAMPLES_MNIST_LIMIT", "100")
    assert harness.install_redirects(["hvdc_fake_mnist"]) == ["hvdc_fake_mnist"]
    (x, y), (xt, yt) = fake.load_data(path="mnist-0.npz")
    expected_x = fashion.read_idx(os.path.join(FASHION, "train-images-idx3-ubyte.gz"))[:100]
    expected_yt = fashion.read_idx(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz"))
    assert x.dtype == np.uint8 and x.shape == (100, 28, 28) and y.shape == (100,)
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(yt, expected_yt)
    assert xt.shape == (len(expected_yt), 28, 28)
    with pytest.raises(RuntimeError, match="download blocked"):
        urllib.request.urlretrieve("https://example.invalid/mnist.npz", "/tmp/x")


@pytest.mark.skipif(not os.path.isdir(harness.TEXT_DIR), reason=f"no {harness.TEXT_DIR}")
def test_text8_stand_in(monkeypatch, tmp_path):
    monkeypatch.setattr(urllib.request, "urlopen", urllib.request.urlopen)
    monkeypatch.setattr(urllib.request, "urlretrieve", urllib.request.urlretrieve)
    harness.install_redirects(["hvdc_no_such_module"])
    target = str(tmp_path / "text8-0.zip")
    assert urllib.request.urlretrieve(harness.TEXT8_URL, target)[0] == target
    assert os.path.getsize(target) == harness.TEXT8_BYTES
    with zipfile.ZipFile(target) as z:
        words = z.read(z.namelist()[0]).decode().split()
    assert len(words) > 1000 and all(w.isalpha() and w.islower() for w in words)
    first_file = os.path.join(harness.TEXT_DIR, sorted(os.listdir(harness.TEXT_DIR))[0])
    if os.path.isfile(first_file) and not os.path.islink(first_file):
        with open(first_file, errors="replace") as f:
            assert words[:20] == re.findall(r"[a-z]+", f.read().lower())[:20]


@needs_data
@single_process
def test_fake_example_at_np2_through_alias(tmp_path):
    (tmp_path / "fake_example.py").write_text(FAKE_EXAMPLE)
    spec = harness.Example(edits=(
        harness.Edit("steps", "shorter", "LOOP = 1000", "LOOP = 2"),
        harness.Edit("example-fix", "tf_keras only", "hvd.init()", "hvd.init(); 1 / 0",
                     (harness.TF_KERAS,))))
    result = harness.run_one(str(tmp_path), "fake_example.py", harness.KERAS3, sys.executable,
                             2, 120, spec=spec)
    assert result.status == "pass", result.detail[-6000:]
    assert result.edits == ("steps: shorter",)
    limit = 4096
    x = fashion.read_idx(os.path.join(FASHION, "train-images-idx3-ubyte.gz"))[:limit]
    n_test = len(fashion.read_idx(os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz")))
    expected_sum = 2 * int(x[:, 14, :].sum(dtype=np.int64)) + 1     # ranks 0 and 1 added
    line = (f"size 2: train ({limit}, 28, 28) uint8 test ({n_test}, 28, 28) "
            f"sum {expected_sum} LOOP=2")
    assert line in result.detail, result.detail[-6000:]
    assert "mnist.load_data served from Fashion-MNIST" in result.detail


@pytest.mark.skipif(not os.environ.get("HVDC_HOROVOD_EXAMPLES"),
                    reason="HVDC_HOROVOD_EXAMPLES is not set: Horovod's example files are not "
                           "part of this repository (see docs/horovod_examples.md)")
@single_process
def test_horovod_examples_matrix():
    results = []
    names = [n for n in harness.EXAMPLES if n not in harness.RUN_BY]
    for name, keras, side in harness.runs(names, []):
        results.append(harness.run_one(os.environ["HVDC_HOROVOD_EXAMPLES"], name, keras,
                                       sys.executable, 2, 900, side=side))
    failed = [r for r in results if r.status not in ("pass", "skip") or r.differs]
    assert not failed, harness.format_matrix(results) + "\n" + "\n".join(
        r.detail[-3000:] for r in failed)
