"""JupyterHub for a class on Slurm: each student's JupyterLab is a Slurm job (batchspawner).

A student logs in, the hub submits ``sbatch`` *as that student* (``sudo -E -u NAME``: the
hub runs as root, or as a user with a sudoers rule for sbatch/squeue/scancel), and the job
runs ``batchspawner-singleuser jupyterhub-singleuser`` from the course's virtual environment
on a compute node. Inside that job ``cluster.start(n)`` starts the student's own engines:
they are children of the job's step, so they share its cores, memory and GPUs (Slurm's
cgroups keep them there) and end with the job. One job per student means no student can
disturb another's timings, which is the whole point of chapters 03-07.

Everything site-specific is read from ``COURSEKIT_HUB_*`` environment variables (defaults
in brackets), so this file is used unchanged; run it as::

    COURSEKIT_HUB_PARTITION=gpu COURSEKIT_HUB_GPUS=1 COURSEKIT_HUB_CLASS_LIST=/etc/course/students \\
        jupyterhub -f profiles/jupyterhub/jupyterhub_config.py

==========================  ================================================================
COURSEKIT_HUB_PARTITION     Slurm partition of the students' jobs [gpu]
COURSEKIT_HUB_CPUS          cores per student (= engines + 1 for the kernel) [5]
COURSEKIT_HUB_GPUS          GPUs per student, 0 for a CPU-only class [0]
COURSEKIT_HUB_MEMORY        memory per student, Slurm syntax [8G]
COURSEKIT_HUB_TIME          time limit of a student's job (the lesson's length) [02:00:00]
COURSEKIT_HUB_CLASS_LIST    file with one Unix user name per line: who may log in [required]
COURSEKIT_HUB_IP            address of the public proxy [0.0.0.0; put TLS in front of it]
COURSEKIT_HUB_PORT          port of the public proxy [8000]
COURSEKIT_HUB_API_IP        address the compute nodes reach the hub on [this host's name]
COURSEKIT_HUB_SERVER_IP     address a student's server listens on in its job [0.0.0.0]
COURSEKIT_HUB_VENV          the course's virtual environment, on a shared file system
                            [the one running the hub]
COURSEKIT_HUB_STATE         folder for the hub's database and cookie secret [current folder]
==========================  ================================================================

Authentication is PAM (the students' Unix passwords; the Slurm jobs need Unix accounts
anyway). For LDAP or OAuth, override ``c.JupyterHub.authenticator_class`` after this file
(``ldapauthenticator``, ``oauthenticator``); the test of this recipe uses the dummy
authenticator with a shared password, which is never acceptable for a real class.
"""

import os
import re
import socket
import sys
from pathlib import Path

c = get_config()  # noqa: F821  (provided by JupyterHub when it loads this file)

_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_MEMORY = re.compile(r"^\d+[KMGT]?$")


def setting(name: str, default: str | None, pattern: re.Pattern | None, allowed: str) -> str:
    """``COURSEKIT_HUB_<name>``, checked: a typo stops the hub with the allowed form."""
    value = os.environ.get(f"COURSEKIT_HUB_{name}", default)
    if value is None or (pattern is not None and not pattern.match(value)):
        raise ValueError(f"COURSEKIT_HUB_{name}={value!r}: expected {allowed}")
    return value


PARTITION = setting("PARTITION", "gpu", _NAME, "a Slurm partition name (`sinfo -s`)")
CPUS = int(setting("CPUS", "5", re.compile(r"^[1-9]\d*$"), "a positive number of cores"))
GPUS = int(setting("GPUS", "0", re.compile(r"^\d+$"), "a number of GPUs (0 for none)"))
MEMORY = setting("MEMORY", "8G", _MEMORY, "Slurm memory such as 16G or 8000M")
TIME = setting("TIME", "02:00:00", _TIME, "a Slurm time limit such as 90 or 02:00:00")
CLASS_LIST = Path(setting("CLASS_LIST", None, None, "a file of user names, one a line"))
VENV = Path(setting("VENV", sys.prefix, None, "a virtual environment folder"))
STATE = Path(setting("STATE", os.getcwd(), None, "a folder"))

students = {line.strip() for line in CLASS_LIST.read_text().splitlines()} - {""}
bad = sorted(name for name in students if not _NAME.match(name))
if not students or bad:
    raise ValueError(f"{CLASS_LIST}: one Unix user name a line (letters, digits, _ . -); "
                     f"{'bad: ' + ', '.join(bad) if bad else 'it lists nobody'}")
for tool in ("batchspawner-singleuser", "jupyterhub-singleuser"):
    if not (VENV / "bin" / tool).is_file():
        raise ValueError(f"{VENV / 'bin' / tool} is missing: install the course with its "
                         "'class' extra (pip install -e '.[class]') in COURSEKIT_HUB_VENV")

c.JupyterHub.ip = setting("IP", "0.0.0.0", None, "an address")
c.JupyterHub.port = int(setting("PORT", "8000", re.compile(r"^\d+$"), "a port number"))
c.JupyterHub.hub_ip = setting("API_IP", socket.gethostname(), None, "an address")
c.JupyterHub.db_url = f"sqlite:///{STATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(STATE / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(STATE / "jupyterhub-proxy.pid")
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = students

c.JupyterHub.spawner_class = "batchspawner.SlurmSpawner"
c.Spawner.ip = setting("SERVER_IP", "0.0.0.0", None, "an address")
c.Spawner.cmd = [str(VENV / "bin" / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 300  # a full queue: the student waits, then gets a clear error
c.Spawner.http_timeout = 120
c.SlurmSpawner.batchspawner_singleuser_cmd = str(VENV / "bin" / "batchspawner-singleuser")
c.SlurmSpawner.exec_prefix = "sudo -E -u {username}"
c.SlurmSpawner.req_partition = PARTITION
c.SlurmSpawner.req_nprocs = str(CPUS)
c.SlurmSpawner.req_memory = MEMORY
c.SlurmSpawner.req_runtime = TIME
c.SlurmSpawner.req_gres = f"gpu:{GPUS}" if GPUS else ""
# The course's Python first, so that `cluster.start` launches engines from the same environment
# (the job's cores and GPUs reach the engines through the job itself, CUDA_VISIBLE_DEVICES).
c.Spawner.environment = {"PATH": f"{VENV / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
