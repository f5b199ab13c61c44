"""The lane's thread calls the lane's forward; every other thread the main one."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from deployments.backends.runtimes.lane import LaneRoutedForward, lane_threads, routed_lane


def tagged(tag: float):
    def forward(features: dict[str, np.ndarray]) -> np.ndarray:
        return np.full(len(features["input_ids"]), tag)

    return forward


def test_calls_go_to_the_lane_only_on_the_lane_thread() -> None:
    routed = LaneRoutedForward(tagged(1.0), tagged(2.0), threads=1)
    features = {"input_ids": np.zeros((3, 4), dtype=np.int64)}
    with ThreadPoolExecutor(1, initializer=routed.enter_lane) as lane:
        assert lane.submit(routed, features).result().tolist() == [2.0] * 3
    with ThreadPoolExecutor(1) as other:
        assert other.submit(routed, features).result().tolist() == [1.0] * 3
    assert routed(features).tolist() == [1.0] * 3


def test_the_lane_takes_a_quarter_of_the_threads_and_at_least_one() -> None:
    assert [lane_threads(n) for n in (1, 2, 4, 8, 16)] == [1, 1, 1, 2, 4]


def test_a_plain_forward_has_no_lane() -> None:
    assert routed_lane(tagged(1.0)) is None
    routed = LaneRoutedForward(tagged(1.0), tagged(2.0), threads=1)
    assert routed_lane(routed) is routed
