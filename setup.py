"""Builds horovod_compat: CMake compiles libhvdc_core.so, the pybind11 module
horovod_compat._core and the TensorFlow op library horovod_compat/tensorflow/mpi_lib<EXT_SUFFIX>
against the TensorFlow of the environment being installed into:

    pip install .        (or pip install -e .; scripts/install_python.sh uses --no-build-isolation)

pip's default build isolation runs this file with the target environment's interpreter but hides
that environment's site-packages (PYTHONPATH names a sitecustomize.py that drops them from
sys.path, PYTHONNOUSERSITE=1). When TensorFlow is hidden that way, CMake runs with those two
variables removed, so the op library is compiled against the TensorFlow it will run with. When no
TensorFlow can be found (none installed, or a build in a fresh environment: python -m build, uv,
pip --use-feature=venv-isolation), the build stops before compiling with the command that works.

Environment: HVDC_BUILD_DIR (CMake build folder, default build/py-<python>-tf<version>),
HVDC_BUILD_TYPE (default Release), HVDC_CMAKE_ARGS (extra CMake arguments),
CMAKE_BUILD_PARALLEL_LEVEL (compile jobs, default: the number of CPUs).
"""

import os
import re
import shlex
import shutil
import site
import subprocess
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def _read_version() -> str:
    with open(os.path.join(ROOT, "horovod_compat", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


# Prints TensorFlow's version and folder on the last line (TF may log before it).
_TF_QUERY = ("import os; os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3'); "
             "import tensorflow as tf; print(); print(tf.__version__ + '|' + tf.__file__)")

# What pip's default ("virtual") build isolation sets to hide the target environment's packages.
ISOLATION_VARIABLES = ("PYTHONPATH", "PYTHONNOUSERSITE")


class TargetTensorFlow(NamedTuple):
    """The TensorFlow the op library is compiled against and the environment CMake runs in."""
    env: Dict[str, str]
    version: str
    location: str
    unisolated: bool  # True when the isolation variables had to be removed to see it


def probe_tensorflow(python: str, env: Dict[str, str]) -> Tuple[Optional[Tuple[str, str]], str]:
    """((version, folder), "") of the TensorFlow that `python` imports under `env`, or
    (None, the last line of the import's error output)."""
    try:
        proc = subprocess.run([python, "-c", _TF_QUERY], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or "|" not in lines[-1]:
        errors = proc.stderr.strip().splitlines()
        return None, errors[-1] if errors else f"exit code {proc.returncode}"
    version, _, init_file = lines[-1].partition("|")
    return (version, os.path.dirname(init_file)), ""


def site_packages_hidden(sys_path: Sequence[str], site_packages: Sequence[str]) -> bool:
    """True when none of the interpreter's own site-packages folders is on sys.path: what pip's
    default build isolation does (its sitecustomize.py removes them)."""
    def norm(path: str) -> str:
        return os.path.normcase(os.path.abspath(path))

    existing = [norm(p) for p in site_packages if os.path.isdir(p)]
    on_path = {norm(p) for p in sys_path if p}
    return bool(existing) and not any(p in on_path for p in existing)


def missing_tensorflow_message(python: str, prefix: str, error: str) -> str:
    return f"""
horovod_compat: cannot build: {python} (environment {prefix}) cannot import tensorflow
({error}).
The TensorFlow op library is compiled against the TensorFlow it will run with, so TensorFlow must
be installed in the environment horovod_compat is installed into, before the build:

    pip install "tensorflow-cpu==2.21.*"        (or tensorflow)
    pip install --no-build-isolation .          (editable: pip install --no-build-isolation -e .)

If TensorFlow is installed there, this build ran in a fresh environment that cannot see it
(python -m build, uv, pip --use-feature=venv-isolation): build without isolation
(pip install --no-build-isolation ., uv pip install --no-build-isolation .,
python -m build --no-isolation).
"""


def find_target_tensorflow(python: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                           sys_path: Optional[List[str]] = None,
                           site_packages: Optional[List[str]] = None) -> TargetTensorFlow:
    """Finds the TensorFlow of the environment being installed into. `python` imports it under
    `env` as is (a --no-build-isolation build, nothing changes), or, inside pip's default build
    isolation (the interpreter's site-packages are not on sys.path), once the isolation variables
    are removed: pip runs the build with the target environment's own interpreter, so that is the
    TensorFlow the installed package will load. Raises SystemExit with the command that works
    when there is none."""
    python = python or sys.executable
    env = dict(os.environ if env is None else env)
    sys_path = list(sys.path if sys_path is None else sys_path)
    if site_packages is None:
        site_packages = site.getsitepackages()
    found, error = probe_tensorflow(python, env)
    if found:
        return TargetTensorFlow(env, found[0], found[1], False)
    if (site_packages_hidden(sys_path, site_packages)
            and any(name in env for name in ISOLATION_VARIABLES)):
        clean = {k: v for k, v in env.items() if k not in ISOLATION_VARIABLES}
        found, error = probe_tensorflow(python, clean)
        if found:
            return TargetTensorFlow(clean, found[0], found[1], True)
    prefix = (sys.prefix if python == sys.executable
              else os.path.dirname(os.path.dirname(python)))
    raise SystemExit(missing_tensorflow_message(python, prefix, error))


class CMakeExtension(Extension):
    """A library built by the CMake project rather than by setuptools."""

    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures and builds the CMake targets, then copies the libraries into the package."""

    def run(self) -> None:
        tf = find_target_tensorflow()
        if tf.unisolated:
            print(f"horovod_compat: pip's build isolation hides the environment's packages; "
                  f"building against its TensorFlow {tf.version} ({tf.location}) with "
                  f"{' and '.join(ISOLATION_VARIABLES)} removed", flush=True)
        build_dir = os.environ.get("HVDC_BUILD_DIR") or os.path.join(
            ROOT, "build", f"py-cp{sys.version_info[0]}{sys.version_info[1]}-tf{tf.version}")
        os.makedirs(build_dir, exist_ok=True)
        configure = [
            "cmake", "-S", ROOT, "-B", build_dir,
            f"-DCMAKE_BUILD_TYPE={os.environ.get('HVDC_BUILD_TYPE', 'Release')}",
            "-DHVDC_BUILD_TESTS=OFF", "-DHVDC_BUILD_BENCH=OFF", "-DHVDC_WITH_TENSORFLOW=ON",
            f"-DPython_EXECUTABLE={sys.executable}",
        ]
        if shutil.which("ninja") and not os.path.exists(os.path.join(build_dir, "Makefile")):
            configure += ["-G", "Ninja"]
        configure += shlex.split(os.environ.get("HVDC_CMAKE_ARGS", ""))
        subprocess.check_call(configure, env=tf.env)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "hvdc_core",
                               "hvdc_py_core", "hvdc_tf_ops", "--parallel", jobs], env=tf.env)
        with open(os.path.join(build_dir, "python_package", "libraries.txt")) as f:
            core_lib, py_module, tf_ops = [line.strip() for line in f if line.strip()]
        metadata = os.path.join(build_dir, "python_package", "horovod_compat", "metadata.json")

        in_source = self.inplace or getattr(self, "editable_mode", False)
        package_dir = (os.path.join(ROOT, "horovod_compat") if in_source
                       else os.path.join(self.build_lib, "horovod_compat"))
        self._outputs = []
        for src, rel in ((core_lib, os.path.basename(core_lib)),
                         (py_module, os.path.basename(py_module)),
                         (tf_ops, os.path.join("tensorflow", os.path.basename(tf_ops))),
                         (metadata, "metadata.json")):
            dst = os.path.join(package_dir, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.exists(dst):
                os.remove(dst)  # never write into a library a running process has mapped
            shutil.copy2(src, dst)
            self._outputs.append(dst)

    def get_outputs(self) -> list:
        return list(getattr(self, "_outputs", []))


if __name__ == "__main__":  # pip and setuptools run this file as __main__; tests import it
    setup(
        name="horovod_compat",
        version=_read_version(),
        description="A Horovod-compatible distributed-training runtime",
        packages=find_packages(include=["horovod_compat", "horovod_compat.*"]),
        ext_modules=[CMakeExtension("horovod_compat._core"),
                     CMakeExtension("horovod_compat.tensorflow.mpi_lib")],
        cmdclass={"build_ext": CMakeBuild},
        python_requires=">=3.8",
        install_requires=["numpy", "cloudpickle", "psutil"],
        entry_points={"console_scripts": ["horovodrun = horovod_compat.runner.launch:main"]},
        zip_safe=False,
    )
