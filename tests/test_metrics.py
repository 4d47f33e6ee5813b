"""DriverMetrics: exact values in an explicit registry, closed label sets, timing."""

from __future__ import annotations

import time

import prometheus_client as prom
import pytest
import structlog
import structlog.testing

from dra_driver import metrics


@pytest.fixture
def m() -> metrics.DriverMetrics:
    return metrics.new()


def value(m: metrics.DriverMetrics, name: str, **labels: str) -> float:
    got = m.registry.get_sample_value(name, labels)
    assert got is not None, f"no sample {name}{labels}"
    return got


def test_series_exist_at_zero_before_any_request(m: metrics.DriverMetrics) -> None:
    for op in ("prepare", "unprepare"):
        for result in ("success", "error"):
            assert value(m, "dra_driver_requests_total", operation=op, result=result) == 0
        assert value(m, "dra_driver_requests_in_flight", operation=op) == 0
        assert value(m, "dra_driver_request_duration_seconds_count", operation=op) == 0
    assert value(m, "dra_driver_resourceslice_publish_total", result="error") == 0
    assert value(m, "dra_driver_build_info", version=metrics.__version__) == 1


def test_request_counts_success_and_times_it(m: metrics.DriverMetrics) -> None:
    with m.request("prepare"):
        assert value(m, "dra_driver_requests_in_flight", operation="prepare") == 1
        time.sleep(0.002)
    assert value(m, "dra_driver_requests_in_flight", operation="prepare") == 0
    assert value(m, "dra_driver_requests_total", operation="prepare", result="success") == 1
    assert value(m, "dra_driver_requests_total", operation="prepare", result="error") == 0
    total = value(m, "dra_driver_request_duration_seconds_sum", operation="prepare")
    assert 0.002 <= total < 1.0
    # 2 ms lands above the 1 ms bucket and inside the 2.5 ms.. buckets
    assert (
        value(m, "dra_driver_request_duration_seconds_bucket", operation="prepare", le="0.001") == 0
    )
    assert (
        value(m, "dra_driver_request_duration_seconds_bucket", operation="prepare", le="45.0") == 1
    )


def test_exception_counts_error_and_propagates(m: metrics.DriverMetrics) -> None:
    with pytest.raises(RuntimeError), m.request("unprepare"):
        raise RuntimeError("boom")
    assert value(m, "dra_driver_requests_total", operation="unprepare", result="error") == 1
    assert value(m, "dra_driver_requests_in_flight", operation="unprepare") == 0


def test_fail_marks_error_without_exception(m: metrics.DriverMetrics) -> None:
    with m.request("prepare") as req:
        req.fail()
    assert value(m, "dra_driver_requests_total", operation="prepare", result="error") == 1
    assert value(m, "dra_driver_requests_total", operation="prepare", result="success") == 0


def test_buckets_resolve_milliseconds() -> None:
    assert metrics.DURATION_BUCKETS[0] <= 0.0005
    assert 0.001 in metrics.DURATION_BUCKETS and 5.0 in metrics.DURATION_BUCKETS
    assert list(metrics.DURATION_BUCKETS) == sorted(metrics.DURATION_BUCKETS)


def test_prepared_state_slices_and_nvml(m: metrics.DriverMetrics) -> None:
    m.set_prepared(claims=3, devices=5)
    m.slice_publish(ok=True, slices=2)
    m.slice_publish(ok=False, slices=7)  # a failed pass does not change the published count
    m.nvml_error("discover")
    m.nvml_error("discover")
    assert value(m, "dra_driver_prepared_claims") == 3
    assert value(m, "dra_driver_prepared_devices") == 5
    assert value(m, "dra_driver_resourceslices") == 2
    assert value(m, "dra_driver_resourceslice_publish_total", result="success") == 1
    assert value(m, "dra_driver_resourceslice_publish_total", result="error") == 1
    assert value(m, "dra_driver_nvml_errors_total", call="discover") == 2


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda m: m.observe_request("allocate", result="success", seconds=0.1), "operation"),
        (lambda m: m.observe_request("prepare", result="maybe", seconds=0.1), "result"),
        (lambda m: m.observe_request("prepare", result="success", seconds=-1), "negative"),
        (lambda m: m.set_prepared(claims=-1, devices=0), "negative"),
        (lambda m: m.nvml_error(""), "1-64"),
    ],
)
def test_bad_values_are_refused_with_a_clear_error(
    m: metrics.DriverMetrics, call: object, match: str
) -> None:
    with pytest.raises(metrics.MetricsError, match=match):
        call(m)  # type: ignore[operator]


def test_two_instances_do_not_collide_and_global_registry_is_untouched() -> None:
    a, b = metrics.new(), metrics.new()
    a.set_prepared(claims=1, devices=1)
    assert b.registry.get_sample_value("dra_driver_prepared_claims") == 0
    assert prom.REGISTRY.get_sample_value("dra_driver_prepared_claims") is None


def test_request_with_a_logger_emits_one_event(m: metrics.DriverMetrics) -> None:
    base = structlog.get_logger().bind(claim_uid="u-1", claim_namespace="ns", claim_name="c")
    with structlog.testing.capture_logs() as events:
        with m.request("prepare", log=base) as req:
            req.devices = ["gpu-0", "gpu-1"]
        with pytest.raises(ValueError), m.request("unprepare", log=base):
            raise ValueError("checkpoint unreadable")
        with m.request("prepare", log=base) as req:
            req.fail("device node missing")
    ok, crashed, failed = events
    assert ok["event"] == "claim prepared" and ok["log_level"] == "info"
    assert ok["devices"] == ["gpu-0", "gpu-1"] and ok["result"] == "success"
    assert (ok["claim_uid"], ok["claim_namespace"], ok["claim_name"]) == ("u-1", "ns", "c")
    assert 0 <= ok["duration_ms"] < 1000
    assert crashed["event"] == "claim unprepare failed" and crashed["result"] == "error"
    assert crashed["error"] == "ValueError: checkpoint unreadable"
    assert failed["error"] == "device node missing" and failed["log_level"] == "warning"


def test_requests_reuse_the_cached_series_without_label_lookups(
    m: metrics.DriverMetrics, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_lookup(*args: object, **kwargs: object) -> None:
        raise AssertionError("labels() on the per-request path")

    for metric in (m.requests, m.duration, m.in_flight, m.slice_publishes):
        monkeypatch.setattr(metric, "labels", no_lookup)
    with m.request("prepare"):
        assert value(m, "dra_driver_requests_in_flight", operation="prepare") == 1
    with pytest.raises(RuntimeError), m.request("unprepare"):
        raise RuntimeError("boom")
    m.observe_request("unprepare", result="success", seconds=0.25)
    m.slice_publish(ok=False)
    assert value(m, "dra_driver_requests_total", operation="prepare", result="success") == 1
    assert value(m, "dra_driver_requests_total", operation="unprepare", result="error") == 1
    assert value(m, "dra_driver_requests_total", operation="unprepare", result="success") == 1
    assert value(m, "dra_driver_requests_in_flight", operation="prepare") == 0
    assert value(m, "dra_driver_request_duration_seconds_count", operation="unprepare") == 2
    assert value(m, "dra_driver_request_duration_seconds_sum", operation="unprepare") >= 0.25
    assert value(m, "dra_driver_resourceslice_publish_total", result="error") == 1
    assert value(m, "dra_driver_resourceslice_publish_total", result="success") == 0


def test_device_health_keeps_one_series_per_device(m: metrics.DriverMetrics) -> None:
    m.set_device_health("gpu-0", "")
    assert value(m, "dra_driver_device_health", device="gpu-0", reason="") == 1
    m.set_device_health("gpu-0", "xid=79")
    assert value(m, "dra_driver_device_health", device="gpu-0", reason="xid=79") == 0
    assert (
        m.registry.get_sample_value("dra_driver_device_health", {"device": "gpu-0", "reason": ""})
        is None
    )
    m.set_device_health("gpu-0", "")
    assert (
        m.registry.get_sample_value(
            "dra_driver_device_health", {"device": "gpu-0", "reason": "xid=79"}
        )
        is None
    )
    m.health_event("xid", "79", "unhealthy")
    m.health_event("xid", "13", "ignored")
    m.device_recovered("gpu-0")
    assert value(m, "dra_driver_health_events_total", kind="xid", xid="13", outcome="ignored") == 1
    assert value(m, "dra_driver_device_recoveries_total", device="gpu-0") == 1


def test_feature_enabled_gauge_per_feature_and_closed_label_set(m: metrics.DriverMetrics) -> None:
    for feature in metrics.FEATURES:
        m.set_feature(feature, True)
        assert value(m, "dra_driver_feature_enabled", feature=feature) == 1
    m.set_feature("deviceTaints", False)
    assert value(m, "dra_driver_feature_enabled", feature="deviceTaints") == 0
    with pytest.raises(metrics.MetricsError, match="feature 'gpuSets'"):
        m.set_feature("gpuSets", True)
