"""What the learner's process may open and start while its file is graded.

Two layers, both set up in the learner's process before its file is imported (serve_calls.run_file):

- Landlock (Linux 5.13+, unprivileged): the kernel itself refuses to open anything under
  drills/solutions, drills/mutants or .git, whatever call opens it (open, os.open with dir_fd, libc
  through ctypes, a program started from the process), and the process may neither signal nor trace
  a process outside its sandbox (the grader, the command that reads the result). The rest of the
  repository, the Python installation and the home folder are read-only to it, the graded file's own
  folder and the compilers' caches aside: a file that rewrote the graders, the harness or the course's
  records, or left a `.pth` file in site-packages, would pass every grading after its own. Everywhere
  else (/tmp among them) it may write into files that exist (/dev/null, a GPU's device files, the
  sparse files the grader lends) but create, remove or rename nothing: a file that saved what it saw
  while graded, or left an answer for a later run, has nowhere to put it. Its temporary files go to a
  folder of its own inside the caches (TMPDIR), removed when it exits; /dev stays writable (a GPU's
  driver and torch's shared memory). Landlock grants rather than denies, so the rules allow every other
  entry of each folder on the way down to those folders.
- An audit hook (any Python): refuses Python-level opens and imports of the references, copies and
  links of them, writes into those read-only trees outside the writable folders, creating, removing or
  renaming anything outside the writable folders, and starting programs unless Triton's own compiler
  code is the caller.

`make doctor` prints `status()`: which of the two is in force on this machine.

The learner's modules (drills/mine, the graded file's folder) are compiled from their .py in its
process, never loaded from bytecode (`import_from_source`), and what a grading leaves in the learner's
folder is moved out when its process stops (grader/left_files.py).
"""

from __future__ import annotations

import ctypes
import os
import sys

from drills.lessons import ROOT

# Landlock's constants (include/uapi/linux/landlock.h); its syscall numbers are the same on every
# architecture that has them.
_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_FILE_RIGHTS = (1 << 0) | (1 << 1) | (1 << 2)  # execute, write, read: what a rule on a file may grant
_READ_RIGHTS = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read a file, read a folder: the repository's
_WRITE_EXISTING = (1 << 1) | (1 << 14)  # write and truncate a file that exists; make, remove, rename none
_SCOPE_SIGNAL = 1 << 1


def protected() -> list[str]:
    """The folders the learner's process may not open."""
    return [
        os.path.join(ROOT, "drills", "solutions"),
        os.path.join(ROOT, "drills", "mutants"),
        os.path.join(ROOT, ".git"),
    ]


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where it has none (not Linux, too old, or disabled)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        abi = _libc().syscall(
            _CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
        )
    except (OSError, AttributeError):
        return 0
    return max(0, int(abi))


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # ABI 1: execute ... make_sym
    if abi >= 2:
        rights |= 1 << 13  # refer: links and renames across folders
    if abi >= 3:
        rights |= 1 << 14  # truncate
    return rights


def read_only() -> list[str]:
    """The trees the learner's process may read but not write: the repository (a file that rewrote the
    graders or the harness would pass every grading after its own), the Python installation and the
    home folder (a `.pth` file in site-packages, or a shell's start-up file, runs code in every later
    grading), writable() aside."""
    import site

    home = os.path.expanduser("~")
    trees = [ROOT, sys.prefix, sys.base_prefix, sys.exec_prefix, site.getuserbase(), home]
    try:
        trees += site.getsitepackages()
    except AttributeError:  # an old virtualenv's site module
        pass
    real = sorted({os.path.realpath(t) for t in trees if t and os.path.isdir(t)})
    return [t for t in real if t != os.sep]  # never the whole file system


def _caches() -> list[str]:
    """Where Triton, torch and CUDA keep their caches (the learner's process compiles kernels)."""
    home = os.path.expanduser("~")
    triton_home = os.environ.get("TRITON_HOME") or home
    return [
        os.environ.get("TRITON_CACHE_DIR") or os.path.join(triton_home, ".triton"),
        os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"),
        os.path.join(home, ".nv"),
    ]


_PRIVATE_TEMP: list[str] = []  # this process's temporary folder, once private_temp() made it
_TEMP_PREFIX = "drills-learner-tmp-"  # then the pid of the process it belongs to


def _remove_stale_temps(cache: str) -> None:
    """Remove the temporary folders of learner processes that are gone: the grader stops a process by a
    signal, so its own removal at exit does not always run."""
    import shutil

    for name in os.listdir(cache):
        if not name.startswith(_TEMP_PREFIX):
            continue
        pid = name[len(_TEMP_PREFIX) :].split("-", 1)[0]
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(cache, name), ignore_errors=True)
        except (ValueError, OSError):  # not a pid, or a process of another user's: left alone
            pass


def private_temp() -> str | None:
    """The learner's process's own temporary folder, inside the first cache that can hold it (never
    /tmp, where it may create nothing): made once, named by TMPDIR and tempfile's default from then on
    (Triton's builds and ptxas write there on a GPU), removed when the process exits. None where no
    cache folder can be made."""
    import atexit
    import shutil
    import tempfile

    if not _PRIVATE_TEMP:
        for cache in _caches():
            try:
                os.makedirs(cache, exist_ok=True)
                _remove_stale_temps(cache)
                folder = tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", dir=cache)
            except OSError:
                continue
            atexit.register(shutil.rmtree, folder, True)
            os.environ["TMPDIR"] = tempfile.tempdir = folder
            _PRIVATE_TEMP.append(folder)
            break
    return _PRIVATE_TEMP[0] if _PRIVATE_TEMP else None


def writable(graded_file: str) -> list[str]:
    """The folders the learner's process may write, create and remove in: its file's own folder
    (drills/mine for make test), where a learner may keep notes or debug output, the compilers' caches
    (made here if missing: a Landlock rule needs the folder to exist), and its own temporary folder
    (private_temp) inside them."""
    folders = [os.path.dirname(os.path.realpath(graded_file))]
    for cache in _caches():
        try:
            os.makedirs(cache, exist_ok=True)
            folders.append(cache)
        except OSError:
            pass
    temp = private_temp()
    if temp is not None:
        folders.append(temp)
    return sorted({os.path.realpath(f) for f in folders})


def _inside(path: str, trees: list[str]) -> bool:
    return any(path == t or path.startswith(t + os.sep) for t in trees)


# Outside the read-only trees, the folder whose entries stay fully writable: device files and the shared
# memory a GPU's driver and torch make there.
DEVICES = "/dev"


def _allowed_entries(
    targets: list[str], writable: list[str] = (), trees: list[str] | None = None
) -> list[tuple[str, str]]:
    """Every path to allow, and what to allow there ("all", "existing": read and write into files that
    exist, "read"), so that all is reachable except the targets, the read-only trees (read_only(): the
    repository, the Python installation, the home folder) may be read but not written, and nothing
    outside them may be created, removed or renamed, but for the writable folders (and /dev): the
    siblings of each folder on the way from / down to a target, a writable folder or a read-only tree
    ("existing" outside those trees, "read" inside them), the writable folders, the read-only trees that
    hold neither, and none of the folders on those ways themselves."""
    trees = [os.path.realpath(t) for t in (read_only() if trees is None else trees)]
    targets = [os.path.realpath(t) for t in targets]
    writable = [os.path.realpath(w) for w in writable]
    on_the_way = set()
    for t in targets + writable + trees:
        p = t
        while True:
            on_the_way.add(p)
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
    allowed = [(w, "all") for w in writable]
    # A read-only tree with no target and no writable folder inside is one rule; the others are split.
    holders = {p for t in targets + writable for p in on_the_way if t == p or t.startswith(p + os.sep)}
    for tree in trees:
        if tree not in holders and not any(_inside(tree, [w]) for w in writable):
            allowed.append((tree, "read"))
    for folder in sorted(
        p
        for p in on_the_way
        if p not in targets and p not in writable and (p in holders or p not in trees) and os.path.isdir(p)
    ):
        if folder in trees and folder not in holders:
            continue
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if path not in on_the_way:
                outside = "all" if _inside(path, [DEVICES]) else "existing"
                allowed.append((path, "read" if _inside(path, trees) else outside))
    return allowed


def apply_landlock(targets: list[str] | None = None, graded_file: str | None = None) -> str | None:
    """Sandbox this process and its future children; None when in force, else why not. graded_file:
    its folder stays writable (writable())."""
    abi = landlock_abi()
    if abi < 1:
        return "Landlock is not available in this kernel (Linux 5.13+ with Landlock enabled)"
    libc = _libc()
    rights = _fs_rights(abi)
    attr = _RulesetAttr(rights, 0, _SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else 8 if abi < 4 else 16
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"Landlock refused a ruleset: {os.strerror(ctypes.get_errno())}"
    try:
        for path, writes in _allowed_entries(
            targets or protected(), writable(graded_file) if graded_file else []
        ):
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # a dangling link, or gone since the listing
            try:
                is_dir = (
                    os.path.isdir(f"/proc/self/fd/{fd}")
                    if os.path.exists("/proc/self/fd")
                    else os.path.isdir(path)
                )
                granted = (
                    rights
                    & {
                        "all": rights,
                        "existing": _READ_RIGHTS | _WRITE_EXISTING,
                        "read": _READ_RIGHTS,
                    }[writes]
                )
                rule = _PathBeneath(granted if is_dir else granted & _FILE_RIGHTS | (granted & (1 << 14)), fd)
                libc.syscall(
                    _ADD_RULE,
                    ctypes.c_int(ruleset),
                    ctypes.c_int(_RULE_PATH_BENEATH),
                    ctypes.byref(rule),
                    ctypes.c_uint32(0),
                )
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), 0, 0, 0) != 0:
            return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
        if libc.syscall(_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            return f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}"
    finally:
        os.close(ruleset)
    return None


def status() -> str:
    """One line for make doctor: which sandbox the learner's process runs in here."""
    abi = landlock_abi()
    names = "drills/solutions, drills/mutants and .git"
    if abi >= 1:
        return (
            f"Landlock (ABI {abi}) and the audit hook: your file's process cannot open {names} by any call, "
            "nor write into the repository, the Python installation or the home folder, nor create files "
            "anywhere, outside your file's folder and the compilers' caches"
        )
    return (
        f"the audit hook only (no Landlock in this kernel): Python-level opens of {names}, writes into "
        "the repository, the Python installation or the home folder, and files created anywhere, outside "
        "your file's folder and the compilers' caches, are refused"
    )


# --- Memory ----------------------------------------------------------------------------------------
# A file that allocates without bound (a list of 1 GiB tensors) would fill the machine's memory on every
# check until the kernel's out-of-memory killer picks a process, the grader's or another program's as
# likely as its own, and every check would wait for it. Under the interpreter the learner's process gets
# a share of the memory: an allocation past it fails at once, with torch's "can't allocate memory" at
# the learner's line. The graders' own cases fit in a few hundred MiB; their largest tensors are sparse
# files (drills/grading/shared/bigmem.py), shared mappings that the limit does not count.
MEMORY_SHARE = 4  # the learner's process may hold a quarter of the machine's memory
MEMORY_FLOOR = 4 << 30  # and never less than 4 GiB


def memory_limit() -> int | None:
    """The bytes of private memory (RLIMIT_DATA: heap and private mappings) the learner's process may
    hold, None where it cannot be told."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return max(MEMORY_FLOOR, total // MEMORY_SHARE)


def limit_memory() -> str | None:
    """Cap this process's private memory (memory_limit); None when in force, else why not. Only under
    Triton's interpreter: a GPU's driver maps memory of its own, which no share of the host's bounds."""
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return "not under the interpreter"
    try:
        import resource
    except ImportError:
        return "no resource module on this platform"
    limit = memory_limit()
    if limit is None:
        return "the machine's memory is unknown"
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    if soft != resource.RLIM_INFINITY and soft <= limit:
        return None  # already tighter
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ValueError, OSError) as err:
        return f"setrlimit refused: {err}"
    return None


# --- The audit hook --------------------------------------------------------------------------------

_TRUSTED_CODE: set = (
    set()
)  # code objects of Triton's and torch's own functions, gathered before the learner's file


def trust_loaded_code() -> None:
    """Remember the code objects of every function of the Triton and torch modules loaded now (and of
    the Triton modules that start programs, imported here first): "started by Triton" is then judged
    by the identity of the running code, which a learner's file cannot forge, not by a file name."""
    import importlib
    import types

    for name in (
        "triton.runtime.build",
        "triton.backends.nvidia.compiler",
        "triton.backends.amd.compiler",
        "triton.compiler.compiler",
        "torch.utils.cpp_extension",
    ):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a backend this build does not have
            pass

    def add(code):
        if code in _TRUSTED_CODE:
            return
        _TRUSTED_CODE.add(code)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                add(const)

    def visit(obj, depth=0):
        if isinstance(obj, types.FunctionType):
            add(obj.__code__)
        elif isinstance(obj, (staticmethod, classmethod)):
            visit(obj.__func__, depth)
        elif isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    visit(f, depth)
        elif isinstance(obj, type) and depth < 3:
            for value in list(vars(obj).values()):
                visit(value, depth + 1)

    for name, module in list(sys.modules.items()):
        if module is None or not (
            name == "triton"
            or name.startswith(("triton.", "torch.utils.cpp_extension", "torch._inductor.cpp_builder"))
        ):
            continue
        for value in list(vars(module).values()):
            if getattr(value, "__module__", None) == name or isinstance(value, types.FunctionType):
                visit(value)


def started_by_triton() -> bool:
    """True when a frame on the stack runs one of Triton's (or torch's build helpers') own functions."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code in _TRUSTED_CODE:
            return True
        frame = frame.f_back
    return False


def _real_path(path) -> str:
    """The resolved path an audit event names, or "" for a file descriptor or anything unreadable."""
    try:
        return os.path.realpath(os.fsdecode(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
    except Exception:  # noqa: BLE001 - an argument no path can be made of
        return ""


def protect(graded_file: str) -> None:
    """The audit hook: refuse the references and starting programs (see the module docstring)."""
    solutions = os.path.join(ROOT, "drills", "solutions") + os.sep
    mutants = os.path.join(ROOT, "drills", "mutants") + os.sep
    graded = os.path.realpath(graded_file)

    def forbidden_path(path) -> bool:
        real = _real_path(path)
        if not real or real == graded:
            return False
        parts = real.split(os.sep)
        return (
            real.startswith((solutions, mutants))
            or ".git" in parts
            or (os.sep + os.path.join("drills", "solutions") + os.sep) in real
        )

    # Files are also known by inode, so a hard link to a reference file is refused like the file itself.
    inodes = set()
    for folder in (solutions, mutants):
        for dirpath, _, files in os.walk(folder):
            for name in files:
                try:
                    st = os.stat(os.path.join(dirpath, name))
                    inodes.add((st.st_dev, st.st_ino))
                except OSError:
                    pass

    def same_file(path) -> bool:
        try:
            st = os.stat(path) if isinstance(path, (str, bytes, os.PathLike)) else None
        except (OSError, ValueError):
            return False
        return st is not None and (st.st_dev, st.st_ino) in inodes

    trees, own = read_only(), writable(graded_file)
    # The files of the graded file's own folder when the grading starts (the other lessons' files in
    # drills/mine, the graded file itself): the folder is writable for what a grading makes there (moved
    # out afterwards), not for what was there. Rewritten through a library that writes files (Triton's
    # cache manager puts a file anywhere by an absolute name), another lesson's file, or this one after
    # its check, would be graded, or lost, as the learner never wrote it.
    folder = os.path.dirname(graded)
    try:
        there = {os.path.realpath(os.path.join(folder, name)) for name in os.listdir(folder)}
    except OSError:
        there = set()
    there = {path for path in there if os.path.isfile(path)}

    def was_there(path) -> bool:
        real = _real_path(path)
        return bool(real) and real in there

    changes = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod", "os.symlink")

    def in_repository(path) -> bool:
        """A path inside a read-only tree (the repository, the Python installation, the home folder)
        and outside the folders the process may write."""
        real = _real_path(path)
        return bool(real) and _inside(real, trees) and not _inside(real, own)

    def elsewhere(path) -> bool:
        """A path outside the writable folders and /dev (where nothing may be created or removed)."""
        real = _real_path(path)
        return bool(real) and not _inside(real, own + [DEVICES])

    def creates(path) -> bool:
        """Opening `path` for writing would make a file outside the writable folders and /dev."""
        if not elsewhere(path):
            return False
        try:
            return not os.path.exists(path)
        except (TypeError, ValueError):
            return False

    def writes(args) -> bool:
        mode = args[1] if len(args) > 1 else None
        flags = args[2] if len(args) > 2 else 0
        if isinstance(mode, str) and any(c in mode for c in "wax+"):
            return True
        return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))

    starts = (
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
    )

    def hook(event, args):
        if (
            event in ("os.link", "os.symlink", "shutil.copyfile", "shutil.copymode", "shutil.copystat")
            and args
            and (forbidden_path(args[0]) or same_file(args[0]))
        ):
            raise PermissionError(
                f"grading: your file may not copy or link {args[0]} (the reference solutions "
                "are off limits while your file is graded)"
            )
        if event == "open" and args and (forbidden_path(args[0]) or same_file(args[0])):
            raise PermissionError(
                f"grading: your file may not read {args[0]} (the reference solutions "
                "and the repository's history are off limits while your file is graded)"
            )
        changed = args[:2] if event == "os.rename" else args[1:2] if event == "os.symlink" else args[:1]
        if (event == "open" and args and writes(args) and was_there(args[0])) or (
            event in changes and any(was_there(a) for a in changed if not isinstance(a, int))
        ):
            raise PermissionError(
                f"grading: your file may not change {changed[-1] if event in changes else args[0]} (the files "
                "that were in your file's folder when the grading started, other lessons' files and your "
                "own among them, are read-only while your file is graded)"
            )
        if (event == "open" and args and writes(args) and in_repository(args[0])) or (
            event in changes and any(in_repository(a) for a in changed if not isinstance(a, int))
        ):
            raise PermissionError(
                f"grading: your file may not write {changed[-1] if event in changes else args[0]} (the "
                "repository, the Python installation and the home folder are read-only while your file "
                "is graded, but for your file's own folder and the compilers' caches)"
            )
        if (event == "open" and args and writes(args) and creates(args[0])) or (
            event in changes and any(elsewhere(a) for a in changed if not isinstance(a, int))
        ):
            raise PermissionError(
                f"grading: your file may not create or change {changed[-1] if event in changes else args[0]} "
                "(files may be made only in your file's own folder and the compilers' caches while your "
                "file is graded: a launcher reads and writes tensors, not files)"
            )
        if (
            event == "import"
            and args
            and isinstance(args[0], str)
            and args[0].startswith(("drills.solutions", "drills.mutants"))
        ):
            raise ImportError(
                f"grading: your file may not import {args[0]}: the reference solutions are "
                "off limits while your file is graded"
            )
        if event in starts and not started_by_triton():
            raise PermissionError(f"grading: your file may not start programs ({event})")

    sys.addaudithook(hook)


# --- learner code comes from its source, never from bytecode ------------------------------------------
# The source check reads a .py; Python would run a .pyc beside it instead where one is there (an
# unchecked hash-based .pyc is never compared with its source), or a lone .pyc, or a compiled module.
# So in the learner's process every module of the learner's folders is compiled from its .py, and
# nothing else of those folders is loaded.


def learner_folders(graded_file: str) -> list[str]:
    """The folders whose modules are the learner's: drills/mine and the graded file's own folder."""
    mine = os.path.realpath(os.path.join(ROOT, "drills", "mine"))
    return sorted({mine, os.path.dirname(os.path.realpath(graded_file))})


def _source_only_loader():
    import importlib.machinery

    class SourceOnlyLoader(importlib.machinery.SourceFileLoader):
        """Compiles the module from its .py every time: a __pycache__ file is neither read nor written."""

        def get_code(self, fullname):
            return self.source_to_code(self.get_data(self.path), self.path)

    return SourceOnlyLoader


def import_from_source(folders: list[str]) -> None:
    """From now on, in this process, a module found in `folders` is compiled from its .py (no bytecode
    is read or written); one there that is not a .py (a .pyc alone, a compiled extension) is refused."""
    import importlib.machinery

    sys.dont_write_bytecode = True
    loader = _source_only_loader()
    real = [os.path.realpath(f) for f in folders]

    class SourceOnlyFinder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            origin = getattr(spec, "origin", None)
            if not origin or not _inside(os.path.realpath(origin), real):
                return None  # not the learner's: the usual finders
            if not origin.endswith(".py"):
                raise ImportError(
                    f"grading: {os.path.relpath(origin, ROOT)} is not Python source; only .py files of your "
                    "folder are imported while your file is graded"
                )
            spec.loader = loader(name, origin)
            spec.cached = None
            return spec

        @staticmethod
        def invalidate_caches():
            pass

    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", "") != "SourceOnlyFinder"]
    sys.meta_path.insert(0, SourceOnlyFinder)


def load_from_source(path: str, name: str):
    """The learner's file imported as module `name`, compiled from its source (stubs.load_from_file
    would take a .pyc of it from __pycache__)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path, loader=_source_only_loader()(name, path))
    spec.cached = None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # triton.jit looks the module up while decorating
    spec.loader.exec_module(module)
    return module
