"""raytf's fork server: a node's CPU workers forked from one process that has TensorFlow loaded.

A raytf worker is a Ray actor, and Ray starts each actor in a process of its own, which then
imports TensorFlow (and Keras, NumPy, pandas with it): some two CPU-seconds on a machine of the
kind this project is tested on, paid by every worker at every start and every restart, eight
times over where eight workers share a node. Most of what the worker process then does is that
import. So raytf starts a CPU worker through Ray's ``py_executable`` runtime environment field
(``TensorflowConfig.start_method``, driver/forkserver.py), with this module as the command:

- **the client** (``python -m raytf_forkserver <Ray's worker command>``), the process Ray starts,
  asks the node's fork server for a worker and stands in for it: it exits as the worker exits,
  with its status, and a SIGTERM or SIGINT it receives goes to the worker. Where there is no
  server it starts one. Where none can run (no ``os.pidfd_open``, the server's folder not private,
  a server that failed to start) it runs Ray's worker command itself: the worker starts cold, as
  with ``start_method="spawn"``.
- **the server** (``--serve``) imports TensorFlow once, then forks a child per request. The child
  takes the client's standard streams, environment, working directory and umask, starts a
  session of its own, and runs Ray's worker script as the process Ray started would have. Ray
  knows a worker by the process id it registers with, so the child is the worker: Ray's kills,
  its process title and its logs are the child's.

One server per raylet (the client's parent) and per environment: the client's whole environment
(the run's TensorFlow settings among it, TF_USE_LEGACY_KERAS and the log level, which TensorFlow
reads when imported), its working directory and umask pick the server, so a child differs from a
cold worker only in what was loaded before its environment was the worker's, and that was loaded
under the same environment. A server ends with its raylet, or when it has had no child for
``IDLE_EXIT_S``. After a fork the child reseeds NumPy's global generator (Python's ``random``
reseeds itself), so workers draw different numbers, as cold ones do.

Requests come only from processes of the server's own user: its socket lies in a folder only that
user may open (checked, not assumed), and the server checks each caller's credentials. They are
JSON, never pickles.

This module is outside the ``raytf`` package on purpose: the client runs once per worker start
and imports only the standard library, not raytf's package (which imports pyarrow).
"""

from __future__ import annotations

import array
import fcntl
import hashlib
import json
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import time

# The variable a forked worker finds set to its server's process id (raytf's worker reads it: a
# worker whose TensorFlow its server loaded under the run's environment).
FORKED_FROM = "RAYTF_FORKSERVER"
# What a server imports before it serves: comma-separated modules (raytf's tests name lighter ones).
# TensorFlow (with Keras, NumPy, pandas), then Ray and raytf's worker, as every worker imports
# them. Not Ray Data: on Ray 2.50 a worker forked from a process that had imported it died at its
# actor's creation (its core worker's check "current_actor_id_ == actor_id" failed); a worker
# imports it where its run has a dataset.
PRELOAD = "RAYTF_FORKSERVER_PRELOAD"
DEFAULT_PRELOAD = "tensorflow,ray,raytf._internal.worker.actor"
# The folder of the servers' sockets, locks and logs; default ``$TMPDIR/raytf-forkserver-<uid>``.
FOLDER = "RAYTF_FORKSERVER_DIR"

IDLE_EXIT_S = 600.0  # a server with no child for this long ends
START_TIMEOUT_S = 120.0  # how long a client waits for a server it started to listen
_MAX_SOCKET_PATH = 100  # AF_UNIX paths hold 107 bytes on Linux
_REQUEST_LIMIT = 16 << 20
_STREAMS = 3  # stdin, stdout, stderr: handed to the worker


class Unavailable(Exception):
    """No fork server can serve this client: it runs the worker itself."""


def folder() -> str:
    """The private folder of this user's servers, made if missing; Unavailable if it is not private."""
    path = os.environ.get(FOLDER) or os.path.join(os.environ.get("TMPDIR") or "/tmp", f"raytf-forkserver-{os.getuid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError as error:
        raise Unavailable(f"cannot make its folder {path}: {error}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise Unavailable(f"its folder {path} is not a folder of this user's that only this user may open")
    return path


def server_key(env: dict[str, str], cwd: str, umask: int, parent: int) -> str:
    """What picks a server: the interpreter, the raylet, the working directory, umask and
    environment, and the installed files of what the server preloads and of this module (a server
    started before an upgrade serves no worker after it)."""
    material = json.dumps([sys.executable, parent, cwd, umask, sorted(env.items()), _installed(env)])
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def _installed(env: dict[str, str]) -> list:
    """Each preloaded package's file, and this module's, with its modification time."""
    import importlib.util

    files = [__file__]
    for top in dict.fromkeys(name.strip().split(".")[0] for name in env.get(PRELOAD, DEFAULT_PRELOAD).split(",")):
        try:
            spec = importlib.util.find_spec(top) if top else None
        except (ImportError, ValueError):
            spec = None
        files.append(spec.origin if spec is not None and spec.origin else top)
    stamps = []
    for path in files:
        try:
            stamps.append([path, os.stat(path).st_mtime_ns])
        except OSError:  # not installed: the server will say so when it imports it
            stamps.append([path, None])
    return stamps


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# The client: the process Ray starts


def main(argv: list[str]) -> None:
    """``python -m raytf_forkserver <Ray's worker command>``, or ``--serve <socket> <parent pid>``."""
    if argv[:1] == ["--serve"]:
        serve(argv[1], int(argv[2]))
        return
    if not argv:
        sys.exit("usage: python -m raytf_forkserver <worker script> [arguments]")
    try:
        connection, pid = _request(argv)
    except Unavailable as why:
        print(f"raytf forkserver: {why}; this worker starts cold", file=sys.stderr, flush=True)
        run_cold(argv)
    stand_in(connection, pid)


def run_cold(argv: list[str]) -> None:
    """Become Ray's worker command itself, as Ray would have run it."""
    os.execv(sys.executable, [sys.executable, *argv])


def _request(argv: list[str]) -> tuple[socket.socket, int]:
    """Ask the node's server (started if need be) for a worker running ``argv``: the connection
    the worker's end comes on, and the worker's process id."""
    if not hasattr(os, "pidfd_open"):
        raise Unavailable("os.pidfd_open is missing (Linux 5.3 and Python 3.9 or later)")
    env, cwd, umask, parent = dict(os.environ), os.getcwd(), _current_umask(), os.getppid()
    key = server_key(env, cwd, umask, parent)
    base = folder()
    path = os.path.join(base, key + ".sock")
    if len(path.encode()) > _MAX_SOCKET_PATH:
        raise Unavailable(f"its socket's path {path} is too long; set {FOLDER} to a shorter folder")
    request = json.dumps({"argv": argv, "env": env, "cwd": cwd, "umask": umask}).encode()
    for _ in range(2):  # a server that ended between our connect and its answer: start another once
        connection = _connect_or_start(base, key, path, parent)
        try:
            connection.sendmsg(
                [struct.pack("!I", len(request))],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", range(_STREAMS)))],
            )
            connection.sendall(request)
            line = connection.makefile("rb").readline()
        except OSError:
            line = b""
        if line:
            answer = json.loads(line)
            if "pid" in answer:
                return connection, int(answer["pid"])
            raise Unavailable(f"its server refused: {answer.get('error')}")
        connection.close()
    raise Unavailable("its server closed the connection twice before answering")


def _connect(path: str) -> socket.socket:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError:
        connection.close()
        raise
    return connection


def _connect_or_start(base: str, key: str, path: str, parent: int) -> socket.socket:
    try:
        return _connect(path)
    except OSError:
        pass
    with open(os.path.join(base, key + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one client of a key starts its server; the others wait here
        try:
            return _connect(path)
        except OSError:
            pass
        failed = os.path.join(base, key + ".failed")
        if os.path.exists(failed):
            with open(failed) as f:
                raise Unavailable(f"its server failed to start before: {f.read().strip()}")
        server = _start_server(base, key, path, parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                return _connect(path)
            except OSError:
                pass
            ended = _ended(server)
            if ended is not None or time.monotonic() > deadline:
                why = ended or f"not listening after {START_TIMEOUT_S:g} s"
                with open(failed, "w") as f:
                    f.write(f"{why} (its log: {os.path.join(base, key + '.log')})\n")
                raise Unavailable(f"its server {why}; see {os.path.join(base, key + '.log')}")
            time.sleep(0.05)


def _ended(pidfd: int) -> str | None:
    """Why the server whose pidfd this is has ended, or None while it runs."""
    ready = selectors.DefaultSelector()
    ready.register(pidfd, selectors.EVENT_READ)
    try:
        return "ended before it listened" if ready.select(0) else None
    finally:
        ready.close()


def _start_server(base: str, key: str, path: str, parent: int) -> int:
    """A server for ``key``, detached from this client (which Ray may kill, with its children):
    a pidfd of it."""
    log = os.open(os.path.join(base, key + ".log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    report_r, report_w = os.pipe()
    first = os.fork()
    if first == 0:  # the intermediate child: a new session, then the server in its own child
        try:
            os.close(report_r)
            os.setsid()
            server = os.fork()
            if server:
                os.write(report_w, struct.pack("!i", server))
                os._exit(0)
            os.close(report_w)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.closerange(_STREAMS, os.sysconf("SC_OPEN_MAX"))  # nothing of the client's outlives it here
            os.execv(sys.executable, [sys.executable, "-u", "-m", "raytf_forkserver", "--serve", path, str(parent)])
        finally:
            os._exit(127)
    os.close(report_w)
    os.close(log)
    os.waitpid(first, 0)
    data = os.read(report_r, 4)
    os.close(report_r)
    if len(data) != 4:
        raise Unavailable("could not start its server")
    return os.pidfd_open(struct.unpack("!i", data)[0])


def stand_in(connection: socket.socket, pid: int) -> None:
    """Wait for worker ``pid`` to end and end as it did; pass SIGTERM and SIGINT on to it."""

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    line = connection.makefile("rb").readline()
    if not line:  # the server ended first: wait for the worker itself
        try:
            worker = os.pidfd_open(pid)
        except ProcessLookupError:
            sys.exit(1)
        ready = selectors.DefaultSelector()
        ready.register(worker, selectors.EVENT_READ)
        ready.select()
        sys.exit(1)  # its status went to its parent, the server
    status = int(json.loads(line)["status"])
    if os.WIFSIGNALED(status):  # end by the same signal: reset to its default action first
        if os.WTERMSIG(status) not in (signal.SIGKILL, signal.SIGSTOP):  # which no handler can have
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    sys.exit(os.waitstatus_to_exitcode(status))


# The server


def serve(path: str, parent: int) -> None:
    """Load the modules to preload, then fork a worker per request until the parent (the raylet)
    ends or no child has run for IDLE_EXIT_S."""
    _preload(os.environ.get(PRELOAD, DEFAULT_PRELOAD))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}"
    listener.bind(staging)
    os.rename(staging, path)  # clients see the socket only once it listens
    listener.listen(128)
    bound = os.stat(path).st_ino
    server = _Server(listener, os.pidfd_open(parent))
    try:
        server.loop()
    finally:
        try:
            if os.stat(path).st_ino == bound:  # not a newer server's socket
                os.unlink(path)
        except OSError:
            pass


def _preload(modules: str) -> None:
    """Import ``modules`` as a worker would (raytf's loading: the collector paused, what was loaded
    frozen, on a deep stack)."""
    import importlib

    from raytf._internal.worker.loading import on_a_deep_stack, paused_collector

    def load() -> None:
        with paused_collector():
            for name in filter(None, (m.strip() for m in modules.split(","))):
                importlib.import_module(name)

    on_a_deep_stack(load)()


class _Server:
    def __init__(self, listener: socket.socket, parent: int):
        self.listener = listener
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "listen")
        self.selector.register(parent, selectors.EVENT_READ, "parent")
        self.parent = parent
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its client's connection)
        self.idle_since: float | None = time.monotonic()

    def own_fds(self) -> list[int]:
        fds = [self.listener.fileno(), self.parent, self.selector.fileno()]  # type: ignore[attr-defined]
        for pidfd, (_, connection) in self.children.items():
            fds += [pidfd, connection.fileno()]
        return fds

    def loop(self) -> None:
        while True:
            timeout = None if self.idle_since is None else max(0.0, self.idle_since + IDLE_EXIT_S - time.monotonic())
            events = self.selector.select(timeout)
            if not events and self.idle_since is not None and time.monotonic() - self.idle_since >= IDLE_EXIT_S:
                return
            for key, _ in events:
                if self.selector.get_map().get(key.fd) is not key:
                    continue  # closed by an earlier event of this batch, its descriptor perhaps reused since
                if key.data == "parent":
                    return
                if key.data == "listen":
                    self.accept()
                elif key.data == "child":
                    self.reap(key.fd)
                else:  # a client's connection: it ended (Ray killed it), so its worker goes too
                    self.client_gone(key.fileobj, key.data)  # type: ignore[arg-type]

    def accept(self) -> None:
        connection, _ = self.listener.accept()
        try:
            uid = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            if uid != os.getuid():
                raise ValueError(f"a process of user {uid}")
            connection.settimeout(30)
            request, streams = _receive(connection)
            connection.settimeout(None)
        except (OSError, ValueError) as error:
            _answer(connection, {"error": str(error)})
            connection.close()
            return
        pid = os.fork()
        if pid == 0:
            _become_worker(request, streams, [*self.own_fds(), connection.fileno()])
        for fd in streams:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, connection)
        self.selector.register(pidfd, selectors.EVENT_READ, "child")
        self.selector.register(connection, selectors.EVENT_READ, pid)
        self.idle_since = None
        _answer(connection, {"pid": pid})

    def reap(self, pidfd: int) -> None:
        pid, connection = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        try:
            self.selector.unregister(connection)
        except KeyError:
            pass
        _answer(connection, {"status": status})
        connection.close()
        if not self.children:
            self.idle_since = time.monotonic()

    def client_gone(self, connection: socket.socket, pid: int) -> None:
        self.selector.unregister(connection)
        try:
            os.kill(pid, signal.SIGKILL)  # reaped when its pidfd says it ended
        except ProcessLookupError:
            pass


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    """A request: its 4-byte length with the client's standard streams, then its JSON."""
    fds = array.array("i")
    head, ancillary, _, _ = connection.recvmsg(4, socket.CMSG_SPACE(_STREAMS * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    streams = list(fds)
    if len(head) != 4 or len(streams) != _STREAMS:
        for fd in streams:
            os.close(fd)
        raise ValueError("a request without its length and its three standard streams")
    (length,) = struct.unpack("!I", head)
    if length > _REQUEST_LIMIT:
        raise ValueError(f"a request of {length} bytes")
    body = bytearray()
    while len(body) < length:
        chunk = connection.recv(length - len(body))
        if not chunk:
            raise ValueError("a request cut short")
        body += chunk
    return json.loads(body), streams


def _answer(connection: socket.socket, message: dict) -> None:
    try:
        connection.sendall(json.dumps(message).encode() + b"\n")
    except OSError:  # the client is gone
        pass


def _become_worker(request: dict, streams: list[int], server_fds: list[int]) -> None:
    """In the forked child: take the client's place and run Ray's worker script; never returns."""
    code = 1
    try:
        for fd in server_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        os.setsid()  # a session of its own: Ray's kills of its process group reach only the worker
        for target, fd in enumerate(streams):
            os.dup2(fd, target)
        for fd in streams:
            if fd >= _STREAMS:
                os.close(fd)
        os.umask(int(request["umask"]))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ[FORKED_FROM] = str(os.getppid())
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()  # its global generator, copied from the server, drawn from anew
        argv = [str(word) for word in request["argv"]]
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))  # as for `python <script>`
        import runpy

        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
            if not isinstance(done.code, (int, type(None))):
                print(done.code, file=sys.stderr)
    except BaseException:  # noqa: B036 - the child must end here whatever happened, after saying why
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream: nothing left to say
                pass
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
