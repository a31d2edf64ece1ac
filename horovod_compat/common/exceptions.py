"""Exception classes that Horovod users catch."""


class HorovodInternalError(RuntimeError):
    """A collective failed because a rank left or failed; elastic training recovers from it."""


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed during elastic training.

    ``skip_sync`` is True when hosts were only removed: the survivors hold the same state, so
    it need not be re-synchronised.
    """

    def __init__(self, skip_sync: bool) -> None:
        super().__init__()
        self.skip_sync = skip_sync


def get_version_mismatch_message(name: str, version: str, installed_version: str) -> str:
    """The message explaining that ``name`` changed since horovod_compat was built."""
    return (
        f"Framework {name} installed with version {installed_version} but found version "
        f"{version}.\n             This can result in unexpected behavior including runtime "
        f"errors.\n             Reinstall horovod_compat against {name} {version} "
        f"(scripts/install_python.sh, or pip install --no-build-isolation --force-reinstall "
        f"--no-deps .) to resolve this."
    )


class HorovodVersionMismatchError(ImportError):
    """The installed framework is not the version horovod_compat was compiled against."""

    def __init__(self, name: str, version: str, installed_version: str) -> None:
        super().__init__(get_version_mismatch_message(name, version, installed_version))
        self.name = name
        self.version = version
        self.installed_version = installed_version
