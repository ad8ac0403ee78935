"""The torch backend's event scan without max_event (pointer doubling over the windows that act) against
the frame-by-frame state machine it replaces, the scan's spec."""
import pytest
import torch

from streammem_kernels.boundaries.reference import scan_events_loop, scan_events_torch


def random_choices(g, streams: int, windows: int, window: int, idle: float) -> torch.Tensor:
    """Window choices of every kind: -1 (a share ``idle``), boundaries j and transients -2 - j, j < window."""
    kind = torch.rand(streams, windows, generator=g)
    j = torch.randint(0, window, (streams, windows), generator=g)
    return torch.where(kind < idle, -1, torch.where(kind < idle + (1 - idle) * 0.7, j, -2 - j))


@pytest.mark.parametrize("drift", [float("nan"), -0.2, 0.4])
def test_unbounded_scan_is_the_frame_loop(drift):
    g = torch.Generator().manual_seed(11)
    for trial in range(300):
        streams, frames = trial % 3 + 1, int(torch.randint(1, 70, (1,), generator=g))
        window = int(torch.randint(2, 10, (1,), generator=g))
        windows = max(frames - 1 - window + 1, 0)
        sims = torch.rand(streams, frames - 1, generator=g) * 2 - 1
        choices = random_choices(g, streams, windows, window, idle=(trial % 5) / 4)
        want = scan_events_loop(sims, choices, window, 0, drift)
        assert torch.equal(scan_events_torch(sims, choices, window, 0, drift), want), (trial, window)


def test_a_long_stream_of_acting_windows():
    """Every window acts (a chain as long as the stream): the doubling must reach its end."""
    g = torch.Generator().manual_seed(3)
    for window in (2, 8):
        frames = 3000
        choices = random_choices(g, 2, frames - window, window, idle=0.0)
        sims = torch.zeros(2, frames - 1)
        want = scan_events_loop(sims, choices, window, 0, float("nan"))
        assert torch.equal(scan_events_torch(sims, choices, window, 0, float("nan")), want)
