"""The harness that runs inside the sandbox (kvbench.graders.sandbox), before the model's code.

The boundary is the operating system's (bubblewrap's namespaces, rlimits, a read-only root); this file
adds defence in depth and the one trusted channel:

- an audit hook against new processes, sockets, native libraries and introspection of the collector,
  registered without leaving a reference anywhere the program can reach (no module global, no local);
- functional problems: the harness reads the request, forks a worker and makes itself non-dumpable (so
  the worker can neither ptrace it nor open its /proc/PID/fd). The worker closes the result channel
  before it runs any model code, calls Solution().FUNCTION(*args) and sends the JSON of the value on a
  private pipe; the harness forwards at most a capped number of bytes on the result channel. The
  program's stdout is never read as protocol data, and no secret lives in any frame.

Usage: python -I -S sandbox_child.py stdin CODE_FILE
       python -I -S sandbox_child.py call CODE_FILE FUNCTION RESULT_FD
"""

import json
import os
import sys

RESULT_CAP = 8 << 20


def _guard_factory():
    blocked = frozenset(
        {
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
            "pty.spawn",
            "gc.get_objects",
            "gc.get_referrers",
            "gc.get_referents",
            "sys.addaudithook",
        }
    )
    modules = frozenset({"_posixsubprocess", "_ctypes", "ctypes", "_socket", "socket"})

    def guard(event, args):
        if event in blocked:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args and str(args[0]) in modules:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")

    return guard


def _non_dumpable():
    """PR_SET_DUMPABLE 0: processes of the same user can neither ptrace this one nor open its fds."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)


def _run(code_file):
    with open(code_file) as handle:
        source = handle.read()
    namespace = {"__name__": "__main__"}
    exec(compile(source, "solution.py", "exec"), namespace)
    return namespace


def _worker(code_file, function, args, pipe):
    sys.stdin = open(os.devnull)  # noqa: SIM115 - stays open for the code's whole life
    sys.addaudithook(_guard_factory())
    namespace = _run(code_file)
    value = getattr(namespace["Solution"](), function)(*args)
    if isinstance(value, tuple):
        value = list(value)
    os.write(pipe, json.dumps(value).encode())


def _call(code_file, function, result_fd):
    request = json.loads(sys.stdin.readline())
    read, write = os.pipe()
    _non_dumpable()
    pid = os.fork()
    if pid == 0:
        os.close(result_fd)
        os.close(read)
        try:
            _worker(code_file, function, request["args"], write)
        except BaseException as exc:  # the program's failure: report it as the program would
            import traceback

            traceback.print_exception(exc)
            os._exit(1)
        os._exit(0)
    os.close(write)
    received = bytearray()
    while len(received) <= RESULT_CAP:
        chunk = os.read(read, 1 << 16)
        if not chunk:
            break
        received += chunk
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code == 0 and len(received) <= RESULT_CAP:
        os.write(result_fd, bytes(received))
    os.close(result_fd)
    sys.stdout.flush()
    os._exit(code if code >= 0 else 128 - code)


def main():
    mode, code_file = sys.argv[1], sys.argv[2]
    if mode == "call":
        _call(code_file, sys.argv[3], int(sys.argv[4]))
    sys.addaudithook(_guard_factory())
    _run(code_file)


main()
