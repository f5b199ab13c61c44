import pytest

from bench.open_loop import TracedRequest
from bench.overload_trace import (
    TracedRun,
    goodput_share,
    onset,
    outcome,
    passes_between,
    print_summary,
    split,
    summarize,
)
from deployments.bin.haproxy_front_door import FRONT_REFUSAL

FRONT = FRONT_REFUSAL.encode()
INGRESS = b'{"error":{"message":"Model \'m\' expects to answer normal-class requests in 520 ms'


def req(
    due: float, lag: float, server: float, status: int = 200, body: bytes = b""
) -> TracedRequest:
    return TracedRequest(due, due + lag, due + lag + server, status, body)


def test_each_refusal_is_put_down_to_who_refused_it() -> None:
    assert outcome(req(0, 0, 0.1)) == "answered"
    assert outcome(req(0, 0, 0.001, 429, FRONT[:200])) == "front door"
    assert outcome(req(0, 0, 0.05, 429, INGRESS)) == "ingress"
    assert outcome(req(0, 0, 0.05, 503, INGRESS)) == "ingress"
    assert outcome(req(0, 0, 0.05, 500, b"boom")) == "other"
    assert outcome(req(0, 0, 90.0, 0)) == "no answer"


def test_split_separates_the_clients_lag_from_the_servers_part() -> None:
    trace = [req(i, 0.001, 0.2) for i in range(99)] + [req(99, 0.8, 0.2)]
    trace += [req(0, 0.001, 0.003, 429, FRONT) for _ in range(10)]
    groups = split(trace)
    answered = groups["answered"]
    assert answered["count"] == 100
    assert answered["server_ms"] == {"p50": 200.0, "p90": 200.0, "p99": 200.0}
    assert answered["lag_ms"]["p50"] == 1.0 and answered["lag_ms"]["p99"] == 1.0
    assert answered["total_ms"]["p99"] == 201.0  # the one late send is past the p99 rank
    assert groups["front door"]["count"] == 10
    assert groups["front door"]["server_ms"]["p99"] == 3.0
    assert groups["refused"]["count"] == 10  # whoever refused: the test's measure


def test_the_refusals_together_take_the_slow_ingress_ones_into_their_tail() -> None:
    trace = [req(0, 0, 0.002, 429, FRONT) for _ in range(95)]
    trace += [req(0, 0, 0.150, 429, INGRESS) for _ in range(5)]
    refused = split(trace)["refused"]
    assert refused["count"] == 100
    assert refused["server_ms"] == {"p50": 2.0, "p90": 2.0, "p99": 150.0}


def test_goodput_counts_answers_within_their_class_target_due_in_the_window() -> None:
    traces = {
        "normal": [req(t, 0, 0.3) for t in range(10)] + [req(t, 0, 0.7) for t in range(10)],
        "batch": [req(t, 0, 20.0) for t in range(5)],
        "realtime": [req(t, 0, 0.05, 503, INGRESS) for t in range(5)],
    }
    targets = {"normal": 0.5, "batch": 30.0, "realtime": 0.1}
    # 10 normal + 5 batch within target, over 10 s, against a capacity of 3 a second
    assert goodput_share(traces, targets, 3.0, 0, 10) == pytest.approx(15 / 10 / 3)
    # only what was due in [5, 10): 5 normal
    assert goodput_share(traces, targets, 3.0, 5, 10) == pytest.approx(5 / 5 / 3)
    assert goodput_share(traces, targets, 0.0, 0, 10) == 0.0


def test_onset_goes_second_by_second_and_the_summary_holds_it_all(
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace = [req(0.5, 0, 1.2), req(1.5, 0, 0.002, 429, FRONT), req(1.6, 0, 0.3)]
    rows = onset(trace, 0.0, 2)
    assert rows[0] == {"second": 0, "answered": {"count": 1, "server_p90_ms": 1200.0}}
    assert rows[1]["front door"] == {"count": 1, "server_p90_ms": 2.0}
    sampled = {"target_aim": {"normal": {"aim": 0.7}}, "late_ms": {"normal": 12.5}}
    admission = [{"second": 1.0, "predicted_wait": sampled, "front_door_shares": None}]
    by_role = {
        "calibration": {"replica embed-minilm": 1.2, "HAProxy": 0.1, "load generator": 0.4},
        "overload": {"replica embed-minilm": 0.5, "HAProxy": 0.6, "load generator": 0.9},
    }
    traces = {"normal": trace, "batch": [], "realtime": []}
    run = TracedRun(2.0, 0.0, traces, admission, by_role)
    summary = summarize(run, {"normal": 0.5, "batch": 30, "realtime": 0.1}, 2, 1)
    assert summary["goodput_share"] == pytest.approx(1 / 2 / 2)
    assert summary["goodput_share_after_settle"] == pytest.approx(1 / 1 / 2)
    assert summary["classes"]["normal"]["answered"]["count"] == 2  # type: ignore[index]
    assert len(summary["onset_normal"]) == 1  # type: ignore[arg-type]
    print_summary(summary)
    printed = capsys.readouterr().out
    assert "goodput 0.25x over the run, 0.5x after the first 1 s" in printed
    assert "0.4 cores while capacity was measured, 0.9 under the 2x load" in printed
    assert "normal    front door" in printed
    assert printed.index("HAProxy") < printed.index("replica embed-minilm")  # 2x's order
    assert "  1.200  0.500" in printed
    assert "     0                1  0.7    -/-/-                   12.5     None" in printed


def test_passes_between_counts_each_class_from_the_first_sample_to_the_last() -> None:
    def sample(normal: tuple[int, int, int], batch: tuple[int, int, int]) -> dict[str, object]:
        classes = {
            "normal": {"batches": normal[0], "items": normal[1], "riders_items": normal[2]},
            "batch": {"batches": batch[0], "items": batch[1], "carried_items": batch[2]},
        }
        return {"second": 1.0, "passes": classes}

    admission = [
        {"second": 0.5, "passes": None},
        sample((10, 100, 0), (0, 0, 0)),
        sample((30, 160, 30), (5, 40, 30)),
    ]
    # Normal's passes took 30 batch-class inputs along: 90 inputs in 20 passes.
    assert passes_between(admission) == {
        "normal": {"passes": 20, "inputs": 60, "riders": 30, "carried": 0, "mean_inputs": 4.5},
        "batch": {"passes": 5, "inputs": 40, "riders": 0, "carried": 30, "mean_inputs": 8.0},
    }
    assert passes_between(admission[:2]) == {}
