"""Helpers shared by the frontends: extension lookup, version checks, small utilities."""

import contextlib
import functools
import json
import os
import subprocess
import sys
import sysconfig
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from horovod_compat.common.exceptions import (HorovodVersionMismatchError,
                                              get_version_mismatch_message)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def get_ext_suffix() -> str:
    """The file-name suffix of native extensions for this interpreter."""
    return sysconfig.get_config_var("EXT_SUFFIX")


def get_extension_full_path(pkg_path: str, *args: str) -> str:
    """Path of the native library ``args`` (last element without suffix) next to ``pkg_path``."""
    assert len(args) >= 1
    dir_path = os.path.join(os.path.dirname(pkg_path), *args[:-1])
    return os.path.join(dir_path, args[-1] + get_ext_suffix())


def check_extension(ext_name: str, ext_env_var: str, pkg_path: str, *args: str) -> None:
    """Raises ImportError when the native library of ``ext_name`` was not built."""
    full_path = get_extension_full_path(pkg_path, *args)
    if not os.path.exists(full_path):
        raise ImportError(
            f"Extension {ext_name} has not been built: {full_path} is missing. If this is not "
            f"expected, reinstall horovod_compat with {ext_env_var}=1 (scripts/install_python.sh) "
            f"to see the build error.")


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether the native library for ``ext_base_name`` (e.g. 'tensorflow') was built."""
    path = get_extension_full_path(os.path.join(_PACKAGE_DIR, ext_base_name, "__init__.py"),
                                   "mpi_lib")
    available = os.path.exists(path)
    if verbose and not available:
        print(f"Extension {ext_base_name} is not available: {path} is missing.")
    return available


def _core_query(name: str) -> Any:
    from horovod_compat import _core
    return getattr(_core, name)()


def mpi_built(verbose: bool = False) -> bool:
    """Whether the runtime was compiled with MPI."""
    return bool(_core_query("mpi_built"))


def gloo_built(verbose: bool = False) -> bool:
    """Whether the runtime was compiled with the TCP transport (Horovod's Gloo)."""
    from horovod_compat import _core
    query = getattr(_core, "gloo_built", None)
    return bool(query()) if query is not None else False


def nccl_built(verbose: bool = False) -> int:
    """NCCL_VERSION_CODE when compiled with NCCL, else 0."""
    return int(_core_query("nccl_built"))


def ddl_built(verbose: bool = False) -> bool:
    """Whether the runtime was compiled with IBM DDL (never)."""
    return False


def ccl_built(verbose: bool = False) -> bool:
    """Whether the runtime was compiled with oneCCL (never)."""
    return False


def sycl_built(verbose: bool = False) -> bool:
    """Whether the runtime was compiled with SYCL for Intel GPUs (never)."""
    return False


_GPU_AVAILABLE: Dict[str, bool] = {}


def gpu_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether the framework ``ext_base_name`` sees a GPU, probed once in a child process."""
    if ext_base_name not in _GPU_AVAILABLE:
        code = (f"import horovod_compat.{ext_base_name} as m; "
                f"print(int(bool(m._check_has_gpu())))")
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 timeout=300, check=False)
            _GPU_AVAILABLE[ext_base_name] = out.stdout.strip().endswith("1")
        except (OSError, subprocess.SubprocessError):
            _GPU_AVAILABLE[ext_base_name] = False
        if verbose and not _GPU_AVAILABLE[ext_base_name]:
            print(f"No GPU is available to {ext_base_name}.")
    return _GPU_AVAILABLE[ext_base_name]


@contextlib.contextmanager
def env(**kwargs: Optional[str]) -> Iterator[None]:
    """Sets environment variables for the duration of the block (None values are ignored)."""
    saved = {}
    for key, value in kwargs.items():
        if value is None:
            continue
        saved[key] = os.environ.get(key)
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def get_average_backwards_compatibility_fun(reduce_ops: Any) -> Callable[[Any, Any], int]:
    """Builds handle_average_backwards_compatibility(op, average) for a frontend's constants."""
    def impl(op: Optional[int], average: Optional[bool]) -> int:
        if op is not None:
            if average is not None:
                raise ValueError("The op parameter supersedes average. Please provide only one "
                                 "of them.")
            return op
        if average is not None:
            warnings.warn("Parameter `average` has been replaced with `op` and will be removed "
                          "in v1.0", DeprecationWarning)
            return reduce_ops.Average if average else reduce_ops.Sum
        return reduce_ops.Average
    return impl


def num_rank_is_power_2(num_rank: int) -> bool:
    """True when ``num_rank`` is a power of two."""
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


def split_list(items: Sequence[Any], n: int) -> List[Sequence[Any]]:
    """``items`` cut into ``n`` contiguous chunks whose lengths differ by at most one."""
    d, r = divmod(len(items), n)
    return [items[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def is_iterable(x: Any) -> bool:
    """Whether ``iter(x)`` works."""
    try:
        iter(x)
    except TypeError:
        return False
    return True


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """``ver >= target``; ``target`` must be 'major.minor.patch'."""
    from packaging import version
    if len([n for n in target.split(".") if n.isdigit()]) != 3:
        raise ValueError("We only accepts target version values in the form of: "
                         f"major.minor.patch. Received: {target}")
    return version.parse(ver) >= version.parse(target)


def _installed_versions() -> Dict[str, str]:
    path = os.path.join(_PACKAGE_DIR, "metadata.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _major_minor(ver: str) -> List[str]:
    return ver.split("+")[0].split(".")[:2]


def check_installed_version(name: str, version: str,
                            exception: Optional[BaseException] = None) -> None:
    """Compares ``version`` with the one horovod_compat was built against.

    With ``exception`` (the library failed to load) any difference raises
    HorovodVersionMismatchError, otherwise ``exception`` is re-raised. Without it, a different
    major.minor raises HorovodVersionMismatchError (the C++ ABI of the op library is tied to it)
    and a different patch level only warns.
    """
    installed = _installed_versions().get(name)
    if installed is None or installed == version:
        if exception is not None:
            raise exception
        return
    if exception is not None:
        raise HorovodVersionMismatchError(name, version, installed) from exception
    if _major_minor(installed) != _major_minor(version):
        raise HorovodVersionMismatchError(name, version, installed)
    warnings.warn(get_version_mismatch_message(name, version, installed))


def _cache(f: Callable) -> Callable:
    """Memoizes ``f`` on its positional and keyword arguments."""
    cache: Dict[Any, Any] = {}

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = (args, frozenset(kwargs.items()))
        if key in cache:
            return cache[key]
        retval = f(*args, **kwargs)
        cache[key] = retval
        return retval

    return wrapper
