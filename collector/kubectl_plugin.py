"""`kubectl-taugrid`: the CLI as a kubectl plugin (`kubectl taugrid explain RUN -n NS --context CTX -o json`).

kubectl runs an executable named `kubectl-taugrid` found on PATH with the arguments after
`kubectl taugrid`; the package installs one. The commands and flags are the CLI's own, which
follow kubectl's conventions (`-n/--namespace`, `--context`, `--kubeconfig`, `-o json|yaml`);
KUBECONFIG passes through the environment as kubectl's does.
"""

from __future__ import annotations

import sys


def main() -> None:
    from collector.cli import main as cli

    cli(args=sys.argv[1:], prog_name="kubectl taugrid")


if __name__ == "__main__":
    main()
