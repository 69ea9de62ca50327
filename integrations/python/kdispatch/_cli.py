# SPDX-License-Identifier: Apache-2.0
"""The `kdispatch` command of a pip-installed package: runs the CLI binary
shipped inside the package (<package>/bin/kdispatch, next to its
libkdispatch by rpath), with the same arguments and exit code."""
import os
import sys


def main():
    try:
        from . import _build_config
        cli = _build_config.CLI
    except (ImportError, AttributeError):
        cli = None
    if not cli or not os.path.exists(cli):
        sys.stderr.write(f"kdispatch: this package ships no command-line tool ({cli or 'not built'}); "
                         "build it with -DKDISPATCH_BUILD_CLI=ON\n")
        return 127
    os.execv(cli, [cli] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
