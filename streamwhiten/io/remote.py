"""Object storage and other remote file systems (``s3://``, ``gs://``, ``az://``, ``https://``, ...) through
fsspec, the only importer of fsspec: URLs, storage options, redaction, retries, fingerprints.

Configuration is the ecosystem's (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, fsspec's config, ...) plus the
storage options of the [`ReadOptions`][streamwhiten.options.ReadOptions] each call takes (``read=``), which
win. There is no process-wide setting: file systems are kept per protocol *and* options.

Credentials never leave this module: URLs carrying them are refused, every message goes through `scrub`
(which knows the secret values of every set of options used), and sources are recorded by URL alone.

`retrying` retries a transient failure with backoff until ``read.remote_timeout`` seconds have passed
since the outage began (shared by every thread); then a `StoreIOError` (exit 74). A missing object is bad
input (exit 2). The layers below (s3fs, botocore, Lance's object store) are told to keep their own
retries and timeouts inside that deadline (`filesystem_options`, `lance_options`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..errors import BadInputError, CorruptStoreError, StoreIOError, StreamwhitenError
from ..options import ReadOptions

#: ``scheme://`` at the start of a spec.
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
#: Spellings of one protocol (``s3a://`` is Hadoop's name for S3).
_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "adl": "az"}
#: Query parameters that make a URL a credential (presigned S3/GCS URLs, Azure SAS tokens).
_SIGNED = re.compile(
    r"(^|&)(x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|"
    r"x-goog-credential|signature|sig|token|access_token|sv)=",
    re.IGNORECASE,
)
#: Storage option names whose values are secrets (never shown, scrubbed from messages).
_SECRET_NAME = re.compile(r"secret|password|passwd|token|credential|key|sas|auth|session", re.IGNORECASE)
#: Environment variables whose values are secrets, scrubbed from messages too.
_SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_ACCESS_KEY_ID AZURE_STORAGE_KEY AZURE_STORAGE_SAS_TOKEN "
    "AZURE_STORAGE_CONNECTION_STRING AZURE_STORAGE_ACCOUNT_KEY"
).split()

#: The first wait before a call is tried again (doubled each time, with jitter, at most `MAX_BACKOFF` s).
BACKOFF = float(os.environ.get("STREAMWHITEN_REMOTE_BACKOFF", "0.2"))
MAX_BACKOFF = 2.0
#: Tries s3fs makes of one request whose answer was cut or timed out (botocore is told to make one): a reset
#: connection is tried again at once, cheaply, before `retrying` tries the whole block again.
S3FS_TRIES = 2
#: Worker threads a fit or apply reading a remote store starts by default: reads wait on the network.
REMOTE_THREADS = 8

#: Since when the remote stores have been failing (monotonic clock; None while they answer): every
#: thread's retries share one outage, so all of them give up together.
_outage: dict[str, float | None] = {"since": None}
_outage_lock = threading.Lock()


def is_url(spec: object) -> bool:
    """Whether ``spec`` names something by URL (``file://`` included)."""
    return isinstance(spec, str) and _URL.match(spec) is not None


def is_remote(spec: object) -> bool:
    """Whether ``spec`` is a URL of a remote file system (not ``file://``)."""
    return isinstance(spec, str) and is_url(spec) and protocol(spec) != "file"


def protocol(url: str) -> str:
    scheme = split_url(url)[0][:-3].lower()
    return _ALIASES.get(scheme, scheme)


def local_path(spec: Any) -> Any:
    """A ``file://`` URL as the local path it names; anything else unchanged."""
    if isinstance(spec, str) and spec[:7].lower() == "file://":
        rest = spec[7:]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        return rest or "/"
    return spec


def split_url(url: str) -> tuple[str, str]:
    """``(scheme://, rest)`` of a URL, the scheme as written."""
    match = _URL.match(url)
    assert match is not None  # callers pass URLs (is_url)
    return url[: match.end()], url[match.end() :]


def check_url(url: str) -> None:
    """Refuse a URL that carries credentials: they would end up in labels, models and outputs."""
    parts = urlsplit(url)
    if "@" in parts.netloc and protocol(url) not in ("s3", "gs", "az"):
        raise BadInputError(
            f"{redact(url)}: the URL holds credentials (user:password@); give them in the "
            "environment or with storage_options instead, so they are never recorded",
            param="storage_options",
        )
    if parts.query and _SIGNED.search(parts.query):
        raise BadInputError(
            f"{redact(url)}: the URL is signed (a presigned or SAS query string is a credential); "
            "give credentials in the environment or with storage_options instead",
            param="storage_options",
        )


def redact(url: str) -> str:
    """``url`` without user information or query string (where credentials could hide)."""
    if not is_url(url):
        return url
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1] if protocol(url) not in ("s3", "gs", "az") else parts.netloc
    return f"{parts.scheme}://{netloc}{parts.path}"


def bucket(url: str) -> str:
    """The bucket or container of ``url`` (``s3://b/x/y``: ``s3://b``)."""
    head, rest = split_url(url)
    return head + rest.split("/", 1)[0]


def normalize(url: str) -> str:
    """One spelling of a remote location: canonical scheme, no credentials, no repeated or trailing ``/``,
    no ``.`` segments; for comparing outputs with inputs and recording sources."""
    url = redact(url)
    head, rest = split_url(url)
    segments = [s for s in rest.split("/") if s not in ("", ".")]
    resolved: list[str] = []
    for segment in segments:
        if segment == ".." and len(resolved) > 1:
            resolved.pop()
        elif segment != "..":
            resolved.append(segment)
    return f"{protocol(url)}://" + "/".join(resolved)


def contains(outer: str, inner: str) -> bool:
    """Whether the remote location ``inner`` is ``outer`` or lies under it (both normalised)."""
    a, b = normalize(outer), normalize(inner)
    return a == b or b.startswith(a + "/")


def join(url: str, *names: str) -> str:
    return "/".join([url.rstrip("/"), *[name.strip("/") for name in names if name]])


def parent(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def basename(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def parse_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` as ``(key, value)``; the value as JSON where it parses (``true``, ``3``,
    ``{"a": 1}``), else as a string. The key may be dotted (``client_kwargs.region_name``)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise BadInputError(
            "storage_options takes KEY=VALUE (e.g. endpoint_url=http://127.0.0.1:9000)", param="storage_options"
        )
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return key, parsed


def options_from(items: Mapping[str, Any] | Iterable[str] | None) -> dict[str, Any]:
    """Storage options from ``KEY=VALUE`` strings or a mapping (a job's ``[storage]`` table); dotted keys
    nest (``client_kwargs.region_name=eu-west-1``)."""
    result: dict[str, Any] = {}
    pairs = items.items() if isinstance(items, dict) else (parse_option(item) for item in items or ())
    for key, value in pairs:
        target = result
        parts = str(key).split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise BadInputError(f"storage option {key}: {part} is given both as a value and as a table")
        target[parts[-1]] = value
    return result


#: The secret values of every set of storage options this process has used: what `scrub` hides.
_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def _storage_options(read: ReadOptions) -> dict[str, Any]:
    """The storage options of ``read`` as plain keyword arguments (a copy), their secrets remembered."""
    remember_secrets(read.storage_options)
    return read.storage_options.to_dict() if read.storage_options is not None else {}


def remember_secrets(options: Mapping[str, Any] | None) -> None:
    """Add the values of ``options`` whose names say secret, key, token, ... to what `scrub` hides from now on."""
    found: list[str] = []

    def walk(mapping: Mapping[str, Any]) -> None:
        for key, value in mapping.items():
            if isinstance(value, Mapping):
                walk(value)
            elif isinstance(value, str) and len(value) >= 4 and _SECRET_NAME.search(str(key)):
                found.append(value)

    walk(options or {})
    if found:
        with _secrets_lock:
            _secrets.update(found)


def _secret_values() -> list[str]:
    with _secrets_lock:
        found = set(_secrets)
    found.update(os.environ[name] for name in _SECRET_ENV if len(os.environ.get(name, "")) >= 4)
    return sorted(found, key=len, reverse=True)


def scrub(text: str) -> str:
    """``text`` with every secret value used (storage options, credential variables) replaced by ``***``."""
    for secret in _secret_values():
        text = text.replace(secret, "***")
    return text


#: File systems made, by (protocol, storage options, deadline), shared by the threads that use the same ones.
_filesystems: dict[tuple[str, Any, float], Any] = {}
_filesystems_lock = threading.Lock()


def clear_cache() -> None:
    """Forget the file systems made so far (after the environment they read changed, say)."""
    with _filesystems_lock:
        _filesystems.clear()


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError:
        raise BadInputError(
            "reading or writing URLs needs fsspec (and s3fs for s3://, gcsfs for gs://, adlfs for "
            "az://): pip install 'streamwhiten[remote]'"
        ) from None
    return fsspec


def filesystem_options(url: str, read: ReadOptions) -> dict[str, Any]:
    """The keyword arguments of a file system for ``url``: ``read``'s storage options, no listings cache (a
    store being written must be seen as it is now) and, for S3, retries and timeouts within
    ``read.remote_timeout`` (one botocore attempt, half the deadline to connect or answer; the user's win)."""
    options = _storage_options(read)
    options.setdefault("use_listings_cache", False)
    if protocol(url) == "s3":
        # s3fs otherwise asks for an object's size (a HEAD) before every whole-object GET, to split large
        # ones: that doubles the requests of a chunked store, whose concurrency comes from our threads.
        options.setdefault("max_concurrency", 1)
        deadline = read.remote_timeout
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", min(5.0, deadline / 2))
        config.setdefault("read_timeout", deadline / 2)
        config.setdefault("retries", {"total_max_attempts": 1, "mode": "standard"})
        options["config_kwargs"] = config
    return options


def _bounded(fs: Any) -> Any:
    """``fs`` with s3fs's own retry loop (5 tries by default) cut to `S3FS_TRIES`, to fit in the deadline."""
    if hasattr(type(fs), "retries") and isinstance(getattr(fs, "retries", None), int):
        fs.retries = S3FS_TRIES
    return fs


def filesystem(url: str, read: ReadOptions) -> tuple[Any, str]:
    """``(file system, path in it)`` for a remote ``url``, made once per protocol and ``read``'s options."""
    fsspec = _fsspec()
    check_url(url)
    name = protocol(url)
    try:
        cls = fsspec.get_filesystem_class(name)
    except (ImportError, ValueError) as exc:
        hint = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs", "http": "aiohttp", "https": "aiohttp"}.get(name)
        extra = f" (pip install {hint})" if hint else ""
        raise BadInputError(
            f"{redact(url)}: no file system for {name}:// is installed{extra}: {scrub(str(exc))}"
        ) from None
    key = (name, read.storage_options, read.remote_timeout)
    with _filesystems_lock:
        fs = _filesystems.get(key)
    if fs is None:
        try:
            fs = _bounded(fsspec.filesystem(name, **filesystem_options(url, read)))
        except Exception as exc:
            raise BadInputError(
                f"{redact(url)}: cannot set up {name}:// with the storage options given "
                f"({exc.__class__.__name__}: {scrub(str(exc))})"
            ) from None
        with _filesystems_lock:
            fs = _filesystems.setdefault(key, fs)
    path = cls._strip_protocol(url) if name not in ("http", "https") else redact(url)
    return fs, path


#: fsspec's names of S3 options, and object_store's (pylance's storage_options) for them.
_LANCE_NAMES = {
    "endpoint_url": "aws_endpoint",
    "key": "aws_access_key_id",
    "secret": "aws_secret_access_key",
    "token": "aws_session_token",
    "region_name": "aws_region",
}


def lance_options(url: str, read: ReadOptions) -> dict[str, str]:
    """The storage options of ``read`` as pylance (object_store) spells them (``endpoint_url``:
    ``aws_endpoint``, ...; its own ``aws_*``, ``google_*``, ... as they are); an ``http://`` endpoint allowed."""
    options = _storage_options(read)
    flat = dict(options.get("client_kwargs") or {}, **{k: v for k, v in options.items() if k != "client_kwargs"})
    result = {}
    for key, value in flat.items():
        if key in _LANCE_NAMES:
            result[_LANCE_NAMES[key]] = str(value)
        elif key.startswith(("aws_", "google_", "azure_", "allow_", "timeout", "connect_timeout")):
            result[key] = str(value).lower() if isinstance(value, bool) else str(value)
        elif key == "anon" and value:
            result["aws_skip_signature"] = "true"
    endpoint = result.get("aws_endpoint") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and endpoint.startswith("http://"):
        result.setdefault("allow_http", "true")
    # Lance's object store retries up to 10 times for 3 minutes by default: inside the deadline instead.
    deadline = read.remote_timeout
    result.setdefault("client_max_retries", str(S3FS_TRIES - 1))
    result.setdefault("client_retry_timeout", str(max(1, int(deadline))))
    result.setdefault("connect_timeout", f"{max(1, int(min(5.0, deadline / 2)))}s")
    return result


def zarr_store(url: str, read_only: bool, read: ReadOptions) -> Any:
    """A zarr ``FsspecStore`` on the remote ``url`` with ``read``'s storage options."""
    from zarr.storage import FsspecStore

    check_url(url)
    try:
        store = FsspecStore.from_url(url, storage_options=filesystem_options(url, read), read_only=read_only)
    except Exception as exc:
        raise failure(url, "open", exc) from None
    _bounded(store.fs)
    return store


#: Words of a message that mark a failure as passing: worth another try.
_TRANSIENT_TEXT = re.compile(
    r"(\((5\d\d|429)\)|\b(HTTP|status|code)[ =:/]*(5\d\d|429)\b|\b(5\d\d|429),? ?(message=|Server|Service|Internal|"
    r"Bad|Gateway|Slow|Too)|\b(SlowDown|Throttl\w*|TooManyRequests|RequestTimeout\w*|ServiceUnavailable|InternalError|"
    r"Internal Server Error|Bad Gateway|Service Unavailable|Gateway Time-?out|Connection reset|"
    r"connection (was )?(closed|aborted|lost|refused)|Server disconnected|timed out|Timeout|"
    r"Broken pipe|EOF occurred|IncompleteRead|Response payload is not completed|Cannot connect)\b)",
    re.IGNORECASE,
)
#: Exception class names (any in the class's bases) that mark a failure as passing (aiohttp, botocore, urllib3,
#: fsspec, ...); the built-in ConnectionError and TimeoutError and their subclasses are passing too. By name as
#: well: a timeout of asyncio or concurrent.futures on Python 3.10, or urllib3's, is no built-in TimeoutError.
_TRANSIENT_NAMES = frozenset(
    "ConnectionError TimeoutError ServerDisconnectedError ClientOSError ClientPayloadError ClientConnectorError "
    "ServerTimeoutError EndpointConnectionError ConnectionClosedError ReadTimeoutError ConnectTimeoutError "
    "IncompleteReadError ResponseStreamingError FSTimeoutError ProtocolError IncompleteRead ContentLengthError "
    "ClientResponseError ServerDisconnected".split()
)
_AUTH_TEXT = re.compile(
    r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|Forbidden|\b403\b|\b401\b|"
    r"InvalidToken|ExpiredToken|Unauthori[sz]ed|credentials",
    re.IGNORECASE,
)
_MISSING_TEXT = re.compile(r"NoSuchBucket|NoSuchKey|Not Found|\b404\b|does not exist", re.IGNORECASE)


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def classify(exc: BaseException) -> str:
    """``"transient"``, ``"auth"``, ``"missing"`` or ``"other"`` for a failure of a remote call."""
    chain = list(_chain(exc))
    for item in chain:
        if isinstance(item, PermissionError) or _AUTH_TEXT.search(str(item)) and isinstance(item, OSError):
            return "auth"
    if any(isinstance(item, FileNotFoundError) for item in chain):
        return "missing"
    for item in chain:
        names = {cls.__name__ for cls in type(item).__mro__}
        if names & _TRANSIENT_NAMES or isinstance(item, (ConnectionError, TimeoutError)):
            return "transient"
        if isinstance(item, OSError) and item.errno in (104, 110, 111, 32, 103, 113):
            return "transient"
        if _TRANSIENT_TEXT.search(str(item)):
            return "transient"
    for item in chain:
        if _MISSING_TEXT.search(str(item)) and isinstance(item, OSError):
            return "missing"
    return "other"


def reason(exc: BaseException) -> str:
    """A short one-line reason for a remote failure, without secrets."""
    for item in _chain(exc):
        text = " ".join(str(item).split())
        if text:
            return scrub(f"{item.__class__.__name__}: {text}"[:300])
    return exc.__class__.__name__


def failure(
    url: str, what: str, exc: BaseException, attempts: int = 1, seconds: float | None = None, timeout: float = 0.0
) -> BadInputError | StoreIOError:
    """The error of ours for a remote call that failed for good (``seconds``: how long the outage lasted,
    under the deadline ``timeout``)."""
    where = redact(url)
    kind = classify(exc)
    if kind == "missing":
        return BadInputError(f"{where}: no such object, prefix or bucket ({what}: {reason(exc)})")
    if kind == "auth":
        return StoreIOError(
            f"{where}: access denied, check the credentials (environment, profile or "
            f"storage_options) ({what}: {reason(exc)})",
            param="storage_options",
        )
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    if seconds is not None:
        tries += f" in {seconds:.0f} s (remote_timeout={timeout:g})"
    return StoreIOError(f"{where}: cannot {what}{tries}: {reason(exc)}", param="remote_timeout")


#: Counts of retried and of failed calls, for tests and benchmarks.
stats = {"retries": 0, "failures": 0}


def _network_cause(exc: BaseException) -> BaseException | None:
    """The network failure behind one of our errors that a backend raised ``from`` it (a read it took for
    damaged data or a disk's failure, as it would be locally), else None."""
    cause = exc.__cause__
    if isinstance(exc, (CorruptStoreError, StoreIOError)) and cause is not None and classify(cause) != "other":
        return cause
    return None


def retrying(url: str, what: str, call: Callable[..., Any], *args: Any, read: ReadOptions, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, retried with backoff while it fails transiently, until ``read.remote_timeout``
    seconds have passed since the outage began (in any thread) or this call first failed; then `failure`.
    Our own errors pass through, unless the network's failure is behind them."""
    attempt, first = 0, None
    while True:
        try:
            result = call(*args, **kwargs)
        except Exception as caught:
            exc: BaseException = caught
            if isinstance(exc, StreamwhitenError):
                cause = _network_cause(exc)
                if cause is None:
                    raise
                exc = cause
            if classify(exc) == "transient":
                now = time.monotonic()
                first = now if first is None else first
                with _outage_lock:
                    since = _outage["since"] = _outage["since"] if _outage["since"] is not None else now
                since = min(since, first)  # this call's own failures count too, whatever other calls do
                left = since + read.remote_timeout - now
                if left > 0:
                    stats["retries"] += 1
                    time.sleep(min(left, MAX_BACKOFF, BACKOFF * 2**attempt) * (0.5 + 0.5 * random.random()))
                    attempt += 1
                    continue
                stats["failures"] += 1
                raise failure(url, what, exc, attempt + 1, now - since, read.remote_timeout) from None
            stats["failures"] += 1
            raise failure(url, what, exc, attempt + 1) from None
        if _outage["since"] is not None:
            with _outage_lock:
                _outage["since"] = None
        return result


def _call(url: str, what: str, method: str, *args: Any, read: ReadOptions, **kwargs: Any) -> Any:
    """The file system's ``method`` on the path of ``url`` (then ``args``), through `retrying`."""
    fs, path = filesystem(url, read)
    return retrying(url, what, getattr(fs, method), path, *args, read=read, **kwargs)


def info(url: str, *, read: ReadOptions) -> dict[str, Any]:
    """The metadata of one object."""
    return dict(_call(url, "read its metadata", "info", read=read))


def exists(url: str, *, read: ReadOptions) -> bool:
    """Whether an object or a prefix is at ``url``."""
    return bool(_call(url, "check whether it exists", "exists", read=read))


def isdir(url: str, *, read: ReadOptions) -> bool:
    """Whether ``url`` is a prefix (of a store's objects)."""
    return bool(_call(url, "check whether it is a prefix", "isdir", read=read))


def cat(url: str, start: int | None = None, end: int | None = None, *, read: ReadOptions) -> bytes:
    """Bytes ``[start, end)`` of one object (all of it by default)."""
    return bytes(_call(url, f"read bytes {start}..{end}", "cat_file", start=start, end=end, read=read))


def put_bytes(url: str, data: bytes, *, read: ReadOptions) -> None:
    """Write one whole object (a single PUT: readers see the old object or the new one, never a part)."""
    _call(url, "write", "pipe_file", data, read=read)


def remove(url: str, recursive: bool = False, *, read: ReadOptions) -> None:
    """Remove an object, or everything under a prefix; nothing there is fine."""
    fs, path = filesystem(url, read)

    def rm() -> None:
        try:
            fs.rm(path, recursive=recursive)
        except FileNotFoundError:
            pass

    retrying(url, "remove", rm, read=read)


def find(url: str, detail: bool = False, *, read: ReadOptions) -> Any:
    """Every object under the prefix ``url`` (as URLs, sorted), or ``{url: info}`` with ``detail``."""
    found = _call(url, "list", "find", detail=True, read=read)
    full = {_as_url(url, key): value for key, value in found.items()}
    return full if detail else sorted(full)


def glob(pattern: str, *, read: ReadOptions) -> list[str]:
    """The objects whose URLs match ``pattern``, sorted."""
    return sorted(_as_url(pattern, key) for key in _call(pattern, "list", "glob", read=read))


def _as_url(url: str, key: str) -> str:
    """A key a listing of ``url`` gave, as a URL of the same scheme."""
    return key if "://" in key else split_url(url)[0] + key.lstrip("/")


def etag_of(details: dict[str, Any]) -> str:
    """The version of an object as its store says it: ETag (S3, Azure), generation or md5 (GCS), else
    the modification time."""
    for key in "ETag etag generation md5Hash version_id VersionId LastModified mtime last_modified updated".split():
        if details.get(key) not in (None, ""):
            return str(details[key]).strip('"')
    return ""


def version(url: str, *, read: ReadOptions) -> dict[str, Any]:
    """``{"size": bytes, "etag": ...}`` of one object."""
    details = info(url, read=read)
    return {"size": int(details.get("size") or 0), "etag": etag_of(details)}


def prefix_version(url: str, details: dict[str, Any] | None = None, *, read: ReadOptions) -> dict[str, Any]:
    """``{"size": total bytes, "etag": digest of every object's key, size and ETag}`` of everything under
    a prefix (a Zarr store): one listing, and it changes when any object does."""
    details = find(url, detail=True, read=read) if details is None else details
    base = normalize(url)
    digest = hashlib.sha256()
    total = 0
    for key in sorted(details):
        item = details[key]
        size = int(item.get("size") or 0)
        total += size
        digest.update(f"{normalize(key)[len(base) :]}\0{size}\0{etag_of(item)}\n".encode())
    return {"size": total, "etag": digest.hexdigest()}


def default_threads(threads: int | None, sources: Iterable[Any]) -> int | None:
    """``threads`` if given, else `REMOTE_THREADS` when any of ``sources`` is remote, else None (the default)."""
    if threads is not None:
        return threads
    remote = any(getattr(source, "remote", False) or is_remote(source) for source in sources)
    return REMOTE_THREADS if remote else None
