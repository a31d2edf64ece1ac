"""Builds horovod_compat: CMake compiles libhvdc_core.so, the pybind11 module
horovod_compat._core and the TensorFlow op library horovod_compat/tensorflow/mpi_lib<EXT_SUFFIX>
against the TensorFlow of the running interpreter, so install with --no-build-isolation:

    pip install --no-build-isolation -e .      (or scripts/install_python.sh)

Environment: HVDC_BUILD_DIR (CMake build folder, default build/py-<python>-tf<version>),
HVDC_BUILD_TYPE (default Release), HVDC_CMAKE_ARGS (extra CMake arguments).
"""

import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def _read_version() -> str:
    with open(os.path.join(ROOT, "horovod_compat", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def _tensorflow_version() -> str:
    for dist in ("tensorflow-cpu", "tensorflow", "tf-nightly-cpu", "tf-nightly"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


class CMakeExtension(Extension):
    """A library built by the CMake project rather than by setuptools."""

    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures and builds the CMake targets, then copies the libraries into the package."""

    def run(self) -> None:
        build_dir = os.environ.get("HVDC_BUILD_DIR") or os.path.join(
            ROOT, "build", f"py-cp{sys.version_info[0]}{sys.version_info[1]}"
                           f"-tf{_tensorflow_version()}")
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
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "hvdc_core",
                               "hvdc_py_core", "hvdc_tf_ops", "--parallel",
                               str(os.cpu_count() or 2)])
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
