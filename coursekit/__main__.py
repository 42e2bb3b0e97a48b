"""The ``coursekit`` command: one entry point for the course's tools.

    coursekit preflight --engines 4        # check a cluster (coursekit.cluster.preflight)
    coursekit profiles slurm ...           # write an ipcluster profile (coursekit.cluster.profiles)
    coursekit release student OUT          # a student folder without solutions (coursekit.course.release)
    coursekit notebooks execute            # rebuild the stored notebooks (coursekit.course.notebooks)
    coursekit workspace update             # merge course updates into a student's copies (coursekit.course.workspace)

Each command is the ``main`` of its module; ``coursekit COMMAND --help`` lists its options.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "preflight": "check that a cluster is ready for the course",
    "profiles": "write an ipcluster profile for Slurm or MPI",
    "release": "write a student release, or grade submitted exercises",
    "notebooks": "run the notebook sources and store them with outputs; regenerate exercises",
    "workspace": "a student's working copy of the notebooks: create it, merge course updates into it",
}
MODULES = {  # the module whose main each command runs
    "preflight": "coursekit.cluster.preflight",
    "profiles": "coursekit.cluster.profiles",
    "release": "coursekit.course.release",
    "notebooks": "coursekit.course.notebooks",
    "workspace": "coursekit.course.workspace",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    return "usage: coursekit COMMAND [ARGS...]\n\ncommands:\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"coursekit: unknown command {command!r}; allowed: {', '.join(COMMANDS)}\n\n{usage()}",
              file=sys.stderr)
        return 2
    return importlib.import_module(MODULES[command]).main(rest)


if __name__ == "__main__":
    sys.exit(main())
