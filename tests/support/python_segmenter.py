"""An independent pure-Python implementation of the depth-score segmentation rule (docs/ops/boundaries.md):
the ground truth of the boundaries tests and the pure-Python peer of bench/bench_boundaries.py."""
import math


def python_depths(s, peak="climb"):
    depths = []
    for i, gap in enumerate(s):
        if peak == "climb":
            lpeak = gap
            for k in range(i - 1, -1, -1):
                if s[k] >= lpeak:
                    lpeak = s[k]
                else:
                    break
            rpeak = gap
            for k in range(i + 1, len(s)):
                if s[k] >= rpeak:
                    rpeak = s[k]
                else:
                    break
        else:
            lpeak, rpeak = max(s[: i + 1]), max(s[i:])
        depths.append(0.5 * ((lpeak - gap) + (rpeak - gap)))
    return depths


def python_segment(sims, T, window=8, tau=0.7, min_depth=0.2, peak="climb", max_event=None, drift=None, flash=None):
    """Literal reading of the rule: keep the list of frames in the window."""
    flash = min(3, (window - 1) // 2) if flash is None else flash
    events, last_end, win = [], -1, []
    for t in range(T):
        win.append(t)
        if len(win) > window + 1:
            win.pop(0)
        if drift is None:
            if len(win) == window + 1:
                s = [sims[f] for f in win[:-1]]  # s_f lies between frames f and f+1
                d = python_depths(s, peak)
                mu = sum(d) / window
                sigma = math.sqrt(sum((x - mu) * (x - mu) for x in d) / window)
                if max(d) > min(d):
                    cands = [j for j, x in enumerate(d) if x > mu + tau * sigma and x > min_depth]
                    if cands:
                        j = max(cands, key=lambda j: (d[j], -j))
                        # The flash rule: wait for `flash` similarities after j; a drop within `flash`
                        # of j below s_j + d_j / 2 makes j an edge of a transient: no boundary, and
                        # the window restarts after the transient's last edge.
                        edges = [k for k in range(j - flash, j + flash + 1)
                                 if 0 <= k < window and k != j and s[k] < s[j] + 0.5 * d[j]]
                        if j > window - 1 - flash:
                            pass
                        elif edges:
                            win = [f for f in win if f > win[max(edges + [j])]]
                        else:
                            b = win[j]
                            events.append((last_end + 1, b))
                            last_end = b
                            win = [f for f in win if f > b]
        elif len(win) >= 2 and sims[t - 1] < drift:
            events.append((last_end + 1, t - 1))
            last_end = t - 1
            win = [t]
        if max_event is not None and t - last_end >= max_event:
            events.append((last_end + 1, t))
            last_end = t
            win = []
    if last_end < T - 1:
        events.append((last_end + 1, T - 1))
    return events
