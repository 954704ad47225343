"""Run a Python program written by a model in a bubblewrap sandbox (docs/agents.md, "Running
model-written code").

`run_python(source, stdin, config)` runs `source` with the interpreter olingo runs on, inside
`bwrap` (https://github.com/containers/bubblewrap), and returns its stdout, stderr, exit status
and, when a limit stopped it, which (`SandboxResult.killed`). The sandbox:

* sees only read-only system paths (/usr, the /lib* and /bin links or directories, the Python
  install prefix, /etc/ld.so.cache) and a fresh tmpfs at /tmp (its cwd and $HOME, the only
  writable path, `scratch_mb` large); not the run directory, /root, /home, the host's /tmp or
  the trainer's cwd, nor /etc (no /etc/shadow, /etc/passwd, host names or DNS);
* has new network, PID, IPC and UTS namespaces: no network but its own loopback (a socket cannot
  reach 127.0.0.1 of the host), no process outside its own visible or signalable, so it cannot kill
  the trainer (`kill -9 -1` reaches only its own processes), and a new session (no TIOCSTI);
* runs under rlimits set before the program starts: CPU seconds (RLIMIT_CPU), address space
  (RLIMIT_AS), processes and threads (RLIMIT_NPROC), file size, no core files. RLIMIT_NPROC
  counts per user: run by an ordinary user, the sandbox has a user namespace of its own, in
  which the count is its own processes; run as root (exempt from RLIMIT_NPROC), bwrap makes no
  user namespace and the program drops to a uid of its own (one per run) before it starts;
* is killed whole at the wall-clock timeout or when its output passes `max_output_bytes`:
  killing bwrap kills the PID namespace's init (`--die-with-parent`), and with it every process
  the program started.

Where bwrap is missing or the kernel refuses its namespaces, `check_sandbox()` raises one
`SandboxUnavailableError` line saying which and how to fix it; environments call it when they
are configured, before any model loads.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from olingo.config import StrictModel
from olingo.errors import OlingoError

INSTALL_HINT = "install bubblewrap (in a checkout: make sandbox; on Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
NAMESPACE_HINT = (
    "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; on Ubuntu 24.04+ "
    "also kernel.apparmor_restrict_unprivileged_userns=0)"
)
ROOT_HINT = "as root, bwrap needs CAP_SYS_ADMIN to make namespaces (a Docker container: --cap-add SYS_ADMIN --security-opt seccomp=unconfined, or --privileged)"
MIN_BWRAP = (0, 8)  # --size for --tmpfs, --perms on --tmpfs and --dir, --disable-userns
Killed = Literal["timeout", "cpu", "memory", "output"]
_PROGRAM = "/tmp/main.py"
_UID_BASE = 2_000_000_000  # root mode: run k of process p runs as uid _UID_BASE + (p % 100000) * 1000 + k % 1000
_RUNS = itertools.count()

# Runs inside the sandbox before the program (trusted): the rlimits, then in root mode the switch
# to the run's own uid (which drops every capability), then the program in a fresh interpreter,
# isolated (-I) and without `site` (-S): the standard library only, and 10-40 ms less per run.
_BOOTSTRAP = """\
import os, resource, sys
python, uid, cpu, memory, fsize, nproc = sys.argv[1], *map(int, sys.argv[2:7])
for kind, soft, hard in ((resource.RLIMIT_CORE, 0, 0), (resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_AS, memory, memory),
                         (resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_NPROC, nproc, nproc)):
    resource.setrlimit(kind, (soft, hard))
if uid >= 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
os.execv(python, [python, "-I", "-S", sys.argv[7]])
"""


class SandboxUnavailableError(OlingoError, RuntimeError):
    """bubblewrap is not installed, or the kernel refuses the namespaces it needs."""


class SandboxConfig(StrictModel):
    """Limits of one sandboxed run of model-written code (olingo/rollout/sandbox.py)."""

    timeout_s: float = Field(10.0, gt=0, le=3600, description="wall-clock seconds a run may take; past it every process of the sandbox is killed")
    cpu_s: int = Field(10, ge=1, le=3600, description="CPU seconds per process (RLIMIT_CPU); past it the process is killed (SIGXCPU)")
    memory_mb: int = Field(
        512, ge=64, le=65536, description="address space per process in MiB (RLIMIT_AS); an allocation past it fails (in Python a MemoryError)",
    )
    max_processes: int = Field(
        16, ge=1, le=4096, description="processes and threads the program may have at once, itself included (RLIMIT_NPROC); a fork past it fails",
    )
    max_output_bytes: int = Field(
        65536, ge=256, le=64 * 2**20, description="bytes of stdout and stderr together; past it the run is killed and its output cut there",
    )
    scratch_mb: int = Field(16, ge=1, le=4096, description="size in MiB of the sandbox's /tmp, a tmpfs (in memory): its only writable directory")


@dataclass
class SandboxResult:
    """What one sandboxed run did."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The program's exit status, 128 + N when signal N ended it; None when the sandbox was killed
    (timeout, output)."""
    killed: Killed | None
    """The limit that stopped the run: timeout (wall clock), cpu (RLIMIT_CPU), memory (a MemoryError
    or failed allocation under RLIMIT_AS), output (max_output_bytes); None when it ended on its own."""
    seconds: float
    """Wall-clock seconds, sandbox start-up included."""

    @property
    def ok(self) -> bool:
        """The program exited with status 0 and no limit stopped it."""
        return self.exit_code == 0 and self.killed is None


def bwrap_path() -> str:
    """The `bwrap` executable on PATH (also /usr/bin, for a trainer started with a bare PATH)."""
    found = shutil.which("bwrap") or shutil.which("bwrap", path="/usr/bin:/usr/local/bin")
    if found is None:
        raise SandboxUnavailableError(f"running model-written code needs the bubblewrap sandbox, and 'bwrap' is not on PATH: {INSTALL_HINT}")
    return found


@functools.cache
def check_sandbox() -> None:
    """Nothing when a sandboxed run works here (a probe program runs once per process, ~50 ms); else
    one `SandboxUnavailableError` line: bwrap missing, or the kernel refusing its namespaces."""
    version = subprocess.run([bwrap_path(), "--version"], capture_output=True, text=True).stdout.split()
    numbers = tuple(int(part) for part in re.findall(r"\d+", version[-1])[:2]) if version else ()
    if numbers < MIN_BWRAP:
        found, needed = " ".join(version) or "a bwrap that does not say its version", ".".join(map(str, MIN_BWRAP))
        raise SandboxUnavailableError(f"the sandbox for model-written code needs bubblewrap {needed} or later (--size, --disable-userns), "
                                      f"found {found}: install a newer one (Debian 12 and Ubuntu 24.04 ship one)")
    result = run_python("print('olingo sandbox probe')", config=SandboxConfig(timeout_s=30))
    if result.stdout.strip() != "olingo sandbox probe":
        said = " ".join((result.stderr or f"exit status {result.exit_code}, killed: {result.killed}").split())[:300]
        hint = ROOT_HINT if os.geteuid() == 0 else NAMESPACE_HINT
        raise SandboxUnavailableError(f"the bubblewrap sandbox for model-written code does not start here ({said}): {hint}")


def run_python(source: str, stdin: str = "", config: SandboxConfig | None = None) -> SandboxResult:
    """Run the Python program `source` in the sandbox (module docstring), `stdin` as its input.

    The program runs as `python -I -S`: only the standard library is importable (the sandbox sees
    the interpreter's install prefix, not olingo's virtual environment), and without `site` there
    are no `exit()`/`quit()` builtins (`sys.exit` works). Thread-safe; every call is a fresh sandbox."""
    config = config or SandboxConfig()
    started = time.monotonic()
    bwrap_path()  # its one-line error before anything else (also where memfd_create is missing)
    program_fd, stdin_fd = _memfd("program", source), _memfd("stdin", stdin)
    try:
        command = sandbox_command(config, program_fd)
        proc = subprocess.Popen(
            command, stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(program_fd,), start_new_session=True, env={},
        )
    finally:
        os.close(program_fd)
        os.close(stdin_fd)
    with proc:
        stdout, stderr, killed = _collect(proc, config, started + config.timeout_s)
        proc.wait()
    out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    exit_code = None if killed else proc.returncode
    if killed is None:
        killed = _limit_hit(exit_code, err)
    return SandboxResult(out, err, exit_code, killed, time.monotonic() - started)


def sandbox_command(config: SandboxConfig, program_fd: int) -> list[str]:
    """The bwrap command line that runs the program copied from `program_fd` (see the module docstring)."""
    root = os.geteuid() == 0
    python = interpreter()
    if root:  # no user namespace (root is exempt from RLIMIT_NPROC in one); the bootstrap drops to uid
        namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                      "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        uid, nproc = _UID_BASE + (os.getpid() % 100_000) * 1000 + next(_RUNS) % 1000, config.max_processes
    else:  # bwrap's init shares the user namespace's process count
        namespaces = ["--unshare-all", "--unshare-user", "--disable-userns"]
        uid, nproc = -1, config.max_processes + 1
    scratch = config.scratch_mb * 2**20
    args = [bwrap_path(), *namespaces, "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox"]
    args += _system_mounts(python)
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(scratch), "--tmpfs", "/tmp"]
    args += ["--perms", "0444", "--file", str(program_fd), _PROGRAM, "--chdir", "/tmp"]
    for name, value in (("HOME", "/tmp"), ("TMPDIR", "/tmp"), ("PATH", "/usr/local/bin:/usr/bin:/bin"), ("LANG", "C.UTF-8")):
        args += ["--setenv", name, value]
    limits = [uid, config.cpu_s, config.memory_mb * 2**20, scratch, nproc]
    return [*args, "--", python, "-I", "-S", "-c", _BOOTSTRAP, python, *map(str, limits), _PROGRAM]


@functools.cache
def interpreter() -> str:
    """The Python the sandbox runs: olingo's own, outside any virtual environment (a venv made
    with --copies holds a copy of the interpreter: its base install's is used, so the venv stays out)."""
    python, base = os.path.realpath(sys.executable), os.path.realpath(sys.base_exec_prefix)
    if python.startswith(base + os.sep):
        return python
    candidate = os.path.join(base, "bin", f"python{sys.version_info.major}.{sys.version_info.minor}")
    return candidate if os.access(candidate, os.X_OK) else python


@functools.cache
def _system_mounts(python: str) -> tuple[str, ...]:
    """Read-only binds of what the interpreter needs: /usr, /lib*, /bin, /sbin (as the host has them:
    links or directories), the install prefixes outside /usr, and the dynamic linker's cache."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.dirname(python)))}
    covered = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
    for prefix in sorted(prefixes, key=len):
        if not any(prefix == top or prefix.startswith(top + "/") for top in covered):
            # bwrap makes a bind's missing parents 0700: a prefix under /root would be out of reach of the run's uid
            parents = [os.path.dirname(prefix)]
            while os.path.dirname(parents[-1]) != parents[-1]:
                parents.append(os.path.dirname(parents[-1]))
            for parent in reversed(parents[:-1]):
                args += ["--perms", "0755", "--dir", parent]
            args += ["--ro-bind", prefix, prefix]
            covered.append(prefix)
    return (*args, "--perms", "0755", "--dir", "/etc", "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache")


def _memfd(name: str, text: str) -> int:
    """An anonymous in-memory file holding `text`, read from its start (close-on-exec)."""
    fd = os.memfd_create(f"olingo-sandbox-{name}")
    _write_all(fd, text.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _collect(proc: subprocess.Popen, config: SandboxConfig, deadline: float) -> tuple[bytes, bytes, Killed | None]:
    """stdout and stderr until both close, or until the deadline or the output limit kills the
    sandbox; then the sandbox's exit (within the deadline: a program may close its pipes and run on)."""
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total, killed = 0, None
    with selectors.DefaultSelector() as selector:
        for stream in (proc.stdout, proc.stderr):
            selector.register(stream, selectors.EVENT_READ)
        while killed is None and selector.get_map():
            left = deadline - time.monotonic()
            events = selector.select(left) if left > 0 else []
            if not events:
                killed = "timeout"
            for key, _ in events:
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                chunks[key.fd].append(data)
                total += len(data)
                if total > config.max_output_bytes:
                    killed = "output"
                    break
    if killed is None and _wait_until(proc, deadline) is None:
        killed = "timeout"
    if killed is not None:
        _kill(proc)
    stdout, stderr = b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])
    if killed == "output":
        stdout = stdout[: config.max_output_bytes]
        stderr = stderr[: max(0, config.max_output_bytes - len(stdout))]
    return stdout, stderr, killed


def _wait_until(proc: subprocess.Popen, deadline: float) -> int | None:
    """Whether the sandbox exited by the deadline (a pid file descriptor polled, not reaped)."""
    pidfd = os.pidfd_open(proc.pid)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(pidfd, selectors.EVENT_READ)
            return 0 if selector.select(max(0.0, deadline - time.monotonic())) else None
    finally:
        os.close(pidfd)


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL bwrap and its PID namespace's init: the kernel then kills every process inside."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _limit_hit(exit_code: int | None, stderr: str) -> Killed | None:
    """Which rlimit ended a run that ended by itself, if one did: SIGXCPU is cpu (a program that
    catches it is killed at the hard limit, a second later: exit 137, not flagged); a failed run
    whose stderr ends with a MemoryError (Python's traceback of a refused allocation) is memory."""
    if exit_code == 128 + signal.SIGXCPU:
        return "cpu"
    last = stderr[-2000:].strip().rsplit("\n", 1)[-1]
    if exit_code not in (0, None) and last.startswith("MemoryError"):
        return "memory"
    return None


__all__ = ["SandboxConfig", "SandboxResult", "SandboxUnavailableError", "bwrap_path", "check_sandbox", "run_python", "sandbox_command"]
