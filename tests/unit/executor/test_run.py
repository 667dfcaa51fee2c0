"""The run's progress lines, including what the provider reports while the driver waits."""

import io

from rubberband.executor.run import progress_printer


def test_provider_events_are_printed_as_they_happen():
    out = io.StringIO()
    show = progress_printer(out)
    show("provider", {"event": "launch_error", "instance_type": "g5.xlarge", "region": "us-east-1", "attempt": 1,
                      "code": "InsufficientInstanceCapacity", "retry_in_s": 2.0})
    show("provider", {"event": "launch_error", "instance_type": "g5.xlarge", "region": "us-east-1", "attempt": 6,
                      "code": "InsufficientInstanceCapacity", "retry_in_s": None})
    show("provider", {"event": "terminated", "reason": "interrupted", "instance": "rb-instance-2", "ec2_id": "i-abc"})
    lines = out.getvalue().splitlines()
    assert "g5.xlarge in us-east-1 failed (attempt 1): InsufficientInstanceCapacity; retrying in 2.0s" in lines[0]
    assert lines[1].endswith("giving up")
    assert "rb-instance-2 i-abc was interrupted (spot reclaim); a replacement is on its way" in lines[2]
