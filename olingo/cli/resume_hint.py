"""The command that resumes a stopped run, printed after Ctrl-C/SIGTERM and in resume errors.

It is the command line the run was started with (`sys.argv`, quoted for a POSIX shell with
`shlex.join`) with `run.resume=last` in place of any earlier `run.resume=...`, run from the same
directory, with what the run's environment had to hold to start at all:

* `PYTHONPATH=<dirs>`: the directories user modules were imported from (a reward, accuracy or
  verifier function named `package.module:fn` in the config, and whatever that module imported)
  when only `PYTHONPATH` or the working directory made them importable. Each module in
  `sys.modules` is traced back to the `sys.path` entry it was found under; installed packages
  (site-packages, editable installs) and olingo itself need nothing.
* `OLINGO_HOME=<dir>` when it was set: where converted GGUF models and other caches live.
* the same launcher, by a path that works as printed, with or without the virtual environment
  active: the `olingo` script the run was started with, by its absolute path
  (`/home/me/proj/.venv/bin/olingo`); `<this python> -m olingo.cli.main` for a run started any
  other way (`python -m olingo.cli.main`, `main()` from Python); under `torchrun`, the `torchrun`
  beside this python (else `<this python> -m torch.distributed.run`) with the same number of
  processes per node (`.../torchrun --nproc_per_node N -m olingo.cli.main ...`).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

_OWN_PACKAGES = ("olingo",)  # installed with the command itself


def _real(path: str | Path) -> str:
    return os.path.realpath(os.path.abspath(path))


def environment_path_entries(environ: Mapping[str, str] | None = None) -> list[str]:
    """`sys.path` entries that this process has only because of how it was started: the
    `PYTHONPATH` entries, and the working directory when `python -m`/`-c` put it first
    (the `olingo` command itself never has it). Real absolute paths, in search order."""
    environ = os.environ if environ is None else environ
    entries = [_real(p or ".") for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if sys.path and sys.path[0] in ("", os.getcwd()):
        entries.append(_real(os.getcwd()))
    return list(dict.fromkeys(entries))


def import_root(name: str, module: ModuleType) -> str | None:
    """The `sys.path` entry module `name` was found under (its file, less the dotted path),
    or None for modules without a file (built-ins, namespace packages)."""
    file = getattr(module, "__file__", None)
    if not file:
        return None
    parts = name.split(".")
    root = Path(file).parent
    if Path(file).stem == "__init__":
        root = root.parent
    for _ in parts[1:]:
        root = root.parent
    return _real(root)


def user_module_roots(modules: Mapping[str, ModuleType | None] | None = None, environ: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """`{directory: [modules imported from it]}` for the loaded modules that only the
    environment (`environment_path_entries`) made importable, in search-path order."""
    modules = sys.modules if modules is None else modules
    entries = environment_path_entries(environ)
    found: dict[str, list[str]] = {}
    for name, module in list(modules.items()):
        if module is None or name.startswith("__") or name.split(".")[0] in _OWN_PACKAGES:
            continue
        root = import_root(name, module)
        if root in entries:
            found.setdefault(root, []).append(name)
    return {root: sorted(found[root]) for root in entries if root in found}


def environment_needs(environ: Mapping[str, str] | None = None, modules: Mapping[str, ModuleType | None] | None = None) -> dict[str, str]:
    """The variables the resume command must set: `PYTHONPATH` (see `user_module_roots`) and
    `OLINGO_HOME` when the run had it."""
    environ = os.environ if environ is None else environ
    needs: dict[str, str] = {}
    roots = user_module_roots(modules, environ)
    if roots:
        needs["PYTHONPATH"] = os.pathsep.join(roots)
    if environ.get("OLINGO_HOME"):
        needs["OLINGO_HOME"] = _real(os.path.expanduser(environ["OLINGO_HOME"]))
    return needs


def olingo_command() -> list[str]:
    """The program that starts olingo again, spelt so that it runs as printed, from a shell
    where the virtual environment is not active: the `olingo` script this process runs, by its
    absolute path; else (`python -m olingo.cli.main`, `main()` called from Python) this
    interpreter with `-m olingo.cli.main`."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.name == "olingo" and script.is_file():
        return [os.path.abspath(script)]
    return [sys.executable, "-m", "olingo.cli.main"]


def torchrun_command() -> list[str]:
    """`torchrun` as it runs without the virtual environment active: the script beside this
    interpreter, else the interpreter running its module."""
    script = Path(sys.executable).parent / "torchrun"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "torch.distributed.run"]


def _launcher(environ: Mapping[str, str]) -> tuple[list[str], str]:
    """The program part of the command and a note for several nodes: `olingo_command()`, or
    under torchrun (WORLD_SIZE > 1) `torchrun_command()` with the run's processes per node."""
    world = int(environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return olingo_command(), ""
    local = int(environ.get("LOCAL_WORLD_SIZE", str(world)) or world)
    nodes = max(1, world // max(local, 1))
    launcher = [*torchrun_command(), *(["--nnodes", str(nodes)] if nodes > 1 else []), "--nproc_per_node", str(local), "-m", "olingo.cli.main"]
    note = f" (on each of the {nodes} nodes, with the rendezvous options the run was started with)" if nodes > 1 else ""
    return launcher, note


def resume_command(argv: Sequence[str], environ: Mapping[str, str] | None = None, modules: Mapping[str, ModuleType | None] | None = None) -> str:
    """`cd <dir> && [VAR=value ...] <olingo_command()> <argv less run.resume=...> run.resume=last`,
    quoted for a POSIX shell. `argv` is the command's arguments (`sys.argv[1:]`: subcommand first)."""
    environ = os.environ if environ is None else environ
    args = [a for a in argv if not a.startswith("run.resume=")]
    launcher, note = _launcher(environ)
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in environment_needs(environ, modules).items())
    command = shlex.join([*launcher, *args, "run.resume=last"])
    return f"cd {shlex.quote(os.getcwd())} && {env + ' ' if env else ''}{command}{note}"
