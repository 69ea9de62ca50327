# SPDX-License-Identifier: Apache-2.0
"""The `kdispatch` command of a pip-installed package: runs the CLI binary
shipped inside the package (<package>/bin/kdispatch, next to its
libkdispatch by rpath) with the same arguments, stdin and exit code.

A module of its own, outside the `kdispatch` package: the command finds the
package without importing it, so the package's import-time work (loading
the library, the KDISPATCH_* warnings) happens once, in the CLI, not twice."""
import importlib.util
import os
import sys


def main():
    spec = importlib.util.find_spec("kdispatch")  # locates the package; its __init__ does not run
    pkg = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
    cli = os.path.join(pkg, "bin", "kdispatch") if pkg else None
    if not cli or not os.access(cli, os.X_OK):
        sys.stderr.write(f"kdispatch: this installation ships no command-line tool ({cli or 'no kdispatch package'}); "
                         "pip builds it with -DKDISPATCH_BUILD_CLI=ON\n")
        return 127
    os.execv(cli, [cli] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
