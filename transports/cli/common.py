"""What every ``nsq-sansio`` command shares: :class:`CLIError`, the flags (``--name`` with Go's
``-name`` spelling, nsqd/lookupd sources, connection and TLS options, metrics, progress), Go's
duration syntax, name validation, and the probes that fail fast with one clear line when an
address does not answer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import socket
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

from nsq_sansio.errors import InvalidName
from nsq_sansio.names import validate_channel, validate_topic
from transports._common import (
    DEFAULT_LOOKUPD_HTTP_PORT,
    DEFAULT_TCP_PORT,
    TLSOptions,
    format_address,
    parse_address,
    parse_http_url,
)

__all__ = [
    "CLIError",
    "add_client",
    "add_metrics_flag",
    "add_progress_flag",
    "add_sources",
    "check_sources",
    "client_options",
    "flag",
    "http_get_json",
    "lookupd_nsqd_addresses",
    "lookupd_urls",
    "parse_duration",
    "probe_tcp",
    "serving_metrics",
    "stop_on_signals",
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


class CLIError(Exception):
    """A failure worth one line on stderr and exit code 1."""


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
    group = parser.add_argument_group("connection")
    group.add_argument("--snappy", action="store_true", help="negotiate snappy compression")
    group.add_argument("--deflate", action="store_true", help="negotiate deflate compression")
    group.add_argument("--tls", action="store_true", help="negotiate TLS (server verified)")
    group.add_argument("--tls-root-ca-file", default=None, help="CA bundle to verify nsqd with")
    group.add_argument("--tls-cert", default=None, help="client certificate (PEM)")
    group.add_argument("--tls-key", default=None, help="client private key (PEM)")
    group.add_argument(
        "--tls-insecure-skip-verify", action="store_true", help="do not verify nsqd's certificate"
    )
    group.add_argument("--auth-secret", default=None, help="secret sent with AUTH")
    group.add_argument(
        "--connect-timeout", type=parse_duration, default=5.0, help="TCP connect + handshake"
    )


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {
        "snappy": args.snappy,
        "deflate": args.deflate,
        "connect_timeout": args.connect_timeout,
    }
    if args.auth_secret is not None:
        options["auth_secret"] = args.auth_secret.encode()
    if args.tls or args.tls_root_ca_file or args.tls_cert:
        options["tls_v1"] = True
        options["tls"] = TLSOptions(
            verify=not args.tls_insecure_skip_verify,
            ca_file=args.tls_root_ca_file,
            cert_file=args.tls_cert,
            key_file=args.tls_key,
        )
    return options


def valid_topic(name: str) -> str:
    try:
        validate_topic(name)
    except InvalidName as err:
        raise CLIError(str(err)) from None
    return name


def valid_channel(name: str) -> str:
    try:
        validate_channel(name)
    except InvalidName as err:
        raise CLIError(str(err)) from None
    return name


def lookupd_urls(addresses: Sequence[str]) -> list[str]:
    urls = []
    for address in addresses:
        text = address if "://" in address else f"http://{address}"
        url = parse_http_url(text, DEFAULT_LOOKUPD_HTTP_PORT)
        urls.append(f"{url.scheme}://{format_address(url.host, url.port)}")
    return urls


def probe_tcp(address: str, what: str, timeout: float) -> None:
    """Fail fast with one clear line when an address does not answer."""
    try:
        host, port = parse_address(address, DEFAULT_TCP_PORT)
    except ValueError as err:
        raise CLIError(f"bad {what} address {address!r}: {err}") from None
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise CLIError(f"cannot connect to {what} {address}: {reason}") from None


def http_get_json(url: str, timeout: float) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise CLIError(f"GET {url}: HTTP {err.code}") from None
    except (OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        raise CLIError(f"cannot reach {url}: {reason}") from None


def lookupd_nsqd_addresses(lookupd: Sequence[str], topic: str, timeout: float) -> list[str]:
    """nsqd TCP addresses to publish ``topic`` to, found through nsqlookupd: the nsqd that
    already have the topic (``/lookup``), else every nsqd registered (``/nodes``)."""

    def addresses(path: str) -> list[str]:
        found: list[str] = []
        for url in lookupd:
            try:
                data = http_get_json(f"{url}{path}", timeout)
            except CLIError:
                if path.startswith("/lookup"):  # 404: no nsqd has the topic (yet)
                    continue
                raise
            data = data.get("data", data)  # nsqlookupd before 1.0 wrapped the answer
            for producer in data.get("producers") or []:
                address = format_address(producer["broadcast_address"], int(producer["tcp_port"]))
                if address not in found:
                    found.append(address)
        return found

    return addresses(f"/lookup?topic={topic}") or addresses("/nodes")


def check_sources(args: argparse.Namespace, timeout: float) -> tuple[list[str], list[str]]:
    nsqd = list(args.nsqd_tcp_address)
    lookupd = lookupd_urls(args.lookupd_http_address)
    if not nsqd and not lookupd:
        raise CLIError("give --nsqd-tcp-address or --lookupd-http-address")
    for address in nsqd:
        probe_tcp(address, "nsqd", timeout)
    for url in lookupd:
        http_get_json(f"{url}/info", timeout)
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


@contextlib.contextmanager
def serving_metrics(address: str | None, client: Any) -> Iterator[None]:
    """Export ``client`` at ``address`` while the command runs (nothing when None)."""
    if address is None:
        yield
        return
    try:
        from prometheus_client import CollectorRegistry

        from transports import metrics
    except ImportError:
        raise CLIError(
            "--metrics-address needs prometheus-client: python -m pip install 'nsq-sansio[metrics]'"
        ) from None
    registry = CollectorRegistry()
    metrics.instrument(client, registry=registry)
    try:
        server, _ = metrics.start_http_server(address, registry)
    except ValueError as err:
        raise CLIError(str(err)) from None
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
