"""The one error type the CLI catches at its boundary.

Every user-facing failure (a bad trace line, a bad profile key, a database that needs an
upgrade) is an `NbxError` whose message is one line naming where the problem is and, where
there is one, the next step to take. Anything else escaping to the CLI is a bug.
"""


class NbxError(Exception):
    """A user error: printed on one line, exit code 1."""


class ProfileError(NbxError):
    """A device profile file is malformed, or no profile matches the device."""


class TraceError(NbxError):
    """A trace file is malformed: the message names the file, line and column."""


class StoreError(NbxError):
    """The database cannot be opened, or its schema is not the one this code needs."""


class TableError(NbxError):
    """An exported certified table is broken, edited, or for another device."""


class DeviceError(NbxError):
    """No usable device: no GPU driver and the interpreter is not enabled."""


class KernelError(NbxError):
    """A kernel cannot serve the request it was given (shape, dtype, plugin)."""


class TorchFaster(KernelError):
    """Under serve(), a seat whose torch baseline is faster: torch runs the op
    (kernels/runtime/torch_rule.py)."""
