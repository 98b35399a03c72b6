"""What every ``nsq-sansio`` command shares: the errors and exit codes (:class:`CLIError`,
:class:`UsageError`, :func:`reports_errors`), the parser that reports a bad flag on one line
(:class:`CommandParser`), the flags (``--name`` with Go's ``-name`` spelling, nsqd/lookupd
sources, connection and TLS options, metrics, progress), value checks (Go's duration syntax,
positive numbers, names), the admin clients of nsqd's and nsqlookupd's HTTP API with their
failures as one line, and the probes that fail fast with one clear line when an address does
not answer.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from nsq_sansio.discovery import MAX_RESPONSE_SIZE
from nsq_sansio.errors import (
    ConfigError,
    ConnectionLost,
    InvalidName,
    NSQError,
    RemoteProtocolError,
)
from nsq_sansio.names import validate_channel, validate_topic
from transports._common import (
    DEFAULT_LOOKUPD_HTTP_PORT,
    DEFAULT_TCP_PORT,
    TLSOptions,
    format_address,
    parse_address,
    parse_http_url,
    read_auth_secret,
)

if TYPE_CHECKING:
    from transports.sync.admin import LookupdAdmin, NSQDAdmin

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "LOOKUPD_ANSWER_LIMIT",
    "NSQD_ANSWER_LIMIT",
    "CLIError",
    "CommandParser",
    "UsageError",
    "add_client",
    "add_metrics_flag",
    "add_progress_flag",
    "add_sources",
    "admin_call",
    "check_metrics_address",
    "check_sources",
    "client_options",
    "describe_error",
    "first_error",
    "flag",
    "listen_failure",
    "lookupd_admin",
    "lookupd_nsqd_addresses",
    "lookupd_urls",
    "non_negative",
    "nsqd_admin",
    "parse_duration",
    "positive",
    "probe_tcp",
    "reports_errors",
    "run_reporting_errors",
    "serving_metrics",
    "stop_on_signals",
    "tls_options",
    "valid_channel",
    "valid_topic",
]


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Go's ``time.ParseDuration`` subset -> seconds; a bare number is seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 60s, 1m30s, 250ms)")
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if not text:
        raise argparse.ArgumentTypeError("empty duration")
    return total


# --- errors and exit codes ---------------------------------------------------------------------

#: The command line is wrong: an unknown command or flag, a value that can never work (not a
#: number, 0 where 0 makes no sense, an invalid topic name, contradictory flags). argparse's code.
EXIT_USAGE = 2
#: The command line is fine but the command cannot start or go on: a port in use, an nsqd or
#: lookupd that does not answer, a missing file or directory, a missing optional package, a
#: topic or channel ``stat`` does not find; the demo's accounting failed.
EXIT_FAILURE = 1
#: Stopped by Ctrl-C where the command has no clean stop of its own (the demo).
EXIT_INTERRUPTED = 130


class CLIError(Exception):
    """A failure to start or go on: one line on stderr, exit code :data:`EXIT_FAILURE`."""


class UsageError(CLIError):
    """A wrong command line (a bad value, contradictory flags): one line on stderr, exit code
    :data:`EXIT_USAGE`."""


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``nsq-sansio tail: argument ...``),
    exit code :data:`EXIT_USAGE`, like every other failure to start."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


# Optional packages and the extra that installs each.
_EXTRAS = {
    "anyio": "cli",
    "cryptography": "cli",
    "trio": "trio",
    "prometheus_client": "metrics",
    "pyspark": "spark",
    "pyarrow": "spark",
}


def first_error(err: BaseException) -> BaseException:
    """The first error inside (nested) exception groups (anyio's task groups wrap a server's
    failure to start in one); ``err`` itself when it is not a group."""
    while True:
        inner = getattr(err, "exceptions", None)  # (Base)ExceptionGroup, also on 3.10
        if not inner:
            return err
        err = inner[0]


def describe_error(err: BaseException) -> str:
    """``err`` as one line: its type and its text, whitespace folded."""
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class _NotTheFailureItself(logging.Filter):
    """Drops the library's "consumer failed" record: the command reports that failure itself,
    as its one closing line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "nsq_state", None) != "failed"


@contextlib.contextmanager
def _library_warnings_on_stderr(command: str) -> Iterator[None]:
    """While a command runs with logging left unconfigured, the library's warnings and errors
    go to stderr as ``nsq-sansio <command>: <message>`` lines (Python's fallback would print
    them bare), minus the failure the command reports itself. A program that configured
    logging keeps its own handlers."""
    library = logging.getLogger("nsq_sansio")
    if logging.getLogger().handlers or library.handlers:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter(f"nsq-sansio {command}: %(message)s"))
    handler.addFilter(_NotTheFailureItself())
    library.addHandler(handler)
    try:
        yield
    finally:
        library.removeHandler(handler)


def run_reporting_errors(command: str, body: Callable[[], int]) -> int:
    """Run ``body`` and turn every failure to start into one stderr line,
    ``nsq-sansio <command>: <what went wrong>``, and its exit code: :data:`EXIT_USAGE` for a
    wrong command line, :data:`EXIT_FAILURE` for everything else; never a traceback for an
    expected failure (an unexpected exception type is a bug and keeps its traceback)."""
    try:
        with _library_warnings_on_stderr(command):
            return body()
    except BrokenPipeError:  # `nsq-sansio tail ... | head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseException as raised:
        err = first_error(raised)
        if isinstance(err, UsageError):
            message, code = str(err), EXIT_USAGE
        elif isinstance(err, CLIError):
            message, code = str(err), EXIT_FAILURE
        elif isinstance(err, ModuleNotFoundError) and err.name:
            top = err.name.partition(".")[0]
            extra = _EXTRAS.get(top, "cli")
            message = f"needs the {top} package: python -m pip install 'nsq-sansio[{extra}]'"
            code = EXIT_FAILURE
        elif isinstance(err, (NSQError, OSError, ValueError)):
            message, code = describe_error(err), EXIT_FAILURE
        elif isinstance(err, KeyboardInterrupt):
            return EXIT_INTERRUPTED
        else:
            raise
        print(f"nsq-sansio {command}: {message}", file=sys.stderr, flush=True)
        return code


_Main = TypeVar("_Main", bound=Callable[..., int])


def reports_errors(command: str) -> Callable[[_Main], _Main]:
    """Decorate a command's ``*_main(argv)`` with :func:`run_reporting_errors`, so it keeps
    the same one-line errors and exit codes when called as a function."""

    def decorate(main: _Main) -> _Main:
        @functools.wraps(main)
        def wrapper(*args: Any, **kwargs: Any) -> int:
            return run_reporting_errors(command, lambda: main(*args, **kwargs))

        return wrapper  # type: ignore[return-value]

    return decorate


# --- value checks -------------------------------------------------------------------------------


def positive(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type``: ``convert`` (int, float, :func:`parse_duration`), then > 0 (a
    zero interval busy-loops, a zero max-in-flight receives nothing)."""

    def check(text: str) -> Any:
        value = _convert(convert, text)
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
        return value

    check.__name__ = getattr(convert, "__name__", "value")
    return check


def non_negative(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type``: ``convert``, then >= 0 (where 0 means "off" or "no limit")."""

    def check(text: str) -> Any:
        value = _convert(convert, text)
        if not 0 <= value < float("inf"):
            raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
        return value

    check.__name__ = getattr(convert, "__name__", "value")
    return check


def _convert(convert: Callable[[str], Any], text: str) -> Any:
    try:
        return convert(text)
    except ValueError:
        kind = {int: "an integer", float: "a number"}.get(convert, "a value")  # type: ignore[call-overload]
        raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}") from None


# --- shared flags ----------------------------------------------------------------------------


def flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """``--name`` plus Go's ``-name`` spelling (nsq's tools use Go's flag package)."""
    parser.add_argument(f"--{name}", f"-{name}", **kwargs)


def add_sources(parser: argparse.ArgumentParser, *, http: bool = False) -> None:
    flag(
        parser,
        "nsqd-tcp-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqd TCP address (may be given multiple times)",
    )
    if http:
        flag(
            parser,
            "nsqd-http-address",
            action="append",
            default=[],
            metavar="HOST:PORT",
            help="nsqd HTTP address (may be given multiple times)",
        )
    flag(
        parser,
        "lookupd-http-address",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="nsqlookupd HTTP address (may be given multiple times)",
    )


def add_client(parser: argparse.ArgumentParser) -> None:
    """The connection flags of the commands that connect to nsqd (tail, pub, to-file)."""
    group = parser.add_argument_group(
        "connection", "every --tls-* flag turns TLS on: it is never silently left off"
    )
    group.add_argument("--snappy", action="store_true", help="negotiate snappy compression")
    group.add_argument("--deflate", action="store_true", help="negotiate deflate compression")
    group.add_argument(
        "--tls", action="store_true", help="negotiate TLS, nsqd's certificate verified"
    )
    group.add_argument(
        "--tls-root-ca-file",
        default=None,
        metavar="FILE",
        help="CA bundle (PEM) to verify nsqd's certificate with, instead of the system's",
    )
    group.add_argument(
        "--tls-cert",
        default=None,
        metavar="FILE",
        help="client certificate to present (PEM; may hold the key too)",
    )
    group.add_argument(
        "--tls-key",
        default=None,
        metavar="FILE",
        help="private key of --tls-cert (PEM), when it is a separate file",
    )
    group.add_argument(
        "--tls-insecure-skip-verify",
        action="store_true",
        help="TLS without verifying nsqd's certificate (encrypted, not authenticated)",
    )
    secret = group.add_mutually_exclusive_group()
    secret.add_argument(
        "--auth-secret",
        default=None,
        metavar="SECRET",
        help="secret sent with AUTH (visible to other users in the process list: prefer "
        "--auth-secret-env or --auth-secret-file)",
    )
    secret.add_argument(
        "--auth-secret-env",
        default=None,
        metavar="NAME",
        help="read the AUTH secret from the environment variable NAME",
    )
    secret.add_argument(
        "--auth-secret-file",
        default=None,
        metavar="FILE",
        help="read the AUTH secret from FILE (one trailing newline dropped)",
    )
    group.add_argument(
        "--auth-requires-tls",
        action="store_true",
        help="never send the AUTH secret over a connection without TLS (refuse the nsqd)",
    )
    group.add_argument(
        "--connect-timeout",
        type=positive(parse_duration),
        default=5.0,
        metavar="DURATION",
        help="bound on a TCP connect plus the IDENTIFY handshake (default 5s)",
    )


def tls_options(args: argparse.Namespace) -> TLSOptions | None:
    """The TLS settings the ``--tls*`` flags ask for; None only when none is given. Any of
    them turns TLS on (a key without its certificate is a usage error); the files are loaded
    once here, so a missing or unreadable one is one line now, not a reconnect loop later."""
    if args.tls_key and not args.tls_cert:
        raise UsageError("--tls-key needs --tls-cert (the certificate the key belongs to)")
    wanted = (
        args.tls
        or args.tls_insecure_skip_verify
        or args.tls_root_ca_file is not None
        or args.tls_cert is not None
    )
    if not wanted:
        return None
    for name, path in (
        ("--tls-root-ca-file", args.tls_root_ca_file),
        ("--tls-cert", args.tls_cert),
        ("--tls-key", args.tls_key),
    ):
        if path is not None and not os.path.isfile(path):
            raise CLIError(f"{name} {path!r} is not a file")
    options = TLSOptions(
        verify=not args.tls_insecure_skip_verify,
        ca_file=args.tls_root_ca_file,
        cert_file=args.tls_cert,
        key_file=args.tls_key,
    )
    try:
        options.context()
    except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
        reason = getattr(err, "reason", None) or describe_error(err)
        raise CLIError(f"cannot use the --tls-* files: {reason}") from None
    return options


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """The client keyword arguments of the connection flags (:func:`add_client`)."""
    if args.snappy and args.deflate:
        raise UsageError("--snappy and --deflate exclude each other: pick one")
    options: dict[str, Any] = {
        "snappy": args.snappy,
        "deflate": args.deflate,
        "connect_timeout": args.connect_timeout,
    }
    if args.auth_secret is not None:
        options["auth_secret"] = args.auth_secret.encode()
    elif args.auth_secret_env is not None or args.auth_secret_file is not None:
        try:  # read now: a missing variable or file is one line, not a reconnect loop
            options["auth_secret"] = read_auth_secret(
                env=args.auth_secret_env, file=args.auth_secret_file
            )
        except ConfigError as err:
            raise CLIError(str(err).replace("auth_secret_", "--auth-secret-", 1)) from None
    if args.auth_requires_tls:
        options["auth_requires_tls"] = True
    tls = tls_options(args)
    if tls is not None:
        options["tls_v1"] = True
        options["tls"] = tls
    return options


def valid_topic(name: str) -> str:
    """``name`` when it is a valid topic name, else a usage error naming the rule."""
    try:
        validate_topic(name)
    except InvalidName as err:
        raise UsageError(str(err)) from None
    return name


def valid_channel(name: str) -> str:
    """``name`` when it is a valid channel name, else a usage error naming the rule."""
    try:
        validate_channel(name)
    except InvalidName as err:
        raise UsageError(str(err)) from None
    return name


def lookupd_urls(addresses: Sequence[str]) -> list[str]:
    """``http://host:port`` of each ``--lookupd-http-address`` (a bad one is a usage error)."""
    urls = []
    for address in addresses:
        text = address if "://" in address else f"http://{address}"
        try:
            url = parse_http_url(text, DEFAULT_LOOKUPD_HTTP_PORT)
        except ValueError as err:
            raise UsageError(f"bad lookupd address {address!r}: {err}") from None
        urls.append(f"{url.scheme}://{format_address(url.host, url.port)}")
    return urls


def probe_tcp(address: str, what: str, timeout: float) -> None:
    """Fail fast with one clear line when an address does not answer."""
    try:
        host, port = parse_address(address, DEFAULT_TCP_PORT)
    except ValueError as err:
        raise UsageError(f"bad {what} address {address!r}: {err}") from None
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise CLIError(f"cannot connect to {what} {address}: {reason}") from None


#: The largest answer read from nsqlookupd (``/lookup``, ``/nodes``, ``/info``): the limit the
#: library's discovery applies.
LOOKUPD_ANSWER_LIMIT = MAX_RESPONSE_SIZE
#: The largest answer read from nsqd (``/stats`` without its client lists is a few hundred
#: bytes per channel: this is tens of thousands of channels).
NSQD_ANSWER_LIMIT = 16 * 1024 * 1024


def nsqd_admin(address: str, timeout: float) -> NSQDAdmin:
    """The admin client of one ``--nsqd-http-address`` (``host:port``, ``http://`` or
    ``https://``), each call bounded by ``timeout`` as a whole and its answer by
    :data:`NSQD_ANSWER_LIMIT`; a bad address is a usage error."""
    from transports.sync.admin import NSQDAdmin

    try:
        return NSQDAdmin(
            address,
            timeout=timeout,
            connect_timeout=timeout,
            max_response_size=NSQD_ANSWER_LIMIT,
        )
    except ConfigError as err:
        raise UsageError(f"bad nsqd HTTP address {address!r}: {err}") from None


def lookupd_admin(url: str, timeout: float) -> LookupdAdmin:
    """The admin client of one nsqlookupd (a URL of :func:`lookupd_urls`), each call bounded
    by ``timeout`` as a whole and its answer by :data:`LOOKUPD_ANSWER_LIMIT`."""
    from transports.sync.admin import LookupdAdmin

    try:
        return LookupdAdmin(
            url,
            timeout=timeout,
            connect_timeout=timeout,
            max_response_size=LOOKUPD_ANSWER_LIMIT,
        )
    except ConfigError as err:
        raise UsageError(f"bad lookupd address {url!r}: {err}") from None


_Answer = TypeVar("_Answer")


def admin_call(
    admin: NSQDAdmin | LookupdAdmin,
    path: str,
    call: Callable[..., _Answer],
    *args: Any,
    expected: tuple[type[Exception], ...] = (),
) -> _Answer:
    """``call(*args)`` (a method of ``admin`` that asks ``path``), its failure turned into one
    :class:`CLIError` line naming the URL: not reachable, an error status, an answer over its
    limit or not shaped as the API documents, no complete answer within the timeout. The
    ``expected`` errors (``TopicNotFound``...) are raised as they are."""
    from nsq_sansio.admin import AdminHTTPError

    url = f"{admin.endpoint}{path}"
    try:
        return call(*args)
    except expected:
        raise
    except AdminHTTPError as err:
        raise CLIError(f"{url}: HTTP {err.status} {err.message}".rstrip()) from None
    except ConnectionLost as err:
        cause = err.__cause__
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(err)
        raise CLIError(f"cannot reach {url}: {reason}") from None
    except RemoteProtocolError as err:  # AdminResponseError is one: the field is named
        raise CLIError(f"{url}: {err}") from None
    except TimeoutError as err:
        raise CLIError(f"{url}: {err or 'timed out'}") from None


def lookupd_nsqd_addresses(lookupd: Sequence[str], topic: str, timeout: float) -> list[str]:
    """nsqd TCP addresses to publish ``topic`` to, found through nsqlookupd: the nsqd that
    already have the topic (``/lookup``), else every nsqd registered (``/nodes``)."""
    from nsq_sansio.admin import TopicNotFound

    admins = [lookupd_admin(url, timeout) for url in lookupd]
    found: list[str] = []
    with contextlib.ExitStack() as stack:
        for admin in admins:
            stack.enter_context(admin)  # /lookup then /nodes on one connection
        for admin in admins:
            try:
                answer = admin_call(
                    admin, "/lookup", admin.lookup, topic, expected=(TopicNotFound,)
                )
            except TopicNotFound:  # no nsqd has the topic
                continue
            _add_new(found, (producer.tcp_address for producer in answer.producers))
        if not found:
            for admin in admins:
                _add_new(
                    found, (node.tcp_address for node in admin_call(admin, "/nodes", admin.nodes))
                )
    return found


def _add_new(found: list[str], addresses: Iterable[str]) -> None:
    """Append each of ``addresses`` not in ``found`` yet (first seen first)."""
    for address in addresses:
        if address not in found:
            found.append(address)


def check_sources(args: argparse.Namespace, timeout: float) -> tuple[list[str], list[str]]:
    """The nsqd and lookupd addresses of the flags, each checked to answer (one line if not)."""
    nsqd = list(args.nsqd_tcp_address)
    lookupd = lookupd_urls(args.lookupd_http_address)
    if not nsqd and not lookupd:
        raise UsageError("give --nsqd-tcp-address or --lookupd-http-address")
    for address in nsqd:
        probe_tcp(address, "nsqd", timeout)
    for url in lookupd:
        admin = lookupd_admin(url, timeout)
        admin_call(admin, "/info", admin.info)
    return nsqd, lookupd


@contextlib.contextmanager
def stop_on_signals() -> Iterator[threading.Event]:
    """An event set by SIGINT/SIGTERM (restored on the way out)."""
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def add_metrics_flag(parser: argparse.ArgumentParser) -> None:
    flag(
        parser,
        "metrics-address",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics of this command's client at http://HOST:PORT/metrics "
        "(needs the metrics extra)",
    )


def check_metrics_address(address: str | None) -> None:
    """Before anything connects: ``--metrics-address`` parses and its extra is installed."""
    if address is None:
        return
    _metrics_module()
    _, _, port = address.strip().rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise UsageError(f"bad --metrics-address {address!r}: give HOST:PORT or :PORT")


def _metrics_module() -> Any:
    try:
        import prometheus_client  # noqa: F401

        from transports import metrics
    except ImportError:
        raise CLIError(
            "--metrics-address needs prometheus-client: python -m pip install 'nsq-sansio[metrics]'"
        ) from None
    return metrics


def listen_failure(err: OSError, address: str, flag_name: str) -> CLIError:
    """One line naming the address a server could not listen on, its flag and the cause."""
    reason = err.strerror or describe_error(err)
    return CLIError(f"cannot listen on {address} ({flag_name}): {reason}")


@contextlib.contextmanager
def serving_metrics(address: str | None, client: Any) -> Iterator[None]:
    """Export ``client`` at ``address`` while the command runs (nothing when None)."""
    if address is None:
        yield
        return
    metrics = _metrics_module()
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    metrics.instrument(client, registry=registry)
    try:
        server, _ = metrics.start_http_server(address, registry)
    except ValueError as err:
        raise UsageError(f"bad --metrics-address: {err}") from None
    except OSError as err:
        raise listen_failure(err, address, "--metrics-address") from None
    host, port = server.server_address[:2]
    print(f"metrics: http://{format_address(host, port)}/metrics", file=sys.stderr, flush=True)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def add_progress_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action="store_true",
        help="show progress on stderr (redrawn on a terminal, a line every 2s otherwise)",
    )
