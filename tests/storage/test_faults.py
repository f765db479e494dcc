from hicache.storage.faults import (CircuitBreaker, FaultCounter, StorageConnectionError, StorageServerError,
                                    StorageTimeout, fault_name)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_breaker_opens_after_threshold_consecutive_failures():
    clock = Clock()
    b = CircuitBreaker(threshold=3, cooldown_s=1.0, max_cooldown_s=4.0, clock=clock)
    assert b.allow() and b.state == "closed"
    b.record_failure()
    b.record_failure()
    b.record_success()  # resets the run of failures
    b.record_failure()
    b.record_failure()
    assert b.state == "closed" and b.trips == 0
    b.record_failure()
    assert b.state == "open" and b.trips == 1
    assert [b.allow() for _ in range(5)] == [False] * 5
    assert b.refused == 5


def test_breaker_half_open_lets_one_probe_and_backs_off():
    clock = Clock()
    b = CircuitBreaker(threshold=1, cooldown_s=1.0, max_cooldown_s=4.0, clock=clock)
    b.record_failure()
    assert b.state == "open"
    clock.t += 0.99
    assert not b.allow()
    clock.t += 0.02
    assert b.allow() is True          # the probe
    assert b.state == "half_open"
    assert b.allow() is False         # only one probe at a time
    b.record_failure()                # probe failed: open again, cooldown doubled to 2 s
    assert b.state == "open" and b.trips == 2
    clock.t += 1.5
    assert not b.allow()
    clock.t += 0.6
    assert b.allow() and b.probes == 2
    b.record_failure()                # cooldown 4 s (the max)
    clock.t += 4.01
    assert b.allow()
    b.record_failure()                # still 4 s: capped
    clock.t += 3.9
    assert not b.allow()
    clock.t += 0.2
    assert b.allow()
    b.record_success()
    assert b.state == "closed" and b.allow()
    # after closing, the cooldown is back to the base value
    b.record_failure()
    clock.t += 1.01
    assert b.allow()


def test_fault_names_and_counter():
    assert fault_name(StorageTimeout("x")) == "timeout"
    assert fault_name(StorageConnectionError("x")) == "connection"
    assert fault_name(StorageServerError("x")) == "server"
    c = FaultCounter()
    c.add("timeout")
    c.add("timeout", 2)
    c.add("connection", 0)
    assert c.snapshot() == {"timeout": 3}
    assert c.get("connection") == 0
