"""Node anatomy: sysfs trees and lscpu text of a two-socket NUMA server and a laptop, parsed
into sockets x cores x threads, NUMA nodes, caches and GPUs; and this machine itself."""

import os
from pathlib import Path

import pytest

from coursekit.cluster.node_anatomy import (Cache, NodeAnatomy, parse_cpulist, parse_lscpu,
                                            read_node, read_sysfs)

KiB, MiB = 1024, 1024 * 1024


def cpulist(cpus) -> str:
    return ",".join(str(c) for c in sorted(cpus))  # the kernel writes ranges; both parse


def fake_sysfs(root: Path, sockets: int, cores: int, threads: int, *, numa_per_socket: bool,
               caches, pci=()) -> Path:
    """A /sys tree as Linux writes it for ``sockets`` x ``cores`` x ``threads`` with Intel's
    numbering (CPU = thread * sockets * cores + socket * cores + core). ``caches``: (level,
    type, size text, shared by "core" or "socket"); ``pci``: (class, vendor) per device."""
    n = sockets * cores * threads
    cpu_dir = root / "devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(f"0-{n - 1}\n")

    def place(cpu):
        thread, rest = divmod(cpu, sockets * cores)
        return rest // cores, rest % cores  # socket, core

    for cpu in range(n):
        socket, core = place(cpu)
        siblings = [c for c in range(n) if place(c) == (socket, core)]
        in_socket = [c for c in range(n) if place(c)[0] == socket]
        topo = cpu_dir / f"cpu{cpu}/topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{socket}\n")
        (topo / "core_id").write_text(f"{core}\n")
        (topo / "thread_siblings_list").write_text(cpulist(siblings) + "\n")
        for i, (level, kind, size, shared) in enumerate(caches):
            index = cpu_dir / f"cpu{cpu}/cache/index{i}"
            index.mkdir(parents=True)
            (index / "level").write_text(f"{level}\n")
            (index / "type").write_text(f"{kind}\n")
            (index / "size").write_text(f"{size}\n")
            (index / "shared_cpu_list").write_text(cpulist(siblings if shared == "core" else in_socket) + "\n")
    node_dir = root / "devices/system/node"
    groups = ([[c for c in range(n) if place(c)[0] == s] for s in range(sockets)]
              if numa_per_socket else [list(range(n))])
    for i, members in enumerate(groups):
        (node_dir / f"node{i}").mkdir(parents=True)
        (node_dir / f"node{i}/cpulist").write_text(cpulist(members) + "\n")
    for i, (klass, vendor) in enumerate(pci):
        dev = root / f"bus/pci/devices/0000:{i:02x}:00.0"
        dev.mkdir(parents=True)
        (dev / "class").write_text(klass + "\n")
        (dev / "vendor").write_text(vendor + "\n")
    return root


SERVER_CACHES = [(1, "Data", "32K", "core"), (1, "Instruction", "32K", "core"),
                 (2, "Unified", "1024K", "core"), (3, "Unified", "28160K", "socket")]
#  4 V100 (3D controllers), the board's ASPEED VGA, a network card
SERVER_PCI = [("0x030200", "0x10de")] * 4 + [("0x030000", "0x1a03"), ("0x020000", "0x15b3")]


@pytest.fixture
def server(tmp_path):  # 2 x Xeon Gold 6248: 20 cores, 2 threads each, one NUMA node per socket
    return fake_sysfs(tmp_path / "server", 2, 20, 2, numa_per_socket=True,
                      caches=SERVER_CACHES, pci=SERVER_PCI)


def test_a_two_socket_numa_server_from_sysfs(server):
    node = read_sysfs(server)
    assert (node.logical_cpus, node.sockets, node.cores, node.threads_per_core) == (80, 2, 40, 2)
    assert node.sockets * node.cores_per_socket * node.threads_per_core == node.logical_cpus
    assert node.memory == "NUMA" and len(node.numa_nodes) == 2
    assert node.numa_nodes[0] == (*range(0, 20), *range(40, 60))  # both threads of socket 0's cores
    assert [c.name for c in node.caches] == ["L1d", "L1i", "L2", "L3"]
    assert node.caches[0] == Cache(1, "Data", 32 * KiB, instances=40, cpus_each=2)
    assert node.caches[3] == Cache(3, "Unified", 27.5 * MiB, instances=2, cpus_each=40)
    assert node.gpus == 4  # NVIDIA's four, not the management VGA
    assert node.cpu_ids == tuple(range(80))
    assert node.problems() == []


def test_a_laptop_from_sysfs(tmp_path):
    root = fake_sysfs(tmp_path, 1, 4, 2, numa_per_socket=False,
                      caches=[(1, "Data", "48K", "core"), (2, "Unified", "1280K", "core"),
                              (3, "Unified", "12288K", "socket")],
                      pci=[("0x030000", "0x8086")])  # Intel's integrated graphics
    node = read_sysfs(root)
    assert (node.logical_cpus, node.sockets, node.cores, node.threads_per_core) == (8, 1, 4, 2)
    assert node.memory == "UMA" and node.numa_nodes == (tuple(range(8)),)
    assert node.caches[2] == Cache(3, "Unified", 12 * MiB, instances=1, cpus_each=8)
    assert node.gpus == 0 and node.problems() == []


def test_missing_sysfs_files_leave_their_part_unknown(server):
    for cpu in range(80):
        (server / f"devices/system/cpu/cpu{cpu}/topology/core_id").unlink()
    for cpu in (3, 7):
        (server / f"devices/system/cpu/cpu{cpu}/cache/index3/shared_cpu_list").unlink()
    (server / "devices/system/node/node1/cpulist").unlink()
    node = read_sysfs(server)
    assert (node.logical_cpus, node.sockets, node.cores, node.threads_per_core) == (80, None, None, None)
    assert node.caches[3].instances is None and node.caches[0].instances == 40
    assert len(node.numa_nodes) == 1  # node1 unreadable: the check below then says so
    assert node.problems() == ["the NUMA nodes list 40 CPUs (40 distinct) for 80 logical CPUs"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_sysfs(server / "nowhere")


SERVER_LSCPU = """\
Architecture:                    x86_64
CPU(s):                          80
On-line CPU(s) list:             0-79
Vendor ID:                       GenuineIntel
Model name:                      Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz
Thread(s) per core:              2
Core(s) per socket:              20
Socket(s):                       2
L1d cache:                       1.3 MiB (40 instances)
L1i cache:                       1.3 MiB (40 instances)
L2 cache:                        40 MiB (40 instances)
L3 cache:                        55 MiB (2 instances)
NUMA node(s):                    2
NUMA node0 CPU(s):               0-19,40-59
NUMA node1 CPU(s):               20-39,60-79
"""

LAPTOP_LSCPU_OLD = """\
Architecture:        x86_64
CPU(s):              8
On-line CPU(s) list: 0-7
Thread(s) per core:  2
Core(s) per socket:  4
Socket(s):           1
NUMA node(s):        1
Model name:          Intel(R) Core(TM) i7-8565U CPU @ 1.80GHz
L1d cache:           32K
L1i cache:           32K
L2 cache:            256K
L3 cache:            8192K
NUMA node0 CPU(s):   0-7
"""


def test_lscpu_of_the_server_new_format():
    node = parse_lscpu(SERVER_LSCPU)
    assert (node.logical_cpus, node.sockets, node.cores, node.threads_per_core) == (80, 2, 40, 2)
    assert node.numa_nodes == ((*range(0, 20), *range(40, 60)), (*range(20, 40), *range(60, 80)))
    l1d, l3 = node.caches[0], node.caches[3]
    assert (l1d.name, l1d.instances, l1d.cpus_each) == ("L1d", 40, 2)
    assert abs(l1d.size - 32 * KiB) < 0.05 * 32 * KiB  # lscpu rounds the total: 1.3 MiB / 40
    assert (l3.size, l3.instances, l3.cpus_each) == (27.5 * MiB, 2, 40)
    assert node.gpus is None and node.memory == "NUMA" and node.problems() == []
    assert node.cpu_ids == tuple(range(80))


def test_lscpu_of_a_laptop_old_format():
    node = parse_lscpu(LAPTOP_LSCPU_OLD)
    assert (node.logical_cpus, node.sockets, node.cores, node.threads_per_core) == (8, 1, 4, 2)
    assert node.memory == "UMA"
    assert [(c.name, c.size, c.instances) for c in node.caches] == [
        ("L1d", 32 * KiB, None), ("L1i", 32 * KiB, None), ("L2", 256 * KiB, None), ("L3", 8 * MiB, None)]
    assert node.problems() == []


def test_inconsistent_counts_are_named():
    bad = NodeAnatomy(6, sockets=2, cores=3, threads_per_core=1, numa_nodes=((0, 1, 2), (2, 3, 4)),
                      caches=(Cache(3, "Unified", MiB, 1, 4),))
    assert bad.problems() == ["3 cores do not split evenly over 2 sockets",
                              "cores x threads per core = 3 x 1 != 6 logical CPUs",
                              "the NUMA nodes list 6 CPUs (5 distinct) for 6 logical CPUs",
                              "L3: 1 instances x 4 CPUs each != 6 logical CPUs"]
    with pytest.raises(ValueError, match="not lscpu output"):
        parse_lscpu("hello")


def test_cpulists():
    assert parse_cpulist("0-3,8-11\n") == (0, 1, 2, 3, 8, 9, 10, 11)
    assert parse_cpulist("5") == (5,) and parse_cpulist("") == ()


@pytest.mark.skipif(not Path("/sys/devices/system/cpu").is_dir(), reason="no Linux sysfs here")
def test_this_machine_agrees_with_os_cpu_count():
    node = read_node()
    assert node.logical_cpus == os.cpu_count()
    assert node.problems() == [] and set(os.sched_getaffinity(0)) <= set(node.cpu_ids)
    assert node.source == "/sys" and node.sockets >= 1 and node.cores >= 1
    assert node.describe().startswith(f"{os.cpu_count()} logical CPUs = ")


def test_placement_of_this_process():
    import socket

    from coursekit.cluster.node_anatomy import placement

    here = placement()
    assert here["host"] == socket.gethostname() and here["pid"] == os.getpid()
    if hasattr(os, "sched_getaffinity"):
        assert set(here["allowed"]) == os.sched_getaffinity(0)
    if Path("/proc/self/stat").exists():
        assert here["cpu"] in here["allowed"]
