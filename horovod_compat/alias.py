"""Run unmodified Horovod scripts on horovod_compat (docs/keras.md, "The horovod import alias").

``python -m horovod_compat.alias script.py [args...]`` (or ``-m module [args...]``) installs an
import hook, then runs the script as ``__main__``. The hook maps every ``horovod.<x>`` module name
onto the module object ``horovod_compat.<x>`` (imported once, never a second copy), so global
state, registered gradients and ``__module__`` paths stay those of horovod_compat. ``horovod``
itself is a small package module carrying Horovod's version. Nothing is installed unless asked.
"""

import importlib
import importlib.abc
import importlib.machinery
import os
import runpy
import sys
import traceback
import types
from typing import Any, List, Optional, Sequence

ALIAS = "horovod"
TARGET = "horovod_compat"
HOROVOD_VERSION = "0.28.1"


class _ExistingModuleLoader(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType) -> None:
        self._module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname == ALIAS:
            return importlib.machinery.ModuleSpec(fullname, _ExistingModuleLoader(_root_module()),
                                                  is_package=True)
        if not fullname.startswith(ALIAS + "."):
            return None
        real_name = TARGET + fullname[len(ALIAS):]
        try:
            module = importlib.import_module(real_name)
        except ModuleNotFoundError as e:
            if e.name is not None and (e.name == real_name or real_name.startswith(e.name + ".")):
                return None
            raise
        return importlib.machinery.ModuleSpec(fullname, _ExistingModuleLoader(module),
                                              is_package=hasattr(module, "__path__"))


_root: Optional[types.ModuleType] = None


def _root_module() -> types.ModuleType:
    global _root
    if _root is None:
        _root = types.ModuleType(ALIAS, "horovod_compat under the name 'horovod'.")
        _root.__version__ = HOROVOD_VERSION
        _root.run = importlib.import_module(TARGET).run  # horovod.run
        _root.__path__ = []  # a package: submodules come from the alias finder
    return _root


_finder: Optional[_AliasFinder] = None


def install() -> None:
    """Makes ``import horovod...`` resolve to horovod_compat modules (idempotent)."""
    global _finder
    if _finder is None:
        _finder = _AliasFinder()
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    global _finder
    if _finder is not None:
        sys.meta_path.remove(_finder)
        _finder = None
    for name in [n for n in sys.modules if n == ALIAS or n.startswith(ALIAS + ".")]:
        del sys.modules[name]


def _exit_status(error: SystemExit) -> int:
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    sys.stderr.write(f"{error.code}\n")
    return 1


def _fail_fast(code: int) -> None:
    """Ends a failing rank at once, skipping MPI_Finalize. Open MPI then takes the whole job down
    and reports this rank's code; a rank that finalized first would leave its peers waiting."""
    from horovod_compat.common.launch_env import launcher_rank
    rank = launcher_rank(os.environ)
    sys.stderr.write(f"horovod_compat: rank {rank} failed with exit code {code}\n")
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _run_failing_fast(run: Any) -> None:
    try:
        run()
    except SystemExit as error:
        code = _exit_status(error)
        if code == 0:
            raise
        _fail_fast(code)
    except BaseException:  # noqa: BLE001 - the script's own error, reported as Python would
        traceback.print_exc()
        _fail_fast(1)


# What a launcher runs in place of ``python``: ``python -c BOOTSTRAP script.py args...``. With
# ``-m horovod_compat.alias`` Python would put the working directory first on sys.path before
# horovod_compat is imported, so a folder named horovod_compat (or horovod) there would shadow
# the installed package; ``-c`` puts '' there instead, which the bootstrap drops before importing
# anything, and main() then gives the command the sys.path ``python script.py`` would have had.
BOOTSTRAP = ("import sys; sys.path[:1] == [''] and sys.path.pop(0); "
             "from horovod_compat.alias import main; main(path0_set=False)")


def command_through_alias(python: str, args: Sequence[str]) -> List[str]:
    """The command that runs ``python args...`` (a script or ``-m module``) under the alias."""
    return [python, "-c", BOOTSTRAP, *args]


def _set_path0(entry: str, replace: bool) -> None:
    if replace and sys.path:
        sys.path[0] = entry
    else:
        sys.path.insert(0, entry)


def _runnable_module(name: str) -> str:
    """The module ``-m name`` runs: runpy executes a module's code, which the alias's loader does
    not carry (it hands out the imported module), so ``horovod.<x>`` runs from horovod_compat's
    file, as ``python -m horovod.<x>`` runs Horovod's."""
    if name == ALIAS or name.startswith(ALIAS + "."):
        return TARGET + name[len(ALIAS):]
    return name


def main(argv: Optional[Sequence[str]] = None, path0_set: bool = True) -> None:
    """Runs ``script.py args`` or ``-m module args`` as ``python`` would, under the alias.

    path0_set: sys.path[0] is the entry Python put there for ``-m horovod_compat.alias`` (the
    working directory), to be replaced; False when a launcher's BOOTSTRAP removed it already."""
    args: List[str] = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write("usage: python -m horovod_compat.alias (script.py | -m module) "
                         "[args...]\n")
        sys.exit(2)
    install()
    if args[0] == "-m":
        if len(args) < 2:
            sys.stderr.write("horovod_compat.alias: -m needs a module name\n")
            sys.exit(2)
        sys.argv = [args[1]] + args[2:]
        _set_path0(os.getcwd(), path0_set)   # python -m puts the working directory first
        module = _runnable_module(args[1])
        _run_failing_fast(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    else:
        script = args[0]
        sys.argv = list(args)
        # python script.py puts the script's folder first (symbolic links resolved).
        _set_path0(os.path.dirname(os.path.realpath(script)), path0_set)
        _run_failing_fast(lambda: runpy.run_path(script, run_name="__main__"))


if __name__ == "__main__":
    main()
