"""Parse and check the data source's options (Spark hands them over as strings).

Every problem raises :class:`NSQOptionError` naming the option, the value and what is allowed,
on the driver, before any task starts.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from nsq_sansio.config import Config
from nsq_sansio.discovery import LookupdAddress, NSQDAddress
from nsq_sansio.errors import ConfigError
from nsq_sansio.names import validate_channel, validate_topic

__all__ = ["PARTITION_BYTES_CEILING", "NSQOptionError", "ReadOptions", "WriteOptions"]

#: The largest ``max_partition_bytes`` allowed: a Spark task carries its partition's rows, and
#: Spark refuses a task above ``spark.rpc.message.maxSize`` (128 MiB by default); a quarter of
#: it leaves room for the task's own serialisation and for a lowered setting.
PARTITION_BYTES_CEILING = 32 << 20

#: Option values never shown (repr, logs, errors): they are secrets.
_SECRETS = ("auth_secret", "tls_key_password")

_COMMON = {
    "topic",
    "nsqd",
    "lookupd",
    "connect_timeout",
    "auth_secret",
    "snappy",
    "deflate",
    "deflate_level",
    "heartbeat_interval",
    "user_agent",
    "client_id",
    "output_buffer_size",
    "output_buffer_timeout",
    "tls_v1",
    "tls_verify",
    "tls_ca_file",
    "tls_ca_data",
    "tls_cert_file",
    "tls_key_file",
    "tls_key_password",
    "tls_server_name",
    "path",  # .save(path) / .load(path) pass a "path" option; rejected with a message below
    "checkpointlocation",  # writeStream passes it to the sink too; Spark's business, ignored
}
_WRITE = {"batch_size", "batch_bytes", "serialization", "max_pending", "timeout", "arrow"}
_READ = {
    "channel",
    "max_in_flight",
    "max_messages_per_trigger",
    "maxrecordspertrigger",  # Kafka's spelling of the same limit
    "max_partition_bytes",
    "nsqd_http",
    "fail_on_data_loss",
    "failondataloss",  # Kafka's spelling
    "wait_timeout",
    "linger",
    "msg_timeout",
    "touch_interval",
    "lookupd_poll_interval",
    "partitions",
    "gc_threshold",
}


#: Every option of the source, in the order the reference lists them.
READ_OPTIONS: tuple[str, ...] = (
    "topic",
    "channel",
    "nsqd",
    "lookupd",
    "nsqd_http",
    "max_in_flight",
    "max_messages_per_trigger",
    "maxrecordspertrigger",
    "partitions",
    "max_partition_bytes",
    "wait_timeout",
    "linger",
    "fail_on_data_loss",
    "failondataloss",
    "msg_timeout",
    "touch_interval",
    "lookupd_poll_interval",
    "gc_threshold",
)
#: Every option of the sink (batch and streaming), in the order the reference lists them.
WRITE_OPTIONS: tuple[str, ...] = (
    "topic",
    "nsqd",
    "lookupd",
    "batch_size",
    "batch_bytes",
    "max_pending",
    "serialization",
    "arrow",
    "timeout",
)
#: The connection options both accept (the client's ``Config`` and TLS settings).
CONNECTION_OPTIONS: tuple[str, ...] = (
    "connect_timeout",
    "auth_secret",
    "snappy",
    "deflate",
    "deflate_level",
    "heartbeat_interval",
    "user_agent",
    "client_id",
    "output_buffer_size",
    "output_buffer_timeout",
    "tls_v1",
    "tls_ca_file",
    "tls_ca_data",
    "tls_cert_file",
    "tls_key_file",
    "tls_key_password",
    "tls_server_name",
    "tls_verify",
)

#: What each option means; the reference's tables are generated from this and from the parser
#: below (names, defaults, ranges), and a test checks that every accepted option is described.
OPTION_DOCS: Mapping[str, str] = {
    "topic": "Topic to read or publish to.",
    "channel": "Channel the source subscribes to (create it before publishing if earlier "
    "messages matter: a channel receives what is published after it exists).",
    "nsqd": "Comma-separated nsqd TCP addresses (`host:4150`). One of `nsqd` and `lookupd` is "
    "required.",
    "lookupd": "Comma-separated nsqlookupd HTTP addresses (`http://host:4161`): the source polls "
    "them every `lookupd_poll_interval`, the sink asks them for their nodes once.",
    "max_in_flight": "Messages in flight over all connections (held for the current batch and "
    "fetched ahead). Above nsqd's `--max-rdy-count` (2500) the source runs several consumers, "
    "so several connections per nsqd (up to 64).",
    "max_messages_per_trigger": "Upper bound of a micro-batch; at most `max_in_flight`. When "
    "`max_in_flight` is larger, the rest (up to one more batch) is fetched while Spark runs a "
    "batch.",
    "maxrecordspertrigger": "Kafka's spelling of `max_messages_per_trigger` (options are "
    "case-insensitive: `maxRecordsPerTrigger`); give one of the two.",
    "nsqd_http": "Each nsqd's HTTP address, in the order of `nsqd`, for `/stats` and `/config` "
    "(`availableNow`'s depth, the lag, the restart, the message size check). Without it: the "
    "lookupd's answer (its `http_port`) with `lookupd`, else the TCP port + 1 if that answers "
    "`/info` with the right TCP port (nsqd's default layout, 4150 and 4151).",
    "max_partition_bytes": "Most bytes of rows per Spark task (a micro-batch is cut by count, "
    "then by bytes), far below `spark.rpc.message.maxSize` (the Spark guide's "
    "*Bytes per task* explains the cap).",
    "fail_on_data_loss": "`true`: fail the query when nsqd took back a batch's message (it "
    "timed out) before Spark committed the batch; `false`: the log and the lag count it.",
    "failondataloss": "Kafka's spelling of `fail_on_data_loss` (`failOnDataLoss`); give one of "
    "the two.",
    "wait_timeout": "Seconds a trigger waits for its first message (long poll); "
    "`availableNow` stops after one empty wait.",
    "linger": "After the first message, seconds to wait for more before closing the batch; a "
    "big batch needs time to fill (100,000 messages: about 0.5 s).",
    "msg_timeout": "Message timeout asked of nsqd for the source's connections (IDENTIFY), in "
    "seconds: after a crash, held messages are back in the channel this soon.",
    "touch_interval": "Seconds between TOUCH sweeps of the messages the source holds.",
    "lookupd_poll_interval": "Seconds between nsqlookupd polls.",
    "partitions": "Spark partitions a micro-batch is split into.",
    "gc_threshold": "While the source runs, CPython's cyclic garbage collector's first "
    "threshold is raised to this (never lowered; put back when the source stops; 0 leaves it "
    "alone): with the default (700), full collections walking the held batch took about half "
    "of the source's CPU.",
    "batch_size": "Messages per MPUB, at most.",
    "batch_bytes": "Bytes per MPUB, at most (keep it under nsqd's `--max-body-size`, 5 MiB by "
    "default).",
    "max_pending": "MPUBs in flight per partition before waiting for answers.",
    "serialization": "`none`: publish the `body` column (binary or string, the only column "
    "allowed); `json`: publish each row as a JSON object of all its columns.",
    "arrow": "Use the Arrow writer (record batches, faster) rather than the row writer.",
    "timeout": "Seconds to wait for nsqd's answer to a publish.",
    "connect_timeout": "Seconds for a TCP connect (and, for the source, to subscribe on at "
    "least one nsqd given with `nsqd`).",
    "auth_secret": "Secret sent with AUTH when nsqd requires it.",
    "snappy": "Negotiate snappy compression (exclusive with `deflate`).",
    "deflate": "Negotiate deflate compression (exclusive with `snappy`).",
    "deflate_level": "Deflate level asked for (nsqd caps it at its `--max-deflate-level`).",
    "heartbeat_interval": "Seconds between nsqd's heartbeats.",
    "user_agent": "Sent in IDENTIFY; shows in nsqd's `/stats`.",
    "client_id": "Sent in IDENTIFY to name this client.",
    "output_buffer_size": "nsqd's output buffer for the connection, in bytes (-1 disables "
    "buffering).",
    "output_buffer_timeout": "nsqd's output flush timeout, in seconds (-1 disables it).",
    "tls_v1": "TLS to nsqd, verified against the system's trust store (any other `tls_*` "
    "option turns TLS on too; `tls_v1=false` with one of them is refused).",
    "tls_ca_file": "A private CA (PEM file) instead of the system's; also used for an "
    "`https://` nsqlookupd. Files must exist at the same path on the driver and every executor.",
    "tls_ca_data": "A private CA as PEM text.",
    "tls_cert_file": "Client certificate to present (nsqd's `--tls-client-auth-policy`).",
    "tls_key_file": "Private key of the client certificate.",
    "tls_key_password": "Password of the private key.",
    "tls_server_name": "Name checked against nsqd's certificate (default: the host connected to).",
    "tls_verify": "`false` accepts any certificate (tests only).",
}

#: The values of the ``serialization`` option.
SERIALIZATIONS = ("none", "json")

#: Defaults that are not a constant of the parser, as the reference shows them.
OPTION_DEFAULTS: Mapping[str, str] = {
    "topic": "required",
    "channel": "required",
    "nsqd": "one of the two",
    "lookupd": "one of the two",
    "max_messages_per_trigger": "`max_in_flight`",
    "maxrecordspertrigger": "as `max_messages_per_trigger`",
    "failondataloss": "as `fail_on_data_loss`",
    "nsqd_http": "found (see meaning)",
    "touch_interval": "`msg_timeout / 3`",
    "auth_secret": "none",
    "user_agent": "`nsq-sansio/<version>`",
    "client_id": "none",
    "tls_ca_file": "system CAs",
    "tls_ca_data": "none",
    "tls_cert_file": "none",
    "tls_key_file": "none",
    "tls_key_password": "none",
    "tls_server_name": "the host",
    "snappy": "`false`",
    "deflate": "`false`",
    "tls_v1": "`false`",
    "serialization": "`none`",
}

#: TLS options passed to the transports as given (file paths, PEM text, names).
_TLS_TEXT = (
    "tls_ca_file",
    "tls_ca_data",
    "tls_cert_file",
    "tls_key_file",
    "tls_key_password",
    "tls_server_name",
)


class NSQOptionError(ValueError):
    """A data source option is missing, unknown or out of range."""


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _addresses(text: str | None) -> list[str]:
    if text is None:
        return []
    return [part.strip() for part in text.split(",") if part.strip()]


def _int(opts: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    text = opts.get(name)
    if text is None:
        return default
    try:
        value = int(text.strip())
    except ValueError:
        raise NSQOptionError(f"option {name}={text!r} must be an integer") from None
    if not low <= value <= high:
        raise NSQOptionError(f"option {name}={value} is out of range {low}..{high}")
    return value


def _float(opts: dict[str, str], name: str, default: float, low: float, high: float) -> float:
    text = opts.get(name)
    if text is None:
        return default
    try:
        value = float(text.strip())
    except ValueError:
        raise NSQOptionError(f"option {name}={text!r} must be a number (seconds)") from None
    if not low <= value <= high:
        raise NSQOptionError(f"option {name}={value} is out of range {low}..{high}")
    return value


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    text = opts.get(name)
    if text is None:
        return default
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise NSQOptionError(f"option {name}={text!r} must be true or false")


def _redacted(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every secret replaced by ``'***'`` (PEM text by its size)."""
    shown: dict[str, Any] = {}
    for name, value in values.items():
        if name in _SECRETS:
            shown[name] = "***"
        elif name == "tls_ca_data":
            shown[name] = f"<{len(str(value))} characters of PEM>"
        else:
            shown[name] = value
    return shown


@dataclass(frozen=True, repr=False)
class _Common:
    topic: str
    nsqd: tuple[str, ...]
    lookupd: tuple[str, ...]
    connect_timeout: float
    config_kwargs: dict[str, Any] = field(default_factory=dict)
    #: TLS options for the transports (``tls_ca_file``...), under the transports' names.
    tls_kwargs: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        """Every field, secrets hidden (an option's repr may end up in a log or a plan)."""
        parts = []
        for item in fields(self):
            value = getattr(self, item.name)
            if isinstance(value, dict):
                value = _redacted(value)
            parts.append(f"{item.name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _scrub(self, text: str) -> str:
        """``text`` with every secret option value replaced by ``***``."""
        for name in _SECRETS:
            value = self.config_kwargs.get(name, self.tls_kwargs.get(name))
            if isinstance(value, bytes):
                value = value.decode(errors="replace")
            if value:
                text = text.replace(str(value), "***")
        return text

    def config(self, **extra: Any) -> Config:
        try:
            return Config().replace(**self.config_kwargs, **extra)
        except ConfigError as exc:
            raise NSQOptionError(f"bad NSQ option: {self._scrub(str(exc))}") from None

    def https_context(self) -> ssl.SSLContext | None:
        """The TLS options' context for ``https://`` addresses (None: urllib's default)."""
        if not self.tls_kwargs:
            return None
        from transports._common import split_options

        _, transport = split_options(self.config(), dict(self.tls_kwargs))
        context: ssl.SSLContext = transport.ssl_context()
        return context

    def client_kwargs(self, **extra: Any) -> dict[str, Any]:
        """Keyword arguments for the blocking Producer/Consumer: ``config`` (a
        :class:`~nsq_sansio.config.Config`), ``connect_timeout`` and the TLS options."""
        return {
            "config": self.config(**extra),
            "connect_timeout": self.connect_timeout,
            **self.tls_kwargs,
        }

    def check_client_options(self, **extra: Any) -> None:
        """Raise NSQOptionError now (on the driver) if the transports would refuse them."""
        from transports._common import split_options

        options = {"connect_timeout": self.connect_timeout, **self.tls_kwargs}
        try:
            split_options(self.config(**extra), options)
        except (ConfigError, ValueError, TypeError) as exc:
            raise NSQOptionError(f"bad NSQ option: {self._scrub(str(exc))}") from None


def _common(opts: dict[str, str], allowed: set[str], role: str) -> dict[str, Any]:
    unknown = sorted(set(opts) - allowed)
    if "path" in opts:
        raise NSQOptionError(
            "the nsq format takes no path: give the topic with .option('topic', ...) "
            "and call .save() / .load() / .start() without arguments"
        )
    if unknown:
        raise NSQOptionError(
            f"unknown option(s) for nsq {role}: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(allowed - {'path', 'checkpointlocation'}))})"
        )
    topic = opts.get("topic")
    if not topic:
        raise NSQOptionError(f"nsq {role} needs .option('topic', '<topic name>')")
    try:
        validate_topic(topic)
    except ValueError as exc:
        raise NSQOptionError(f"option topic={topic!r}: {exc}") from None
    nsqd = _addresses(opts.get("nsqd"))
    lookupd = _addresses(opts.get("lookupd"))
    if not nsqd and not lookupd:
        raise NSQOptionError(
            f"nsq {role} needs .option('nsqd', 'host:4150,host2:4150') (TCP addresses) or "
            ".option('lookupd', 'http://host:4161') (nsqlookupd HTTP addresses)"
        )
    try:
        nsqd = [str(NSQDAddress.parse(a)) for a in nsqd]
        for address in lookupd:
            LookupdAddress.parse(address)
    except ConfigError as exc:
        raise NSQOptionError(f"bad address option: {exc}") from None
    kwargs: dict[str, Any] = {}
    if "auth_secret" in opts:
        kwargs["auth_secret"] = opts["auth_secret"].encode()
    for name in ("snappy", "deflate"):
        if name in opts:
            kwargs[name] = _bool(opts, name, False)
    if "deflate_level" in opts:
        kwargs["deflate_level"] = _int(opts, "deflate_level", 6, 1, 9)
    if "heartbeat_interval" in opts:
        kwargs["heartbeat_interval"] = _float(opts, "heartbeat_interval", 30.0, 1.0, 300.0)
    for name in ("user_agent", "client_id"):
        if name in opts:
            kwargs[name] = opts[name]
    if "output_buffer_size" in opts:
        kwargs["output_buffer_size"] = _int(opts, "output_buffer_size", 16384, -1, 1 << 30)
    if "output_buffer_timeout" in opts:
        kwargs["output_buffer_timeout"] = _float(opts, "output_buffer_timeout", 0.25, -1.0, 60.0)
    tls: dict[str, Any] = {}
    if "tls_v1" in opts:
        kwargs["tls_v1"] = _bool(opts, "tls_v1", False)
    if "tls_verify" in opts:
        tls["tls_verify"] = _bool(opts, "tls_verify", True)
    for name in _TLS_TEXT:
        if name in opts:
            tls[name] = opts[name]
    if tls and kwargs.get("tls_v1") is False:
        raise NSQOptionError(
            f"option tls_v1=false contradicts {', '.join(sorted(tls))}: drop tls_v1 "
            "(any tls_* option turns TLS on) or the tls_* options"
        )
    return {
        "topic": topic,
        "nsqd": tuple(nsqd),
        "lookupd": tuple(lookupd),
        "connect_timeout": _float(opts, "connect_timeout", 5.0, 0.1, 600.0),
        "config_kwargs": kwargs,
        "tls_kwargs": tls,
    }


def _alias(opts: dict[str, str], alias: str, name: str) -> None:
    """Accept ``alias`` (Kafka's spelling) for option ``name``; both at once is an error."""
    if alias in opts:
        if name in opts:
            raise NSQOptionError(f"options {name} and {alias} are the same: give one")
        opts[name] = opts.pop(alias)


def _nsqd_http(opts: dict[str, str], nsqd: tuple[str, ...]) -> tuple[str, ...]:
    addresses = tuple(_addresses(opts.get("nsqd_http")))
    if addresses and len(addresses) != len(nsqd):
        raise NSQOptionError(
            f"option nsqd_http lists {len(addresses)} HTTP addresses for the {len(nsqd)} nsqd "
            "of option nsqd: give one per nsqd, in the same order"
        )
    return addresses


@dataclass(frozen=True, repr=False)
class WriteOptions(_Common):
    """Options of ``df.write.format("nsq")`` and ``writeStream.format("nsq")``."""

    batch_size: int = 1000
    batch_bytes: int = 1 << 20
    serialization: str = "none"
    max_pending: int = 8
    timeout: float = 30.0
    arrow: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        """Check the sink's options as Spark hands them over (strings, any case) and return
        them typed; raises :class:`NSQOptionError` naming the option."""
        opts = _lower(options)
        common = _common(opts, _COMMON | _WRITE, "sink")
        serialization = opts.get("serialization", "none").strip().lower()
        if serialization not in SERIALIZATIONS:
            raise NSQOptionError(
                f"option serialization={serialization!r}: use 'none' (publish the 'body' column) "
                "or 'json' (publish each row as a JSON object)"
            )
        result = cls(
            **common,
            batch_size=_int(opts, "batch_size", 1000, 1, 1_000_000),
            batch_bytes=_int(opts, "batch_bytes", 1 << 20, 1, 1 << 30),
            serialization=serialization,
            max_pending=_int(opts, "max_pending", 8, 1, 10_000),
            timeout=_float(opts, "timeout", 30.0, 0.1, 3600.0),
            arrow=_bool(opts, "arrow", True),
        )
        result.check_client_options()  # check the NSQ settings now, on the driver
        return result


@dataclass(frozen=True, repr=False)
class ReadOptions(_Common):
    """Options of ``spark.readStream.format("nsq")``."""

    channel: str = ""
    max_in_flight: int = 1000
    max_messages_per_trigger: int = 1000
    wait_timeout: float = 1.0
    linger: float = 0.05
    msg_timeout: float | None = 20.0
    touch_interval: float | None = None
    lookupd_poll_interval: float = 60.0
    partitions: int = 1
    max_partition_bytes: int = 8 << 20
    gc_threshold: int = 50_000
    #: nsqd HTTP addresses, in the order of ``nsqd`` (for /stats and /config)
    nsqd_http: tuple[str, ...] = ()
    fail_on_data_loss: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        """Check the source's options as Spark hands them over (strings, any case) and return
        them typed; raises :class:`NSQOptionError` naming the option."""
        opts = _lower(options)
        common = _common(opts, _COMMON | _READ, "source")
        channel = opts.get("channel")
        if not channel:
            raise NSQOptionError("nsq source needs .option('channel', '<channel name>')")
        try:
            validate_channel(channel)
        except ValueError as exc:
            raise NSQOptionError(f"option channel={channel!r}: {exc}") from None
        max_in_flight = _int(opts, "max_in_flight", 1000, 1, 1_000_000)
        _alias(opts, "maxrecordspertrigger", "max_messages_per_trigger")
        _alias(opts, "failondataloss", "fail_on_data_loss")
        per_trigger = _int(opts, "max_messages_per_trigger", max_in_flight, 1, 10_000_000)
        if per_trigger > max_in_flight:
            raise NSQOptionError(
                f"option max_messages_per_trigger={per_trigger} exceeds max_in_flight="
                f"{max_in_flight}: a micro-batch holds its messages in flight until Spark "
                "commits it, so it can never be larger than max_in_flight"
            )
        touch = opts.get("touch_interval")
        result = cls(
            **common,
            channel=channel,
            max_in_flight=max_in_flight,
            max_messages_per_trigger=per_trigger,
            wait_timeout=_float(opts, "wait_timeout", 1.0, 0.0, 3600.0),
            linger=_float(opts, "linger", 0.05, 0.0, 60.0),
            msg_timeout=_float(opts, "msg_timeout", 20.0, 1.0, 3600.0),
            touch_interval=None if touch is None else _float(opts, "touch_interval", 10, 0.1, 3600),
            lookupd_poll_interval=_float(opts, "lookupd_poll_interval", 60.0, 0.1, 300.0),
            partitions=_int(opts, "partitions", 1, 1, 10_000),
            max_partition_bytes=_int(
                opts, "max_partition_bytes", 8 << 20, 64 << 10, PARTITION_BYTES_CEILING
            ),
            gc_threshold=_int(opts, "gc_threshold", 50_000, 0, 100_000_000),
            nsqd_http=_nsqd_http(opts, common["nsqd"]),
            fail_on_data_loss=_bool(opts, "fail_on_data_loss", False),
        )
        result.check_client_options(**result._consumer_settings(max_in_flight))
        return result

    def _consumer_settings(self, max_in_flight: int) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "max_in_flight": max_in_flight,
            # The source never gives a message up (a give-up FINs it unread) and never backs
            # off (it only REQs when closing).
            "max_attempts": 0,
            "backoff_enabled": False,
            "lookupd_poll_interval": self.lookupd_poll_interval,
        }
        if self.msg_timeout is not None:
            settings["msg_timeout"] = self.msg_timeout
            # Messages nsqd sent after a fetch was filled wait for the next trigger (a batch
            # away), untouched: keep them half a msg_timeout rather than the default 1 s
            # (after which they would be requeued, and come back with attempts + 1).
            settings["pull_hold_timeout"] = min(self.msg_timeout / 2, 60.0)
        return settings

    def consumer_kwargs(self, max_in_flight: int) -> dict[str, Any]:
        """Keyword arguments of one pull-mode :class:`transports.sync.Consumer` of the source."""
        return self.client_kwargs(**self._consumer_settings(max_in_flight))
