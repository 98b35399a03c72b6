"""``nsq-sansio nsqd`` and ``nsq-sansio lookupd``: the embedded servers from the command line,
with nsqd's and nsqlookupd's flag names.

``nsqd_main(argv)`` and ``lookupd_main(argv)`` parse flags (both ``--flag`` and Go's
``-flag`` spelling), start the server, print where it listens and serve until SIGINT or
SIGTERM. Durations take Go's syntax (``60s``, ``1m30s``, ``250ms``) or plain seconds.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from nsq_sansio.errors import NSQError
from nsq_sansio.server.lookupd import LOOKUPD_VERSION

from .common import (
    CLIError,
    CommandParser,
    UsageError,
    check_metrics_address,
    first_error,
    flag,
    listen_failure,
    non_negative,
    parse_duration,
    positive,
    reports_errors,
)

__all__ = [
    "build_lookupd_parser",
    "build_nsqd_parser",
    "lookupd_main",
    "nsqd_main",
    "nsqd_options_from_args",
]


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "t", "true", "yes", "on"):
        return True
    if lowered in ("0", "f", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r}")


def _tls_required(text: str) -> bool | str:
    """nsqd's --tls-required: a boolean, or ``tcp-https`` (TLS for TCP, plain HTTP allowed)."""
    if text.strip().lower() == "tcp-https":
        return "tcp-https"
    return _bool(text)


def _percentiles(text: str) -> list[float]:
    """nsqd's --e2e-processing-latency-percentile: floats, comma separated."""
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"could not parse {text!r} as numbers") from None
    for value in values:
        if not 0 < value <= 1:
            raise argparse.ArgumentTypeError(f"invalid E2E processing latency percentile: {value}")
    return values


def build_nsqd_parser() -> argparse.ArgumentParser:
    """``nsq-sansio nsqd``'s flags: nsqd's names, defaults and duration syntax."""
    p = CommandParser(prog="nsq-sansio nsqd", description="embedded nsqd")
    flag(p, "tcp-address", default="0.0.0.0:4150", help="<addr>:<port> for TCP clients")
    flag(p, "http-address", default="0.0.0.0:4151", help="<addr>:<port> for HTTP clients")
    flag(p, "https-address", default=None, help="<addr>:<port> for HTTPS (needs --tls-cert)")
    flag(p, "broadcast-address", default=None, help="address registered with lookupd")
    flag(
        p,
        "lookupd-tcp-address",
        action="append",
        default=[],
        help="lookupd TCP address (may be given multiple times)",
    )
    flag(
        p,
        "auth-http-address",
        action="append",
        default=[],
        help="<addr>:<port> or a full url to query auth server (may be given multiple times)",
    )
    flag(
        p,
        "http-client-connect-timeout",
        type=positive(parse_duration),
        default=2.0,
        metavar="DURATION",
        help="bound on connecting to the auth server or nsqlookupd's HTTP API (default 2s)",
    )
    flag(
        p,
        "http-client-request-timeout",
        type=positive(parse_duration),
        default=5.0,
        metavar="DURATION",
        help="bound on a request to the auth server, and on asking nsqlookupd for a new "
        "topic's channels (default 5s)",
    )
    flag(p, "data-path", default=None, help="directory for durable message storage")
    flag(
        p,
        "mem-queue-size",
        type=int,
        default=10000,
        help="messages kept in memory per topic and channel, the rest on disk (default 10000)",
    )
    flag(
        p,
        "max-msg-size",
        type=positive(int),
        default=1048576,
        help="largest message body in bytes (default 1048576)",
    )
    flag(
        p,
        "max-body-size",
        type=positive(int),
        default=5242880,
        help="largest command body in bytes, an MPUB's whole batch (default 5242880)",
    )
    flag(
        p,
        "max-rdy-count",
        type=positive(int),
        default=2500,
        help="largest RDY count a client may ask for (default 2500)",
    )
    flag(
        p,
        "max-channel-consumers",
        type=non_negative(int),
        default=0,
        help="most consumer connections per channel (default 0: no limit)",
    )
    flag(
        p,
        "msg-timeout",
        type=parse_duration,
        default=60.0,
        metavar="DURATION",
        help="time a client has to answer a message before it is requeued (default 1m)",
    )
    flag(
        p,
        "max-msg-timeout",
        type=parse_duration,
        default=900.0,
        metavar="DURATION",
        help="largest message timeout a client may ask for (default 15m)",
    )
    flag(
        p,
        "max-req-timeout",
        type=parse_duration,
        default=3600.0,
        metavar="DURATION",
        help="longest delay of a requeue or deferred publish (default 1h)",
    )
    flag(
        p,
        "client-timeout",
        type=parse_duration,
        default=60.0,
        metavar="DURATION",
        help="a client silent this long is disconnected (default 1m)",
    )
    flag(
        p,
        "max-heartbeat-interval",
        type=parse_duration,
        default=60.0,
        metavar="DURATION",
        help="longest heartbeat interval a client may ask for (default 1m)",
    )
    flag(
        p,
        "snappy",
        type=_bool,
        default=True,
        nargs="?",
        const=True,
        metavar="BOOL",
        help="let clients negotiate snappy compression (default true)",
    )
    flag(
        p,
        "deflate",
        type=_bool,
        default=True,
        nargs="?",
        const=True,
        metavar="BOOL",
        help="let clients negotiate deflate compression (default true)",
    )
    flag(
        p,
        "max-deflate-level",
        type=int,
        default=6,
        help="highest deflate level a client may ask for, 1-9 (default 6)",
    )
    flag(
        p,
        "node-id",
        type=int,
        default=0,
        help="this nsqd's part of message ids, 0-1023 (default 0)",
    )
    flag(
        p,
        "e2e-processing-latency-percentile",
        type=_percentiles,
        action="append",
        default=[],
        metavar="FLOAT[,FLOAT...]",
        help="message processing time percentiles, each within (0, 1], to report in /stats "
        "(may be given several times or comma separated: '1.0,0.99,0.95'; default none)",
    )
    flag(
        p,
        "e2e-processing-latency-window-time",
        type=positive(parse_duration),
        default=600.0,
        metavar="DURATION",
        help="the processing time percentiles cover about this much of the past (default 10m)",
    )
    flag(p, "tls-cert", default=None, help="path to a PEM certificate file (turns TLS on)")
    flag(p, "tls-key", default=None, help="path to its PEM private key file")
    flag(
        p,
        "tls-required",
        type=_tls_required,
        default=False,
        nargs="?",
        const=True,
        help="require TLS for client connections (true, false, tcp-https; needs --tls-cert)",
    )
    flag(
        p,
        "tls-root-ca-file",
        default=None,
        help="CA that client certificates must chain to (needs --tls-cert; default: the "
        "system's CAs)",
    )
    flag(
        p,
        "tls-client-auth-policy",
        choices=("require-verify",),
        default=None,
        help="'require-verify': clients must present a certificate signed by "
        "--tls-root-ca-file or the system's CAs; turns --tls-required on (needs --tls-cert)",
    )
    flag(
        p,
        "metrics-address",
        default=None,
        help="<addr>:<port> to serve Prometheus metrics of topics and channels at /metrics "
        "(needs the metrics extra; not an nsqd flag)",
    )
    flag(p, "version", action="store_true", help="print version and exit")
    return p


def build_lookupd_parser() -> argparse.ArgumentParser:
    """``nsq-sansio lookupd``'s flags: nsqlookupd's names, defaults and duration syntax."""
    p = CommandParser(prog="nsq-sansio lookupd", description="embedded nsqlookupd")
    flag(p, "tcp-address", default="0.0.0.0:4160", help="<addr>:<port> for TCP (nsqd) clients")
    flag(p, "http-address", default="0.0.0.0:4161", help="<addr>:<port> for HTTP clients")
    flag(p, "broadcast-address", default=None, help="address of this lookupd node")
    flag(
        p,
        "inactive-producer-timeout",
        type=positive(parse_duration),
        default=300.0,
        metavar="DURATION",
        help="an nsqd that has not pinged for this long leaves the active list (default 5m)",
    )
    flag(
        p,
        "tombstone-lifetime",
        type=positive(parse_duration),
        default=45.0,
        metavar="DURATION",
        help="how long a tombstoned nsqd stays hidden for its topic (default 45s)",
    )
    flag(p, "version", action="store_true", help="print version and exit")
    return p


_nsqd_parser = build_nsqd_parser  # the name tests of the embedded broker import
_lookupd_parser = build_lookupd_parser

# EmbeddedNSQD keyword -> the flag's dest
_NSQD_OPTIONS = {
    "tcp_address": "tcp_address",
    "http_address": "http_address",
    "https_address": "https_address",
    "broadcast_address": "broadcast_address",
    "lookupd_tcp_addresses": "lookupd_tcp_address",
    "auth_http_addresses": "auth_http_address",
    "auth_http_timeout": "http_client_request_timeout",
    "http_client_request_timeout": "http_client_request_timeout",
    "http_client_connect_timeout": "http_client_connect_timeout",
    "data_path": "data_path",
    "tls_cert": "tls_cert",
    "tls_key": "tls_key",
    "tls_required": "tls_required",
    "tls_root_ca_file": "tls_root_ca_file",
    "tls_client_auth_policy": "tls_client_auth_policy",
    "mem_queue_size": "mem_queue_size",
    "max_msg_size": "max_msg_size",
    "max_body_size": "max_body_size",
    "max_rdy_count": "max_rdy_count",
    "max_channel_consumers": "max_channel_consumers",
    "msg_timeout": "msg_timeout",
    "max_msg_timeout": "max_msg_timeout",
    "max_req_timeout": "max_req_timeout",
    "client_timeout": "client_timeout",
    "max_heartbeat_interval": "max_heartbeat_interval",
    "snappy": "snappy",
    "deflate": "deflate",
    "max_deflate_level": "max_deflate_level",
    "node_id": "node_id",
    "e2e_processing_latency_percentiles": "e2e_processing_latency_percentile",
    "e2e_processing_latency_window_time": "e2e_processing_latency_window_time",
}


def nsqd_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~transports.embedded.nsqd.EmbeddedNSQD` keyword arguments for parsed flags."""
    options = {keyword: getattr(args, dest) for keyword, dest in _NSQD_OPTIONS.items()}
    for keyword in ("lookupd_tcp_addresses", "auth_http_addresses"):
        options[keyword] = list(options[keyword])
    options["e2e_processing_latency_percentiles"] = tuple(
        value for given in options["e2e_processing_latency_percentiles"] for value in given
    )
    return options


def _with_flag_names(text: str) -> str:
    """An option error of the embedded server in the flags' words: ``NSQDOptions.msg_timeout``
    and ``tls_cert`` become ``--msg-timeout`` and ``--tls-cert``."""

    def flag_of(match: re.Match[str]) -> str:
        dest = _NSQD_OPTIONS.get(match.group(1), match.group(1))
        return "--" + dest.replace("_", "-")

    text = re.sub(r"\b(?:NSQDOptions|LookupdOptions)\.([a-z_]+)", flag_of, text)
    names = "|".join(sorted((k for k in _NSQD_OPTIONS if "_" in k), key=len, reverse=True))
    return re.sub(rf"(?<![-\w])({names})\b", flag_of, text)


def _start_failure(raised: BaseException) -> BaseException:
    """What a server that failed to start reports: one line naming the address it could not
    listen on, its flag and why (the server's :class:`ListenError` names them), a usage
    error for a bad option, else the error itself."""
    from transports.embedded.errors import ListenError

    err = first_error(raised)
    if isinstance(err, CLIError):
        return err
    if isinstance(err, ListenError):
        return listen_failure(err, err.address, "--" + err.option.replace("_", "-"))
    if isinstance(err, (ValueError, NSQError)) and not isinstance(err, OSError):
        return UsageError(_with_flag_names(str(err)))
    if isinstance(err, OSError):
        return CLIError(f"cannot start: {err}")
    return err


async def _serve_until_signal(server: Any, announce: Callable[[Any], None]) -> None:
    import anyio

    async with server:
        announce(server)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                return


def _serve(server: Any, announce: Callable[[Any], None]) -> None:
    """Run ``server`` until SIGINT/SIGTERM; a failure to start is one line (see
    :func:`_start_failure`), a failure while serving too."""
    import anyio

    started = False

    def announce_started(s: Any) -> None:
        nonlocal started
        announce(s)
        started = True

    try:
        anyio.run(_serve_until_signal, server, announce_started)
    except KeyboardInterrupt:
        pass
    except BaseException as raised:  # anyio's exception groups included
        err = first_error(raised)
        if isinstance(err, KeyboardInterrupt):
            return
        if not started:
            raise _start_failure(raised) from None
        if isinstance(err, (OSError, NSQError, ValueError)):
            raise CLIError(f"stopped: {err}") from None
        raise


@reports_errors("nsqd")
def nsqd_main(argv: Sequence[str] | None = None) -> int:
    """``nsq-sansio nsqd [flags]``: run an embedded nsqd until interrupted."""
    from nsq_sansio.server.options import DEFAULT_VERSION
    from transports.embedded.nsqd import EmbeddedNSQD

    args = build_nsqd_parser().parse_args(argv)
    if args.version:
        print(f"nsqd v{DEFAULT_VERSION} (nsq-sansio embedded)")
        return 0
    check_metrics_address(args.metrics_address)
    try:
        server = EmbeddedNSQD(**nsqd_options_from_args(args))
    except OSError as err:  # a certificate that cannot be loaded (the error names it)
        raise CLIError(f"cannot start: {err}") from None
    except (ValueError, NSQError) as err:
        raise UsageError(_with_flag_names(str(err))) from None

    metrics_servers: list[Any] = []

    def announce(s: EmbeddedNSQD) -> None:
        if args.metrics_address is not None:
            from transports.metrics import serve_nsqd_metrics

            try:
                metrics_server = serve_nsqd_metrics(args.metrics_address, [s.http_address])
            except OSError as err:
                raise listen_failure(err, args.metrics_address, "--metrics-address") from None
            metrics_servers.append(metrics_server)
        print(f"nsqd: TCP {s.tcp_address} HTTP {s.http_address}", file=sys.stderr, flush=True)
        for metrics_server in metrics_servers:
            host, port = metrics_server.server_address[:2]
            url = f"http://{host if ':' not in host else f'[{host}]'}:{port}/metrics"
            print(f"nsqd: metrics {url}", file=sys.stderr, flush=True)

    try:
        _serve(server, announce)
    finally:
        for metrics_server in metrics_servers:
            metrics_server.shutdown()
            metrics_server.server_close()
    return 0


@reports_errors("lookupd")
def lookupd_main(argv: Sequence[str] | None = None) -> int:
    """``nsq-sansio lookupd [flags]``: run an embedded nsqlookupd until interrupted."""
    from transports.embedded.lookupd import EmbeddedLookupd

    args = build_lookupd_parser().parse_args(argv)
    if args.version:
        print(f"nsqlookupd v{LOOKUPD_VERSION} (nsq-sansio embedded)")
        return 0
    try:
        server = EmbeddedLookupd(
            tcp_address=args.tcp_address,
            http_address=args.http_address,
            broadcast_address=args.broadcast_address,
            inactive_producer_timeout=args.inactive_producer_timeout,
            tombstone_lifetime=args.tombstone_lifetime,
        )
    except (ValueError, NSQError) as err:
        raise UsageError(_with_flag_names(str(err))) from None

    def announce(s: EmbeddedLookupd) -> None:
        print(f"nsqlookupd: TCP {s.tcp_address} HTTP {s.http_address}", file=sys.stderr, flush=True)

    _serve(server, announce)
    return 0
