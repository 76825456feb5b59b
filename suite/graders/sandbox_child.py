"""Runs inside the sandbox's child process, before the model's code: the in-process guard.

Installed as a permanent audit hook (sys.addaudithook; the guarded code cannot remove it): no new
processes, no sockets, no native libraries, no writes outside the scratch folder, no reading other
processes' /proc entries (the grader's environment among them). Resource limits
(CPU, memory, file size, open files) are set by the parent before this runs; the network is also cut
by a fresh network namespace where the machine allows one.

Usage: python -I -S sandbox_child.py MODE CODE_FILE [FUNCTION]
  MODE stdin: run the code as a program reading stdin;
  MODE call: read one JSON line {"nonce", "args"} from stdin, run the code, call Solution().FUNCTION(*args),
  print nonce + JSON result (the nonce proves the harness, not the code, wrote the result).
"""

import json
import os
import sys

_SCRATCH = os.path.realpath(os.getcwd())
_BLOCKED = {
    "os.fork",
    "os.forkpty",
    "os.posix_spawn",
    "os.spawn",
    "os.exec",
    "os.system",
    "os.kill",
    "os.killpg",
    "subprocess.Popen",
    "socket.__new__",
    "socket.connect",
    "socket.bind",
    "ctypes.dlopen",
    "ctypes.cdata",
    "os.chdir",
    "os.setuid",
    "pty.spawn",
}
_WRITE_EVENTS = {
    "os.remove",
    "os.rename",
    "os.mkdir",
    "os.rmdir",
    "os.chmod",
    "os.symlink",
    "os.link",
    "shutil.rmtree",
    "os.truncate",
    "os.utime",
}


def _inside(path) -> bool:
    try:
        real = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return real == _SCRATCH or real.startswith(_SCRATCH + os.sep)


def _own_proc(path) -> bool:
    text = os.fsdecode(path)
    return text.startswith(("/proc/self/", f"/proc/{os.getpid()}/"))


def _guard(event: str, args: tuple) -> None:
    if event in _BLOCKED:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and len(args) >= 3:
        path, mode, flags = args[0], args[1], args[2]
        if isinstance(path, (str, bytes)) and os.fsdecode(path).startswith("/proc/") and not _own_proc(path):
            raise PermissionError("sandbox: other processes' /proc entries are not readable")
        writing = (mode and any(c in str(mode) for c in "wax+")) or (flags or 0) & (os.O_WRONLY | os.O_RDWR)
        if writing and isinstance(path, (str, bytes, os.PathLike)) and not _inside(path):
            raise PermissionError(f"sandbox: writing outside the working folder ({path!r})")
    if event in _WRITE_EVENTS and args and not _inside(args[0]):
        raise PermissionError(f"sandbox: {event} outside the working folder")


def main() -> None:
    mode, code_file = sys.argv[1], sys.argv[2]
    with open(code_file) as handle:
        source = handle.read()
    request = json.loads(sys.stdin.readline()) if mode == "call" else None
    if request is not None:
        sys.stdin = open(os.devnull)  # noqa: SIM115 - stays open for the code's whole life
    sys.addaudithook(_guard)
    namespace = {"__name__": "__main__"}
    compiled = compile(source, "solution.py", "exec")
    exec(compiled, namespace)
    if request is not None:
        method = getattr(namespace["Solution"](), sys.argv[3])
        result = method(*request["args"])
        if isinstance(result, tuple):
            result = list(result)
        sys.__stdout__.write(request["nonce"] + json.dumps(result) + "\n")
        sys.__stdout__.flush()


main()
