# SPDX-License-Identifier: Apache-2.0
"""kdispatch.Error and the status codes (the numbers of dispatch::StatusCode
and of the C ABI's KDISPATCH_* codes)."""

import enum


class StatusCode(enum.IntEnum):
    ok = 0
    invalid_argument = 1
    unsupported_problem = 2
    unsupported_device = 3
    no_variant = 4
    config_error = 5
    backend_error = 6
    out_of_memory = 7
    not_found = 8
    internal = 9
    io_error = 10
    failed_precondition = 11


class Error(Exception):
    """A kdispatch call failed.

    Attributes:
        code: the status code (a StatusCode; the C ABI's number).
        name: its stable name ("invalid_argument", "not_found", ...).
        message: what failed, naming the argument, file or variable.

    ``str(e)`` is ``"<name>: <message>"``.
    """

    def __init__(self, code, message=""):
        try:
            code = StatusCode(int(code))
            name = code.name
        except ValueError:
            code = int(code)
            name = "unknown"
        self.code = code
        self.name = name
        self.message = str(message)
        super().__init__(f"{name}: {self.message}" if self.message else name)

    def __reduce__(self):
        return (Error, (int(self.code), self.message))
