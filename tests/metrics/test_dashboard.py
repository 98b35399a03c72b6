"""The Grafana dashboard shipped in docs/grafana/ queries only what the exporter produces: every
metric name and label of its queries is checked against the series collected from a live
instrumented consumer and producer and an :class:`NSQDCollector` over the embedded nsqd (the
end-to-end latency series against the real nsqd, which measures it); every family the exporter
has is on the dashboard; and the JSON is one Grafana can import (ids, grid, variables)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry

from nsq_sansio.errors import BadMessage
from transports import metrics
from transports.embedded import EmbeddedNSQD

pytestmark = pytest.mark.timeout(60)

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "nsq-sansio.json"

#: What Prometheus adds to every series it scrapes (the dashboard groups producers by them).
TARGET_LABELS = {"job", "instance"}
#: Series only an nsqd that measures end-to-end latency has (the embedded one does not).
E2E = re.compile(r"_e2e_latency_")

_METRIC = re.compile(r"\bnsq_[A-Za-z0-9_:]*[A-Za-z0-9_]")
_SELECTOR = re.compile(r"(?:\b(nsq_[A-Za-z0-9_:]+))?\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_LABEL_VALUES = re.compile(r"label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)$")
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")

Series = dict[str, set[str]]  # sample name -> the label names it has


def _dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return document


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _panel_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target."""
    return [
        (f"panel {panel['title']!r} {target['refId']}", target["expr"])
        for panel in _panels(dashboard)
        for target in panel.get("targets", [])
    ]


def _variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(variable name, its label_values(...) query) of every query variable."""
    return [
        (variable["name"], variable["query"]["query"])
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]


def _collect(registry: Any, series: Series) -> None:
    for family in registry.collect():
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)


def _exported_by_clients_and_embedded_nsqd(nsqd: EmbeddedNSQD) -> Series:
    """What one scrape gives with everything the exporter covers in use: an instrumented
    producer (with a refused publish) and consumer, and an NSQDCollector over the nsqd."""
    from transports.sync import Consumer, Producer
    from transports.sync.admin import NSQDAdmin

    registry = CollectorRegistry()
    with NSQDAdmin(nsqd.http_url) as admin:
        admin.create_topic("dash")
        admin.create_channel("dash", "panel")
    with Producer(nsqd.tcp_address) as producer:
        metrics.instrument(producer, registry=registry)
        producer.multi_publish("dash", [b"a", b"b", b"c"])
        producer.publish("dash", b"d")
        with pytest.raises(BadMessage, match="E_BAD_MESSAGE"):  # counted by error class
            producer.publish("dash", b"x" * (1024 * 1024 + 1))
        series: Series = {}
        with Consumer("dash", "panel", nsqd=[nsqd.tcp_address], max_in_flight=4) as consumer:
            metrics.instrument(consumer, registry=registry)
            for _ in range(4):
                msg = consumer.get(timeout=10)
                assert msg is not None
                msg.finish()
            _collect(registry, series)
    broker = CollectorRegistry()
    broker.register(metrics.NSQDCollector([nsqd.http_address]))
    _collect(broker, series)
    return series


def _check_query(where: str, expr: str, series: Series) -> list[str]:
    """What is wrong with one query: a metric name the exporter does not produce, a label a
    selector or a grouping names that its metrics do not have."""
    problems = []
    names = _METRIC.findall(expr)
    for name in names:
        if name not in series:
            problems.append(f"{where}: {name} is not exported")
    known = set().union(*(series.get(name, set()) for name in names)) | TARGET_LABELS
    for name, matchers in _SELECTOR.findall(expr):
        labels = series.get(name, set()) if name else set().union(*series.values())
        for label in _MATCHER.findall(matchers):
            if label != "__name__" and label not in labels:
                problems.append(f"{where}: {name or 'a selector'} has no label {label!r}")
    for grouping in _GROUPING.findall(expr):
        for label in filter(None, (part.strip() for part in grouping.split(","))):
            if label not in known:
                problems.append(f"{where}: groups by {label!r}, which {names} do not have")
    return problems


def test_every_query_of_the_dashboard_names_exported_series(nsqd: EmbeddedNSQD) -> None:
    dashboard = _dashboard()
    series = _exported_by_clients_and_embedded_nsqd(nsqd)
    queries = _panel_queries(dashboard)
    problems: list[str] = []
    for where, expr in queries:
        if not E2E.search(expr):
            problems += _check_query(where, expr, series)
    for name, query in _variable_queries(dashboard):
        match = _LABEL_VALUES.match(query)
        assert match is not None, f"variable {name}: {query}"
        problems += _check_query(f"variable {name}", match.group(1), series)
        selector_labels = set().union(*(series.get(n, set()) for n in _METRIC.findall(query)))
        if not _METRIC.findall(query):  # {__name__=~"nsq_.+"}: any of ours
            selector_labels = set().union(*series.values())
        if match.group(2) not in selector_labels:
            problems.append(f"variable {name}: no series has label {match.group(2)!r}")
    assert not problems, "\n".join(problems)
    # what was left to the real nsqd's test is exactly the end-to-end latency
    skipped = {name for _, expr in queries for name in _METRIC.findall(expr) if name not in series}
    assert skipped == {"nsq_channel_e2e_latency_seconds", "nsq_topic_e2e_latency_seconds"}


def test_every_exported_family_is_on_the_dashboard() -> None:
    """Nothing the exporter has is missing from the dashboard (lag included)."""
    queried = {name for _, expr in _panel_queries(_dashboard()) for name in _METRIC.findall(expr)}
    families = [
        *metrics.ClientCollector().describe(),
        *metrics.NSQDCollector([]).describe(),
    ]
    # a counter's samples end in _total, a histogram's in _bucket (_count and _sum derive)
    missing = [
        family.name
        for family in families
        if not any(name == family.name or name.startswith(family.name + "_") for name in queried)
    ]
    assert "nsq_channel_lag" in queried
    assert not missing, missing


def test_end_to_end_latency_queries_name_what_the_real_nsqd_gives() -> None:
    """The latency panel against an nsqd that measures it (the real one; skipped without)."""
    from transports.sync import Consumer, Producer
    from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries

    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    e2e = [(where, expr) for where, expr in _panel_queries(_dashboard()) if E2E.search(expr)]
    assert e2e
    with RealNSQD(["--e2e-processing-latency-percentile=0.99,0.5"]) as real:
        with Producer(real.tcp_address) as producer:
            producer.publish("dash", b"a")
        with Consumer("dash", "panel", nsqd=[real.tcp_address]) as consumer:
            msg = consumer.get(timeout=10)
            assert msg is not None
            msg.finish()
        collector = metrics.NSQDCollector([real.http_address])
        series: Series = {}
        deadline = time.monotonic() + 10
        while "nsq_channel_e2e_latency_seconds" not in series:  # once nsqd counted the FIN
            assert time.monotonic() < deadline, "no latency from nsqd"
            time.sleep(0.01)
            series.clear()
            for family in collector.collect():
                for sample in family.samples:
                    series.setdefault(sample.name, set()).update(sample.labels)
        problems = [p for where, expr in e2e for p in _check_query(where, expr, series)]
    assert not problems, "\n".join(problems)


def test_the_dashboard_is_importable() -> None:
    """Ids unique, panels on the 24-column grid without overlapping, every query against the
    dashboard's Prometheus variable, every variable used defined."""
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    panels = list(_panels(dashboard))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & mine, f"{panel['title']!r} overlaps another panel"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert panel.get("description"), f"{panel['title']!r} says what it shows"
    defined = {variable["name"] for variable in dashboard["templating"]["list"]}
    text = json.dumps(dashboard)
    used = {name for name in _VARIABLE.findall(text) if not name.startswith("__")}
    assert used <= defined, used - defined
    assert "datasource" in defined
