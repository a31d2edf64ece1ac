"""setup.py's search for the TensorFlow to compile against (issue 14, item 6: `pip install .`).

pip's default build isolation runs setup.py with the target environment's own interpreter, but
with PYTHONPATH naming a sitecustomize.py that removes the interpreter's site-packages from
sys.path, and PYTHONNOUSERSITE=1. These tests build that situation for real (an interpreter whose
site-packages are hidden the same way) and check what setup.py decides, without running a build:
a full `pip install .` compiles the C++ core and the op library (many minutes), so it is not run
here; docs/compat.md gives the commands that check it by hand.
"""

import importlib.util
import json
import os
import subprocess
import sys
import venv

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Process-local work only (subprocesses of this interpreter); once is enough, not once per rank.
pytestmark = pytest.mark.skipif("OMPI_COMM_WORLD_SIZE" in os.environ,
                                reason="single-process checks of setup.py's helpers")

# What pip's "virtual" build isolation puts in its sitecustomize.py, in our words: collect the
# interpreter's site-packages folders (and what their .pth files add), then drop them all.
_HIDING_SITECUSTOMIZE = """\
import os, site, sys
saved = sys.path[:]
sys.path[:] = []
for folder in site.getsitepackages():
    site.addsitedir(folder, known_paths=set())
hidden = {os.path.normcase(p) for p in sys.path}
sys.path[:] = [p for p in saved if os.path.normcase(p) not in hidden]
"""


@pytest.fixture(scope="module")
def setup_py():
    spec = importlib.util.spec_from_file_location("hvdc_setup_py", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # __name__ is not "__main__": setup() does not run
    return module


@pytest.fixture
def isolated_env(tmp_path):
    """os.environ as pip's default build isolation changes it."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "sitecustomize.py").write_text(_HIDING_SITECUSTOMIZE)
    env = dict(os.environ)
    env.update({"PYTHONPATH": str(site_dir), "PYTHONNOUSERSITE": "1",
                "HVDC_TEST_MARKER": "kept"})
    return env


def _paths(python, env):
    """sys.path and site.getsitepackages() of `python` under `env` (what setup.py sees there)."""
    out = subprocess.run(
        [python, "-c", "import json, site, sys; "
                       "print(json.dumps([sys.path, site.getsitepackages()]))"],
        env=env, stdout=subprocess.PIPE, universal_newlines=True, timeout=120, check=True)
    return json.loads(out.stdout)


def _imports_tensorflow(python, env):
    return subprocess.run([python, "-c", "import tensorflow"], env=env, timeout=300,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def test_isolated_build_uses_the_environments_tensorflow(setup_py, isolated_env):
    # The situation pip creates: this interpreter cannot import its own TensorFlow.
    assert not _imports_tensorflow(sys.executable, isolated_env)
    sys_path, site_packages = _paths(sys.executable, isolated_env)
    assert setup_py.site_packages_hidden(sys_path, site_packages)

    found = setup_py.find_target_tensorflow(sys.executable, isolated_env, sys_path, site_packages)
    assert found.unisolated
    assert found.version == tf.__version__
    assert os.path.samefile(found.location, os.path.dirname(tf.__file__))
    for name in setup_py.ISOLATION_VARIABLES:
        assert name not in found.env
    assert found.env["HVDC_TEST_MARKER"] == "kept"  # nothing else changes


def test_unisolated_build_keeps_the_environment(setup_py, tmp_path):
    # --no-build-isolation: the environment is passed on untouched, a user's PYTHONPATH included.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path),
                                                      os.environ.get("PYTHONPATH")]))
    sys_path, site_packages = _paths(sys.executable, env)
    assert not setup_py.site_packages_hidden(sys_path, site_packages)
    found = setup_py.find_target_tensorflow(sys.executable, env, sys_path, site_packages)
    assert not found.unisolated
    assert found.env == env
    assert found.version == tf.__version__


@pytest.fixture(scope="module")
def python_without_tensorflow(tmp_path_factory):
    folder = tmp_path_factory.mktemp("venv_without_tf")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(str(folder))
    return str(folder / "bin" / "python")


@pytest.mark.parametrize("isolated", [False, True])
def test_no_tensorflow_stops_with_the_command_that_works(setup_py, isolated_env, isolated,
                                                         python_without_tensorflow):
    env = isolated_env if isolated else dict(os.environ)
    sys_path, site_packages = _paths(python_without_tensorflow, env)
    assert setup_py.site_packages_hidden(sys_path, site_packages) == isolated
    with pytest.raises(SystemExit) as failure:
        setup_py.find_target_tensorflow(python_without_tensorflow, env, sys_path, site_packages)
    message = str(failure.value.code)
    assert f"{python_without_tensorflow} " in message
    assert "cannot import tensorflow" in message
    assert "No module named 'tensorflow'" in message  # the import's own error
    assert "pip install --no-build-isolation ." in message
    assert "pip install --no-build-isolation -e ." in message


def test_site_packages_hidden_rules(setup_py, tmp_path):
    present = tmp_path / "site-packages"
    present.mkdir()
    missing = str(tmp_path / "no-such-folder")
    # On sys.path under another spelling of the same folder: not hidden.
    assert not setup_py.site_packages_hidden([str(present / ".." / "site-packages")],
                                             [str(present)])
    # Off sys.path: hidden; folders that do not exist are not evidence either way.
    assert setup_py.site_packages_hidden(["", str(tmp_path)], [str(present), missing])
    assert not setup_py.site_packages_hidden(["", str(tmp_path)], [missing])
    assert not setup_py.site_packages_hidden([], [])
