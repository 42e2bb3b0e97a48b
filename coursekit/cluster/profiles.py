"""Render and check the instructors' ipcluster profiles (templates in ``profiles/``).

    coursekit profiles slurm --partition gpu --nodes 2 --gpus-per-node 4 \\
        --time 02:00:00 --ipython-dir /shared/ipython [--sinfo "$(sinfo -h -o '%P %G')"]
    coursekit profiles mpi --engines 8 [--ipython-dir DIR]

writes ``IPYTHONDIR/profile_NAME/`` (``ipcluster_config.py``, and ``engines.sbatch`` for
Slurm) and prints the commands that start the cluster and attach the notebooks to it.
Everything is checked before anything is written: the partition (against ``sinfo`` output
when given), the GPU count, the node count, the time limit, absolute shared paths; and the
rendered batch script is parsed back (:func:`check_sbatch`): known ``#SBATCH`` options,
tasks = nodes x GPUs per node, one GPU per task, ``CUDA_VISIBLE_DEVICES`` from the local
rank, ``IPYTHONDIR`` exported, ``srun`` launching the engines.
"""

from __future__ import annotations

import argparse
import numbers
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MAX_GPUS_PER_NODE", "ProfileError", "SlurmSpec", "check_sbatch", "parse_sinfo",
           "render_mpi", "render_slurm", "write_profile"]

TEMPLATES = Path(__file__).resolve().parents[2] / "profiles"
MAX_GPUS_PER_NODE = 16
"""Without sinfo output, more GPUs per node than this is taken for a typo (HGX: 8 or 16)."""

SBATCH_OPTIONS = frozenset("""account chdir constraint cpus-per-task error export exclusive
gpus gpus-per-node gpus-per-task gres gpu-bind job-name mail-type mail-user mem mem-per-cpu
mem-per-gpu nodes ntasks ntasks-per-node output partition qos reservation signal time
""".split())
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class ProfileError(ValueError):
    """A profile parameter or a rendered script is wrong; the message says how to fix it."""


def _template(name: str) -> str:
    path = TEMPLATES / name
    if not path.is_file():
        raise ProfileError(f"profile template {path} is missing: run from a coursekit checkout "
                           "(the templates live in its profiles/ folder)")
    return path.read_text()


def _fill(text: str, values: dict) -> str:
    for key, value in values.items():
        text = text.replace(f"@@{key}@@", str(value))
    left = re.findall(r"@@(\w+)@@", text)
    if left:
        raise ProfileError(f"template placeholders without a value: {sorted(set(left))}")
    return text


def parse_sinfo(text: str) -> dict[str, int]:
    """Partition -> GPUs per node from ``sinfo -h -o '%P %G'`` (0 for partitions without)."""
    out: dict[str, int] = {}
    for line in text.strip().splitlines():
        parts = line.split()
        if not parts:
            continue
        name = parts[0].rstrip("*")
        gres = " ".join(parts[1:])
        gpus = [int(n) for n in re.findall(r"gpu(?::[\w.-]+)?:(\d+)", gres)]
        out[name] = max(out.get(name, 0), *gpus, 0)
    if not out:
        raise ProfileError("the sinfo output lists no partitions; run `sinfo -h -o '%P %G'`")
    return out


def _positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ProfileError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _absolute(path, name: str) -> str:
    if not path or not Path(path).is_absolute():
        raise ProfileError(f"{name} must be an absolute path on a file system every node "
                           f"shares (e.g. /shared/$USER/ipython), got {path!r}")
    return str(path)


@dataclass(frozen=True)
class SlurmSpec:
    """What an instructor chooses: queue, size, time, where the profile lives."""

    partition: str
    nodes: int
    gpus_per_node: int
    time: str
    ipython_dir: str
    profile: str = "coursekit"
    venv: str = sys.prefix
    cpus_per_task: int = 4
    account: str = ""
    controller_ip: str = "*"
    partitions: dict | None = None  # from parse_sinfo: checks the queue and its GPUs

    def check(self) -> None:
        """Raise ProfileError naming every problem at once."""
        problems = []
        for check in (self._queue, self._sizes, self._gpus, self._time, self._paths):
            try:
                check()
            except ProfileError as exc:
                problems.append(str(exc))
        if problems:
            raise ProfileError("bad Slurm profile:\n  " + "\n  ".join(problems))

    def _queue(self):
        if not isinstance(self.partition, str) or not self.partition.strip():
            raise ProfileError("partition (queue) name is missing: pass --partition NAME; "
                               "`sinfo -s` lists the partitions")
        if not _NAME.match(self.partition):
            raise ProfileError(f"partition {self.partition!r} is not a valid Slurm name")
        if self.partitions is not None and self.partition not in self.partitions:
            raise ProfileError(f"partition {self.partition!r} does not exist on this cluster; "
                               f"available: {sorted(self.partitions)}")

    def _sizes(self):
        _positive(self.nodes, "nodes")
        _positive(self.cpus_per_task, "cpus_per_task")

    def _gpus(self):
        gpus = _positive(self.gpus_per_node, "gpus_per_node")
        limit, where = MAX_GPUS_PER_NODE, f"no node has more than {MAX_GPUS_PER_NODE}"
        if self.partitions is not None and self.partition in self.partitions:
            limit = self.partitions[self.partition]
            where = f"partition {self.partition!r} has {limit} GPUs per node (sinfo)"
        if gpus > limit:
            raise ProfileError(f"gpus_per_node={gpus} is impossible: {where}")

    def _time(self):
        if not isinstance(self.time, str) or not _TIME.match(self.time):
            raise ProfileError(f"time={self.time!r}: use a Slurm time limit such as 90, "
                               "02:00:00 or 1-00:00:00")

    def _paths(self):
        _absolute(self.ipython_dir, "ipython_dir")
        _absolute(self.venv, "venv")
        if not _NAME.match(self.profile):
            raise ProfileError(f"profile name {self.profile!r}: letters, digits, _ . - only")

    @property
    def engines(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def profile_dir(self) -> str:
        return str(Path(self.ipython_dir) / f"profile_{self.profile}")


def render_slurm(spec: SlurmSpec) -> dict[str, str]:
    """``{"ipcluster_config.py": ..., "engines.sbatch": ...}`` for ``spec`` (checked)."""
    spec.check()
    values = {"partition": spec.partition, "nodes": spec.nodes, "engines": spec.engines,
              "gpus_per_node": spec.gpus_per_node, "cpus_per_task": spec.cpus_per_task,
              "time": spec.time, "ipython_dir": spec.ipython_dir, "venv": spec.venv,
              "profile": spec.profile, "profile_dir": spec.profile_dir,
              "controller_ip": spec.controller_ip,
              "extra_sbatch": f"#SBATCH --account={spec.account}" if spec.account else ""}
    files = {"ipcluster_config.py": _fill(_template("slurm/ipcluster_config.py.in"), values),
             "engines.sbatch": _fill(_template("slurm/engines.sbatch.in"), values)}
    check_sbatch(files["engines.sbatch"], spec)
    return files


def render_mpi(engines: int, ipython_dir: str, *, profile: str = "coursekit-mpi",
               venv: str = sys.prefix, controller_ip: str = "127.0.0.1",
               mpi_args: tuple = ()) -> dict[str, str]:
    """``{"ipcluster_config.py": ...}`` for ``engines`` MPI engines launched by the venv's
    ``mpiexec`` (it must exist: ``pip install mpi4py mpich``)."""
    _positive(engines, "engines")
    _absolute(ipython_dir, "ipython_dir")
    if not (Path(venv) / "bin" / "mpiexec").exists():
        raise ProfileError(f"no mpiexec in {venv}/bin: `pip install mpi4py mpich` in the "
                           "course's environment (or pass venv=...)")
    values = {"engines": engines, "ipython_dir": ipython_dir, "profile": profile, "venv": venv,
              "controller_ip": controller_ip, "mpi_args": repr(list(mpi_args))}
    return {"ipcluster_config.py": _fill(_template("mpi/ipcluster_config.py.in"), values)}


def _sbatch_options(text: str) -> dict[str, str]:
    opts = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH"):
            words = shlex.split(line[len("#SBATCH"):])
            if not words or not words[0].startswith("--"):
                raise ProfileError(f"unsupported #SBATCH line (use --long-options): {line!r}")
            name, _, value = words[0][2:].partition("=")
            opts[name] = value if value or len(words) == 1 else words[1]
    return opts


def check_sbatch(text: str, spec: SlurmSpec) -> dict[str, str]:
    """Parse the ``#SBATCH`` options of a rendered engine script and check them against
    ``spec``; return the options. Raises ProfileError listing every problem."""
    opts = _sbatch_options(text)
    problems = [f"unknown sbatch option --{name}" for name in opts if name not in SBATCH_OPTIONS]
    expect = {"partition": spec.partition, "nodes": str(spec.nodes),
              "ntasks": str(spec.engines), "ntasks-per-node": str(spec.gpus_per_node),
              "gres": f"gpu:{spec.gpus_per_node}", "time": spec.time}
    problems += [f"--{k}={opts.get(k)!r}, expected {v!r}" for k, v in expect.items()
                 if opts.get(k) != v]
    if opts.get("ntasks", "").isdigit() and opts.get("nodes", "").isdigit() and \
            opts.get("ntasks-per-node", "").isdigit() and int(opts["ntasks"]) != \
            int(opts["nodes"]) * int(opts["ntasks-per-node"]):
        problems.append("ntasks must equal nodes x ntasks-per-node (one engine per GPU)")
    body = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    needs = {"CUDA_VISIBLE_DEVICES=$SLURM_LOCALID": "each engine must bind its local GPU",
             f"export IPYTHONDIR={spec.ipython_dir}": "the shared IPYTHONDIR must be exported",
             "srun ": "srun must start one engine per task"}
    problems += [f"{why} (no {needle!r} in the script)" for needle, why in needs.items()
                 if not any(needle in ln for ln in body)]
    if problems:
        raise ProfileError("rendered sbatch script is wrong:\n  " + "\n  ".join(problems))
    return opts


def write_profile(files: dict[str, str], ipython_dir: str, profile: str) -> Path:
    """Write rendered ``files`` into ``ipython_dir/profile_<profile>/``; return that folder."""
    folder = Path(ipython_dir) / f"profile_{profile}"
    (folder / "log").mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="coursekit profiles", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    s = sub.add_parser("slurm", help="Slurm GPU partition, one engine per GPU")
    s.add_argument("--partition", required=True)
    s.add_argument("--nodes", type=int, required=True)
    s.add_argument("--gpus-per-node", type=int, required=True)
    s.add_argument("--time", required=True)
    s.add_argument("--cpus-per-task", type=int, default=4)
    s.add_argument("--account", default="")
    s.add_argument("--sinfo", help="output of `sinfo -h -o '%%P %%G'` to check the queue")
    s.add_argument("--controller-ip", default="*",
                   help="address the controller listens on; the compute nodes must reach it "
                        "(default: every interface of the node running ipcluster)")
    m = sub.add_parser("mpi", help="engines launched by the venv's mpiexec")
    m.add_argument("--engines", type=int, required=True)
    for p in (s, m):
        p.add_argument("--ipython-dir", required=True)
        p.add_argument("--profile", default=None)
        p.add_argument("--dry-run", action="store_true", help="print, do not write")
    args = parser.parse_args(argv)
    try:
        if args.kind == "slurm":
            profile = args.profile or "coursekit"
            spec = SlurmSpec(args.partition, args.nodes, args.gpus_per_node, args.time,
                             args.ipython_dir, profile, cpus_per_task=args.cpus_per_task,
                             account=args.account, controller_ip=args.controller_ip,
                             partitions=parse_sinfo(args.sinfo) if args.sinfo else None)
            files = render_slurm(spec)
        else:
            profile = args.profile or "coursekit-mpi"
            files = render_mpi(args.engines, args.ipython_dir, profile=profile)
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        for name, text in files.items():
            print(f"==> {name} <==\n{text}")
        return 0
    folder = write_profile(files, args.ipython_dir, profile)
    print(f"wrote {folder}\nstart:  IPYTHONDIR={args.ipython_dir} ipcluster start "
          f"--profile={profile} --daemonize\nattach: export IPYTHONDIR={args.ipython_dir} "
          f"COURSEKIT_CLUSTER={profile}\ncheck:  coursekit preflight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
