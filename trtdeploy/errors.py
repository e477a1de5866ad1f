"""One exception hierarchy for the whole tool; the CLI maps it to messages and exit codes in one place."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes of the ``trtdeploy`` command."""

    #: Everything worked.
    OK = 0
    #: An unexpected internal error (a bug): the traceback is shown.
    INTERNAL = 1
    #: The command line or an input file is wrong.
    USAGE = 2
    #: A model, plugin, deployment or file that was named does not exist.
    NOT_FOUND = 3
    #: A build step failed.
    BUILD_FAILED = 4
    #: The server could not be started, or is not reachable.
    SERVER = 5
    #: A benchmark ran, but more requests failed than ``--max-error-rate`` allows.
    PERF_ERRORS = 6
    #: The network or the Hugging Face Hub is not reachable.
    NETWORK = 7
    #: Interrupted by the user (Ctrl-C).
    INTERRUPTED = 130


class TrtDeployError(Exception):
    """Base of every error that trtdeploy reports to the user as one line (plus an optional hint)."""

    exit_code: ExitCode = ExitCode.INTERNAL
    #: The word the line starts with.
    label = "Error"

    def __init__(self, message: str, *, hint: str | None = None, details: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: What to do about it, shown after the message.
        self.hint = hint
        #: Extra text shown below (a log tail, say).
        self.details = details


class UsageError(TrtDeployError):
    """Bad command-line value or bad input file."""

    exit_code = ExitCode.USAGE


class NotFoundError(TrtDeployError):
    """A named model, plugin, deployment, file or dataset column does not exist."""

    exit_code = ExitCode.NOT_FOUND


class BuildError(TrtDeployError):
    """A build step failed, or a deployment folder is not a complete build."""

    exit_code = ExitCode.BUILD_FAILED


class ServerError(TrtDeployError):
    """tritonserver could not be found, started or reached."""

    exit_code = ExitCode.SERVER


class PerfError(TrtDeployError):
    """The benchmark ran but failed its error budget."""

    exit_code = ExitCode.PERF_ERRORS


class NetworkError(TrtDeployError):
    """The Hub or another remote is unreachable."""

    exit_code = ExitCode.NETWORK


class TrtDeployWarning(UserWarning):
    """A problem that does not stop the command; the CLI shows it as one ``Warning:`` line."""


class Interrupted(TrtDeployError):
    """The user interrupted the command (Ctrl-C); what it had done is kept, and the message says where."""

    exit_code = ExitCode.INTERRUPTED
    label = "Interrupted"
