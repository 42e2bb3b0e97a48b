"""The anatomy of one compute node, read from the machine itself (chapter 0).

A node of a training cluster holds one or more CPU **sockets** (packages), each with
several **cores**, each core running one or more **hardware threads** (SMT, Hyper-Threading);
the operating system sees every hardware thread as a logical CPU:

    logical CPUs = sockets x cores per socket x threads per core

Memory is shared by all of them. With one memory controller every CPU reaches every byte
at the same cost (**UMA**); with one controller per socket (or per die) each CPU has a
near and a far memory (**NUMA**): the CPUs and the memory of one controller form a NUMA
node, and a NUMA node's CPUs are counted once across the nodes. Each level of cache is
private to a core (L1, L2) or shared by several (L3): ``instances x CPUs sharing one =
logical CPUs``. Accelerators (GPUs) hang off the sockets' PCIe lanes.

:func:`read_sysfs` reads all this on Linux from ``/sys`` (``devices/system/cpu``,
``devices/system/node``, ``bus/pci/devices``); :func:`parse_lscpu` reads the text ``lscpu``
prints (Linux's util-linux, new and old formats); :func:`read_node` takes what this machine
offers (``/sys``, else ``lscpu``, else only ``os.cpu_count()``, e.g. on macOS or Windows).
What a source does not say is None, and :meth:`NodeAnatomy.problems` checks the relations
above among what is known.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Cache", "NodeAnatomy", "parse_cpulist", "parse_lscpu", "placement", "read_node",
           "read_sysfs"]

#: PCI vendor ids of GPU makers (NVIDIA, AMD); a display controller (PCI class 0x03) of
#: another vendor is a server's management VGA or a virtual machine's screen, not a GPU.
GPU_VENDORS = {"0x10de": "NVIDIA", "0x1002": "AMD"}


def parse_cpulist(text: str) -> tuple[int, ...]:
    """The CPUs of a kernel cpulist such as ``"0-3,8-11"`` or ``"0,1"`` (``""``: none)."""
    cpus = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(cpus)


@dataclass(frozen=True)
class Cache:
    """One cache level: ``kind`` is "Data", "Instruction" or "Unified"; ``size`` bytes per
    instance; ``instances`` copies in the node and ``cpus_each`` logical CPUs sharing one
    (None where the source does not say)."""

    level: int
    kind: str
    size: int
    instances: int | None = None
    cpus_each: int | None = None

    @property
    def name(self) -> str:
        return f"L{self.level}" + {"Data": "d", "Instruction": "i"}.get(self.kind, "")


@dataclass(frozen=True)
class NodeAnatomy:
    """What one node is made of (None: the source did not say). ``numa_nodes``: the CPUs
    of each NUMA node that has CPUs (empty: not reported); ``cpu_ids``: the logical CPUs'
    numbers (empty: not reported; they need not be 0 .. n-1 when some are offline);
    ``source``: where it was read."""

    logical_cpus: int
    sockets: int | None = None
    cores: int | None = None
    threads_per_core: int | None = None
    numa_nodes: tuple[tuple[int, ...], ...] = ()
    caches: tuple[Cache, ...] = ()
    gpus: int | None = None
    source: str = ""
    cpu_ids: tuple[int, ...] = ()

    @property
    def cores_per_socket(self) -> int | None:
        if self.cores is None or not self.sockets:
            return None
        return self.cores // self.sockets

    @property
    def memory(self) -> str:
        """"NUMA" with more than one NUMA node, "UMA" with one, "unknown" when not reported."""
        return {0: "unknown", 1: "UMA"}.get(len(self.numa_nodes), "NUMA")

    def problems(self) -> list[str]:
        """The relations of the module docstring that fail among the known values ([] when
        every one holds)."""
        out = []
        if self.cores is not None and self.sockets and self.cores % self.sockets:
            out.append(f"{self.cores} cores do not split evenly over {self.sockets} sockets")
        if self.cores is not None and self.threads_per_core is not None \
                and self.cores * self.threads_per_core != self.logical_cpus:
            out.append(f"cores x threads per core = {self.cores} x {self.threads_per_core} "
                       f"!= {self.logical_cpus} logical CPUs")
        if self.cpu_ids and len(set(self.cpu_ids)) != self.logical_cpus:
            out.append(f"{len(set(self.cpu_ids))} CPU numbers for {self.logical_cpus} logical CPUs")
        if self.numa_nodes:
            listed = [cpu for node in self.numa_nodes for cpu in node]
            if len(listed) != self.logical_cpus or len(set(listed)) != len(listed):
                out.append(f"the NUMA nodes list {len(listed)} CPUs ({len(set(listed))} distinct) "
                           f"for {self.logical_cpus} logical CPUs")
        for cache in self.caches:
            if cache.instances is not None and cache.cpus_each is not None \
                    and cache.instances * cache.cpus_each != self.logical_cpus:
                out.append(f"{cache.name}: {cache.instances} instances x {cache.cpus_each} CPUs "
                           f"each != {self.logical_cpus} logical CPUs")
        return out

    def describe(self) -> str:
        """A few lines for a person: sockets, cores, threads, NUMA, caches, GPUs."""
        def known(value, unit):
            return f"{value} {unit}" if value is not None else f"? {unit}"

        lines = [f"{self.logical_cpus} logical CPUs = {known(self.sockets, 'socket(s)')} x "
                 f"{known(self.cores_per_socket, 'cores per socket')} x "
                 f"{known(self.threads_per_core, 'thread(s) per core')}   (from {self.source})"]
        if self.numa_nodes:
            nodes = "; ".join(f"node {i}: CPUs {_cpulist(cpus)}" for i, cpus in enumerate(self.numa_nodes))
            lines.append(f"memory: {self.memory}, {len(self.numa_nodes)} NUMA node(s) ({nodes})")
        else:
            lines.append("memory: NUMA nodes not reported")
        for cache in self.caches:
            shared = (f", {cache.instances} of them, each shared by {cache.cpus_each} CPU(s)"
                      if cache.instances and cache.cpus_each else "")
            lines.append(f"{cache.name:>3} cache: {_size(cache.size)} each{shared}")
        lines.append(f"GPUs: {self.gpus if self.gpus is not None else 'not reported'}")
        return "\n".join(lines)


def _cpulist(cpus) -> str:
    """(0, 1, 2, 3, 8) -> "0-3,8"."""
    runs, cpus = [], sorted(cpus)
    for cpu in cpus:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 2**20, "MB": 2**20,
          "MIB": 2**20, "G": 2**30, "GB": 2**30, "GIB": 2**30}


def _bytes(text: str) -> int:
    """"32K", "48 KiB", "1.5 MiB" -> bytes (the kernel and lscpu mean powers of 1024)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMG]?i?B?)\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    return round(float(m.group(1)) * _UNITS[m.group(2).upper()])


# ---- /sys -------------------------------------------------------------------------------------

def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _sysfs_cpus(cpu_dir: Path) -> tuple[int, ...]:
    online = _read(cpu_dir / "online")
    if online is not None:
        return parse_cpulist(online)
    return tuple(sorted(int(p.name[3:]) for p in cpu_dir.glob("cpu[0-9]*")))


def _sysfs_topology(cpu_dir: Path, cpus) -> tuple[int | None, int | None, int | None]:
    """(sockets, cores, threads per core), None for what the topology files do not give."""
    keys, siblings = set(), []
    for cpu in cpus:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        package, core = _read(topo / "physical_package_id"), _read(topo / "core_id")
        if package is None or core is None:
            return None, None, None
        keys.add((int(package), int(core)))
        sibling_list = _read(topo / "thread_siblings_list")
        if sibling_list is not None:
            siblings.append(len(parse_cpulist(sibling_list)))
    sockets = len({package for package, _ in keys})
    threads = max(siblings) if len(siblings) == len(cpus) else None
    return sockets, len(keys), threads


def _sysfs_caches(cpu_dir: Path, cpus) -> tuple[Cache, ...]:
    caches = []
    for index in sorted((cpu_dir / f"cpu{cpus[0]}" / "cache").glob("index[0-9]*")):
        level, kind, size = (_read(index / f) for f in ("level", "type", "size"))
        if level is None or kind is None or size is None:
            continue
        groups = {_read(cpu_dir / f"cpu{cpu}" / "cache" / index.name / "shared_cpu_list")
                  for cpu in cpus}
        if None in groups:
            instances = cpus_each = None
        else:
            instances = len(groups)
            cpus_each = max(len(parse_cpulist(g)) for g in groups)
        caches.append(Cache(int(level), kind, _bytes(size), instances, cpus_each))
    return tuple(caches)


def _sysfs_gpus(root: Path) -> int | None:
    devices = root / "bus" / "pci" / "devices"
    if not devices.is_dir():
        return None
    return sum(1 for dev in devices.iterdir()
               if (_read(dev / "class") or "").startswith("0x03")
               and _read(dev / "vendor") in GPU_VENDORS)


def read_sysfs(root="/sys") -> NodeAnatomy:
    """The node as Linux's sysfs under ``root`` describes it (FileNotFoundError without
    ``root/devices/system/cpu``); a missing file leaves its part None or empty."""
    root = Path(root)
    cpu_dir = root / "devices" / "system" / "cpu"
    if not cpu_dir.is_dir():
        raise FileNotFoundError(f"{cpu_dir} does not exist (not Linux, or /sys not mounted)")
    cpus = _sysfs_cpus(cpu_dir)
    if not cpus:
        raise FileNotFoundError(f"{cpu_dir} lists no CPU")
    sockets, cores, threads = _sysfs_topology(cpu_dir, cpus)
    nodes = []
    for node in sorted((root / "devices" / "system" / "node").glob("node[0-9]*"),
                       key=lambda p: int(p.name[4:])):
        members = parse_cpulist(_read(node / "cpulist") or "")
        if members:  # a node of memory only (CXL, HBM) has no CPUs
            nodes.append(tuple(c for c in members if c in cpus))
    return NodeAnatomy(len(cpus), sockets, cores, threads, tuple(nodes),
                       _sysfs_caches(cpu_dir, cpus), _sysfs_gpus(root), f"{root}", cpus)


# ---- lscpu ------------------------------------------------------------------------------------

def parse_lscpu(text: str) -> NodeAnatomy:
    """The node as ``lscpu``'s text describes it: "CPU(s)", "Socket(s)", "Core(s) per
    socket", "Thread(s) per core", "NUMA nodeN CPU(s)" and the cache lines, in the new
    format ("L2 cache: 40 MiB (32 instances)": the total over the instances) or the old
    one ("L2 cache: 1280K": one instance). lscpu does not list GPUs."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    if "CPU(s)" not in fields:
        raise ValueError("not lscpu output: no 'CPU(s):' line")

    def number(key):
        value = fields.get(key)
        return int(value) if value and value.isdigit() else None

    logical, sockets = number("CPU(s)"), number("Socket(s)")
    per_socket, threads = number("Core(s) per socket"), number("Thread(s) per core")
    cores = per_socket * sockets if per_socket is not None and sockets is not None else None
    nodes = []
    for key, value in fields.items():
        m = re.fullmatch(r"NUMA node(\d+) CPU\(s\)", key)
        if m and value:
            nodes.append((int(m.group(1)), parse_cpulist(value)))
    caches = []
    for key, value in fields.items():
        m = re.fullmatch(r"L(\d)([di]?) cache", key)
        if not m or not value:
            continue
        kind = {"d": "Data", "i": "Instruction", "": "Unified"}[m.group(2)]
        n = re.fullmatch(r"(.+?)\s*\((\d+) instances?\)", value)
        if n:
            instances = int(n.group(2))
            caches.append(Cache(int(m.group(1)), kind, _bytes(n.group(1)) // instances, instances,
                                logical // instances if logical % instances == 0 else None))
        else:
            caches.append(Cache(int(m.group(1)), kind, _bytes(value)))
    online = parse_cpulist(fields.get("On-line CPU(s) list", ""))
    return NodeAnatomy(logical, sockets, cores, threads, tuple(c for _, c in sorted(nodes)),
                       tuple(caches), None, "lscpu", online)


def read_node() -> NodeAnatomy:
    """This machine: from /sys where Linux has it, else from ``lscpu``, else the number of
    logical CPUs alone (``os.cpu_count()``)."""
    try:
        return read_sysfs("/sys")
    except FileNotFoundError:
        pass
    if shutil.which("lscpu"):
        try:
            out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                                 env={**os.environ, "LC_ALL": "C"})
            if out.returncode == 0:
                return parse_lscpu(out.stdout)
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    return NodeAnatomy(os.cpu_count() or 1, source="os.cpu_count()")


def placement() -> dict:
    """Where this process runs: ``{"host", "pid", "allowed": the CPUs it may run on (None
    where the OS does not say), "cpu": the CPU it ran on last (None off Linux)}``. Run it on
    the engines (``cluster.run(placement)``) to see where they sit."""
    import socket

    allowed = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
    try:  # field 39 of /proc/self/stat, "processor"; fields after the ")" start at field 3
        with open("/proc/self/stat") as f:
            cpu = int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        cpu = None
    return {"host": socket.gethostname(), "pid": os.getpid(), "allowed": allowed, "cpu": cpu}
