"""``nsq-sansio nsqd`` and ``nsq-sansio lookupd``: the embedded servers from the command line,
with nsqd's and nsqlookupd's flag names.

``nsqd_main(argv)`` and ``lookupd_main(argv)`` parse flags (both ``--flag`` and Go's
``-flag`` spelling), start the server, print where it listens and serve until SIGINT or
SIGTERM. Durations take Go's syntax (``60s``, ``1m30s``, ``250ms``) or plain seconds.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from nsq_sansio.server.lookupd import LOOKUPD_VERSION

from .common import flag, parse_duration

__all__ = ["lookupd_main", "nsqd_main", "nsqd_options_from_args"]


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


def _nsqd_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nsq-sansio nsqd", description="embedded nsqd")
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
    flag(p, "http-client-request-timeout", type=parse_duration, default=5.0)
    flag(p, "data-path", default=None, help="directory for durable message storage")
    flag(p, "mem-queue-size", type=int, default=10000, help="messages kept in memory per queue")
    flag(p, "max-msg-size", type=int, default=1048576)
    flag(p, "max-body-size", type=int, default=5242880)
    flag(p, "max-rdy-count", type=int, default=2500)
    flag(p, "max-channel-consumers", type=int, default=0)
    flag(p, "msg-timeout", type=parse_duration, default=60.0)
    flag(p, "max-msg-timeout", type=parse_duration, default=900.0)
    flag(p, "max-req-timeout", type=parse_duration, default=3600.0)
    flag(p, "client-timeout", type=parse_duration, default=60.0)
    flag(p, "max-heartbeat-interval", type=parse_duration, default=60.0)
    flag(p, "snappy", type=_bool, default=True, nargs="?", const=True)
    flag(p, "deflate", type=_bool, default=True, nargs="?", const=True)
    flag(p, "max-deflate-level", type=int, default=6)
    flag(p, "node-id", type=int, default=0)
    flag(p, "tls-cert", default=None, help="path to a PEM certificate file")
    flag(p, "tls-key", default=None, help="path to a PEM private key file")
    flag(
        p,
        "tls-required",
        type=_tls_required,
        default=False,
        nargs="?",
        const=True,
        help="require TLS for client connections (true, false, tcp-https)",
    )
    flag(p, "tls-root-ca-file", default=None, help="CA that client certificates must chain to")
    flag(p, "tls-client-auth-policy", default=None, help="'require-verify' (client certificates)")
    flag(
        p,
        "metrics-address",
        default=None,
        help="<addr>:<port> to serve Prometheus metrics of topics and channels at /metrics "
        "(needs the metrics extra; not an nsqd flag)",
    )
    flag(p, "version", action="store_true", help="print version and exit")
    return p


def _lookupd_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nsq-sansio lookupd", description="embedded nsqlookupd")
    flag(p, "tcp-address", default="0.0.0.0:4160", help="<addr>:<port> for TCP (nsqd) clients")
    flag(p, "http-address", default="0.0.0.0:4161", help="<addr>:<port> for HTTP clients")
    flag(p, "broadcast-address", default=None, help="address of this lookupd node")
    flag(p, "inactive-producer-timeout", type=parse_duration, default=300.0)
    flag(p, "tombstone-lifetime", type=parse_duration, default=45.0)
    flag(p, "version", action="store_true", help="print version and exit")
    return p


def nsqd_options_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~transports.embedded.nsqd.EmbeddedNSQD` keyword arguments for parsed flags."""
    return {
        "tcp_address": args.tcp_address,
        "http_address": args.http_address,
        "https_address": args.https_address,
        "broadcast_address": args.broadcast_address,
        "lookupd_tcp_addresses": list(args.lookupd_tcp_address),
        "auth_http_addresses": list(args.auth_http_address),
        "auth_http_timeout": args.http_client_request_timeout,
        "data_path": args.data_path,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_required": args.tls_required,
        "tls_root_ca_file": args.tls_root_ca_file,
        "tls_client_auth_policy": args.tls_client_auth_policy,
        "mem_queue_size": args.mem_queue_size,
        "max_msg_size": args.max_msg_size,
        "max_body_size": args.max_body_size,
        "max_rdy_count": args.max_rdy_count,
        "max_channel_consumers": args.max_channel_consumers,
        "msg_timeout": args.msg_timeout,
        "max_msg_timeout": args.max_msg_timeout,
        "max_req_timeout": args.max_req_timeout,
        "client_timeout": args.client_timeout,
        "max_heartbeat_interval": args.max_heartbeat_interval,
        "snappy": args.snappy,
        "deflate": args.deflate,
        "max_deflate_level": args.max_deflate_level,
        "node_id": args.node_id,
    }


async def _serve_until_signal(server: Any, announce: Callable[[Any], None]) -> None:
    async with server:
        announce(server)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                return


def nsqd_main(argv: Sequence[str] | None = None) -> int:
    """``nsq-sansio nsqd [flags]``: run an embedded nsqd until interrupted."""
    from nsq_sansio.server.options import DEFAULT_VERSION
    from transports.embedded.nsqd import EmbeddedNSQD

    args = _nsqd_parser().parse_args(argv)
    if args.version:
        print(f"nsqd v{DEFAULT_VERSION} (nsq-sansio embedded)")
        return 0
    try:
        server = EmbeddedNSQD(**nsqd_options_from_args(args))
    except (ValueError, OSError) as err:
        print(f"nsqd: {err}", file=sys.stderr)
        return 2

    metrics_servers: list[Any] = []

    def announce(s: EmbeddedNSQD) -> None:
        print(f"nsqd: TCP {s.tcp_address} HTTP {s.http_address}", file=sys.stderr, flush=True)
        if args.metrics_address is not None:
            from transports.metrics import serve_nsqd_metrics

            metrics_server = serve_nsqd_metrics(args.metrics_address, [s.http_address])
            metrics_servers.append(metrics_server)
            host, port = metrics_server.server_address[:2]
            url = f"http://{host if ':' not in host else f'[{host}]'}:{port}/metrics"
            print(f"nsqd: metrics {url}", file=sys.stderr, flush=True)

    if args.metrics_address is not None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            print(
                "nsqd: --metrics-address needs prometheus-client: "
                "python -m pip install 'nsq-sansio[metrics]'",
                file=sys.stderr,
            )
            return 2
    try:
        anyio.run(_serve_until_signal, server, announce)
    except (OSError, ValueError) as err:
        print(f"nsqd: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        for metrics_server in metrics_servers:
            metrics_server.shutdown()
            metrics_server.server_close()
    return 0


def lookupd_main(argv: Sequence[str] | None = None) -> int:
    """``nsq-sansio lookupd [flags]``: run an embedded nsqlookupd until interrupted."""
    from transports.embedded.lookupd import EmbeddedLookupd

    args = _lookupd_parser().parse_args(argv)
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
    except ValueError as err:
        print(f"nsqlookupd: {err}", file=sys.stderr)
        return 2

    def announce(s: EmbeddedLookupd) -> None:
        print(f"nsqlookupd: TCP {s.tcp_address} HTTP {s.http_address}", file=sys.stderr, flush=True)

    try:
        anyio.run(_serve_until_signal, server, announce)
    except OSError as err:
        print(f"nsqlookupd: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
